"""A gossip key changed on every member with one command (``smg-node keyring rotate NEW``). No I/O.

Serf's way, in three phases, each told to every alive member over the sealed stream transport (a member only
opens what is sealed under a key it holds, so only members can ask) and finished everywhere before the next
begins:

    install   every member learns NEW (it still seals under the old key: nothing changes on the wire)
    use       every member seals under NEW; the old key stays installed, so a member that has not switched yet
              and one that has still open each other's packets
    remove    the old key goes, everywhere

A member that does not answer a phase stops the rotation there, and the report names it: after a failed
install the cluster still seals under the old key (NEW is only installed, which changes nothing); after a failed
use the old key stays installed everywhere, so no member is cut off. Running the command again finishes it.
Members that are suspected or failed when it starts are not asked: the report names them, as they will need NEW
(``--encrypt``) to come back.

The request is a keyring mark and a small JSON object (``{"op": ..., "key": ...}``, bounded); the answer the
member's key fingerprints (never keys) or its error.
"""

from __future__ import annotations

import dataclasses

import orjson

KEYRING_STREAM_MARK = b"K"
PHASES = ("install", "use", "remove")
REQUEST_BYTES_MAX = 512  # an op and a base64 key: far under this


class KeyringRequestError(ValueError):
    """A keyring request that is not one (malformed, unknown op, too large): refused, counted."""


def encode_request(op: str, key: str) -> bytes:
    return KEYRING_STREAM_MARK + orjson.dumps({"op": op, "key": key})


def decode_request(data: bytes) -> "tuple[str, str]":
    """(op, key) of a request (its mark already seen); KeyringRequestError otherwise."""
    if len(data) > REQUEST_BYTES_MAX:
        raise KeyringRequestError("a keyring request larger than a key")
    try:
        value = orjson.loads(data[len(KEYRING_STREAM_MARK):])
    except orjson.JSONDecodeError:
        raise KeyringRequestError("a keyring request that is not JSON") from None
    if not isinstance(value, dict) or value.get("op") not in PHASES or not isinstance(value.get("key"), str):
        raise KeyringRequestError("a keyring request needs an op (install, use, remove) and a key")
    return value["op"], value["key"]


def encode_answer(fingerprints: "list[str] | None", error: str | None = None) -> bytes:
    return KEYRING_STREAM_MARK + orjson.dumps({"keys": fingerprints} if error is None else {"error": error})


def decode_answer(data: bytes) -> "tuple[list[str] | None, str | None]":
    """(fingerprints, None) when the member did it, (None, its error) when it refused."""
    if not data.startswith(KEYRING_STREAM_MARK):
        return None, "no keyring answer"
    try:
        value = orjson.loads(data[len(KEYRING_STREAM_MARK):])
    except orjson.JSONDecodeError:
        return None, "an answer that is not JSON"
    if isinstance(value, dict) and isinstance(value.get("keys"), list):
        return [str(f) for f in value["keys"]], None
    return None, str(value.get("error") if isinstance(value, dict) else "a malformed answer")


@dataclasses.dataclass
class RotationReport:
    """What a rotation did: the phases finished, each asked member's outcome in the last phase it reached
    ("ok", or why not), the members not asked (suspected or failed), and whether it completed."""

    new_fingerprint: str
    old_fingerprint: str
    phases_done: list[str] = dataclasses.field(default_factory=list)
    members: dict[str, str] = dataclasses.field(default_factory=dict)
    not_asked: list[str] = dataclasses.field(default_factory=list)

    @property
    def completed(self) -> bool:
        return self.phases_done == list(PHASES)

    def to_json(self) -> dict:
        return {"completed": self.completed, "new": self.new_fingerprint, "old": self.old_fingerprint,
                "phases_done": self.phases_done, "members": self.members, "not_asked": self.not_asked}

"""The gossip wire format: msgpack messages in versioned packets. Pure functions, no I/O.

A packet is ``[PROTOCOL_VERSION, [message, message, ...]]`` (a compound: one UDP
datagram carries a probe and the broadcasts piggybacked on it). A message is
``[MessageType, field, field, ...]``. Push-pull state (over TCP) is
``[PROTOCOL_VERSION, [MessageType.PUSH_PULL, join, [member, ...], user_state]]``.

``decode_packet`` never raises: garbage, a wrong version, a field of the wrong
type or a size over the limits drops the whole packet, and the reason is
returned so the caller can count it.

Version history (bump only when old nodes cannot read new packets):
  1  the first protocol.
"""

from __future__ import annotations

import dataclasses
import enum
from typing import Any

import msgpack

PROTOCOL_VERSION = 1
NAME_BYTES_MAX = 128
ADDR_BYTES_MAX = 256
TAGS_MAX = 32
TAG_BYTES_MAX = 512
MESSAGES_PER_PACKET_MAX = 256
STATE_MEMBERS_MAX = 10_000
USER_PAYLOAD_BYTES_MAX = 16 * 1024 * 1024
# Incarnations are memberlist's uint32. The bound is checked at decode so that no arithmetic on a
# received value can leave what we encode: a refutation computes max(ours, theirs) + 1, and with
# theirs = 2^64 - 1 that was 2^64, which msgpack cannot encode (the process died on one packet).
# ``Swim`` never raises its own incarnation past INCARNATION_MAX.
INCARNATION_MAX = 2 ** 32 - 1


class MessageType(enum.IntEnum):
    """Append-only: a value, once used, keeps its meaning forever."""

    PING = 0
    INDIRECT_PING = 1
    ACK = 2
    NACK = 3
    SUSPECT = 4
    ALIVE = 5
    DEAD = 6
    PUSH_PULL = 7
    USER = 8


@dataclasses.dataclass(frozen=True)
class Ping:
    seq: int
    target: str  # name the sender thinks it is probing (a restarted node with a new name must not ack)
    source: str  # the sender's name (so the receiver can ack to it)
    source_addr: str


@dataclasses.dataclass(frozen=True)
class IndirectPing:
    seq: int
    target: str
    target_addr: str
    requester: str
    requester_addr: str
    want_nack: bool


@dataclasses.dataclass(frozen=True)
class Ack:
    seq: int
    source: str


@dataclasses.dataclass(frozen=True)
class Nack:
    seq: int
    source: str


@dataclasses.dataclass(frozen=True)
class Suspect:
    incarnation: int
    node: str
    source: str


@dataclasses.dataclass(frozen=True)
class Alive:
    incarnation: int
    node: str
    addr: str
    tags: tuple[tuple[str, str], ...]  # sorted (key, value) pairs: hashable, stable encoding


@dataclasses.dataclass(frozen=True)
class Dead:
    incarnation: int
    node: str
    source: str  # == node: the node left on its own


@dataclasses.dataclass(frozen=True)
class User:
    """A broadcast of another subsystem (worker registry, KV index...), opaque here."""

    payload: bytes


@dataclasses.dataclass(frozen=True)
class MemberState:
    name: str
    addr: str
    incarnation: int
    state: int  # MemberStatus value
    tags: tuple[tuple[str, str], ...]


@dataclasses.dataclass(frozen=True)
class PushPull:
    join: bool
    members: tuple[MemberState, ...]
    user_state: bytes


Message = Ping | IndirectPing | Ack | Nack | Suspect | Alive | Dead | User


class DecodeError(Exception):
    """Internal to this module: a reason to drop the packet."""


def _name(value: Any) -> str:
    if not isinstance(value, str) or not value or len(value.encode()) > NAME_BYTES_MAX:
        raise DecodeError("bad_name")
    return value


def _addr(value: Any) -> str:
    if not isinstance(value, str) or len(value) > ADDR_BYTES_MAX:
        raise DecodeError("bad_addr")
    return value


def _uint(value: Any) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < 2 ** 64:
        raise DecodeError("bad_int")
    return value


def _incarnation(value: Any) -> int:
    value = _uint(value)
    if value > INCARNATION_MAX:
        raise DecodeError("bad_incarnation")
    return value


def _tags(value: Any) -> tuple[tuple[str, str], ...]:
    if not isinstance(value, dict) or len(value) > TAGS_MAX:
        raise DecodeError("bad_tags")
    for k, v in value.items():
        if not isinstance(k, str) or not isinstance(v, str) or len(k) + len(v) > TAG_BYTES_MAX:
            raise DecodeError("bad_tags")
    return tuple(sorted(value.items()))


def _fields(raw: list, count: int) -> list:
    if len(raw) != count + 1:
        raise DecodeError("bad_field_count")
    return raw[1:]


def encode_message(m: Message) -> bytes:
    if isinstance(m, Ping):
        body = [MessageType.PING, m.seq, m.target, m.source, m.source_addr]
    elif isinstance(m, IndirectPing):
        body = [MessageType.INDIRECT_PING, m.seq, m.target, m.target_addr, m.requester, m.requester_addr, m.want_nack]
    elif isinstance(m, Ack):
        body = [MessageType.ACK, m.seq, m.source]
    elif isinstance(m, Nack):
        body = [MessageType.NACK, m.seq, m.source]
    elif isinstance(m, Suspect):
        body = [MessageType.SUSPECT, m.incarnation, m.node, m.source]
    elif isinstance(m, Alive):
        body = [MessageType.ALIVE, m.incarnation, m.node, m.addr, dict(m.tags)]
    elif isinstance(m, Dead):
        body = [MessageType.DEAD, m.incarnation, m.node, m.source]
    elif isinstance(m, User):
        body = [MessageType.USER, m.payload]
    else:
        raise TypeError(f"not a gossip message: {m!r}")
    return msgpack.packb(body, use_bin_type=True)


def _decode_message(raw: Any) -> Message:
    if not isinstance(raw, list) or not raw or not isinstance(raw[0], int):
        raise DecodeError("bad_message")
    kind = raw[0]
    if kind == MessageType.PING:
        seq, target, source, addr = _fields(raw, 4)
        return Ping(_uint(seq), _name(target), _name(source), _addr(addr))
    if kind == MessageType.INDIRECT_PING:
        seq, target, target_addr, requester, requester_addr, nack = _fields(raw, 6)
        if not isinstance(nack, bool):
            raise DecodeError("bad_field")
        return IndirectPing(_uint(seq), _name(target), _addr(target_addr), _name(requester), _addr(requester_addr),
                            nack)
    if kind == MessageType.ACK:
        seq, source = _fields(raw, 2)
        return Ack(_uint(seq), _name(source))
    if kind == MessageType.NACK:
        seq, source = _fields(raw, 2)
        return Nack(_uint(seq), _name(source))
    if kind == MessageType.SUSPECT:
        inc, node, source = _fields(raw, 3)
        return Suspect(_incarnation(inc), _name(node), _name(source))
    if kind == MessageType.ALIVE:
        inc, node, addr, tags = _fields(raw, 4)
        return Alive(_incarnation(inc), _name(node), _addr(addr), _tags(tags))
    if kind == MessageType.DEAD:
        inc, node, source = _fields(raw, 3)
        return Dead(_incarnation(inc), _name(node), _name(source))
    if kind == MessageType.USER:
        (payload,) = _fields(raw, 1)
        if not isinstance(payload, bytes) or len(payload) > USER_PAYLOAD_BYTES_MAX:
            raise DecodeError("bad_user_payload")
        return User(payload)
    raise DecodeError("unknown_message_type")


def _array_header(n: int) -> bytes:
    if n < 16:
        return bytes([0x90 | n])
    return b"\xdc" + n.to_bytes(2, "big")


_VERSION_BYTES = msgpack.packb(PROTOCOL_VERSION)


def encode_packet(encoded_messages: "list[bytes]") -> bytes:
    """A packet from already-encoded messages (the broadcast queue keeps them encoded)."""
    return b"\x92" + _VERSION_BYTES + _array_header(len(encoded_messages)) + b"".join(encoded_messages)


# Bytes a packet adds around its messages (outer array, version, inner array header).
PACKET_OVERHEAD_BYTES = 1 + len(_VERSION_BYTES) + 3


def _unpack(data: bytes, max_bytes: int) -> Any:
    if len(data) > max_bytes:
        raise DecodeError("too_large")
    try:
        return msgpack.unpackb(data, raw=False, strict_map_key=True, max_bin_len=max_bytes,
                               max_str_len=max_bytes, max_array_len=STATE_MEMBERS_MAX + 16,
                               max_map_len=TAGS_MAX + 1)
    except Exception:  # msgpack raises many types on garbage; all mean the same here
        raise DecodeError("malformed") from None


def decode_packet(data: bytes, max_bytes: int) -> tuple[list[Message], str | None]:
    """(messages, None), or ([], reason) for a packet that must be dropped."""
    try:
        outer = _unpack(data, max_bytes)
        if not isinstance(outer, list) or len(outer) != 2:
            raise DecodeError("malformed")
        if outer[0] != PROTOCOL_VERSION:
            raise DecodeError("bad_version")
        raw_messages = outer[1]
        if not isinstance(raw_messages, list) or len(raw_messages) > MESSAGES_PER_PACKET_MAX:
            raise DecodeError("malformed")
        return [_decode_message(m) for m in raw_messages], None
    except DecodeError as e:
        return [], str(e)
    except (ValueError, TypeError):
        return [], "malformed"


def _member_state_out(m: MemberState) -> list:
    return [m.name, m.addr, m.incarnation, m.state, dict(m.tags)]


def encode_push_pull(pp: PushPull) -> bytes:
    return msgpack.packb([PROTOCOL_VERSION, [MessageType.PUSH_PULL, pp.join,
                                             [_member_state_out(m) for m in pp.members], pp.user_state]],
                         use_bin_type=True)


def decode_push_pull(data: bytes, max_bytes: int) -> tuple[PushPull | None, str | None]:
    try:
        outer = _unpack(data, max_bytes)
        if not isinstance(outer, list) or len(outer) != 2 or outer[0] != PROTOCOL_VERSION:
            raise DecodeError("bad_version" if isinstance(outer, list) and outer else "malformed")
        raw = outer[1]
        if not isinstance(raw, list) or len(raw) != 4 or raw[0] != MessageType.PUSH_PULL:
            raise DecodeError("malformed")
        join, members, user_state = raw[1], raw[2], raw[3]
        if not isinstance(join, bool) or not isinstance(members, list) or not isinstance(user_state, bytes):
            raise DecodeError("malformed")
        if len(members) > STATE_MEMBERS_MAX:
            raise DecodeError("too_many_members")
        out = []
        for m in members:
            if not isinstance(m, list) or len(m) != 5:
                raise DecodeError("malformed")
            state = _uint(m[3])
            if state > 3:
                raise DecodeError("bad_state")
            out.append(MemberState(_name(m[0]), _addr(m[1]), _incarnation(m[2]), state, _tags(m[4])))
        return PushPull(join, tuple(out), user_state), None
    except DecodeError as e:
        return None, str(e)
    except (ValueError, TypeError):
        return None, "malformed"

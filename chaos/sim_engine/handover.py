"""The KV hand-over of a prefill/decode pair, between two simulated engines over a real socket.

A disaggregated engine pair hands the prompt's KV cache from the prefill engine to the decode
engine; the gateway only tells both sides which hand-over is theirs. This module plays that part
with the same shape as the real engines, so a gateway that gets the pairing wrong fails here as it
would on real hardware:

* the prefill engine (``--role prefill``) runs a bootstrap server on ``--bootstrap-port``;
  after computing a prompt it **offers** the KV under the request's hand-over key (SGLang: the
  ``bootstrap_room``; vLLM: the transfer id it returned in ``kv_transfer_params``);
* the decode engine (``--role decode``) **fetches** that key from the prefill's bootstrap
  address (SGLang: ``bootstrap_host:bootstrap_port`` of the request; vLLM: ``remote_host`` and
  ``remote_port`` of the parameters the prefill returned) and produces tokens only after the KV
  arrived. The fetch names the prompt (its sha256): KV of another prompt is refused.

Either side waits at most ``timeout_s`` for the other (SGLang sends both at once, so either may
come first), then fails its request: a room that never arrives ends the decode's request, KV that
nobody takes is freed and counted. One JSON line each way, bounded in size.

asyncio, like the rest of the simulated engine (grpc.aio's server is asyncio).
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
import logging
import time
from collections.abc import Callable

log = logging.getLogger("chaos.sim_engine")

LINE_BYTES_MAX = 4096  # one hand-over request or answer; anything longer is refused


class HandoverFailed(Exception):
    """The KV did not arrive (or not this prompt's): the request cannot be decoded."""


def prompt_digest(prompt_ids: "list[int]") -> str:
    """What the decode names its prompt by: equal prompts, equal digests."""
    return hashlib.sha256(json.dumps(prompt_ids, separators=(",", ":")).encode()).hexdigest()


@dataclasses.dataclass
class _Offer:
    digest: str
    prompt_tokens: int
    payload: int  # what the fetch carries beyond the KV's size: an encoded item's embedding digest (EPD)
    offered: asyncio.Event  # set once the prefill computed the prompt
    taken: asyncio.Event  # set once a decode fetched it
    created_at: float


class HandoverBoard:
    """The prefill engine's side: KV offered under hand-over keys, waiting for their decode."""

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self._offers: dict[str, _Offer] = {}
        self.handed_over_total = 0
        self.expired_total = 0  # offers nobody fetched in time (KV freed)
        self.refused_total = 0  # fetches of an unknown key or of another prompt
        self._tasks: set[asyncio.Task] = set()  # expiries running (held: the loop keeps only weak references)

    def __len__(self) -> int:
        return len(self._offers)

    def _entry(self, key: str) -> _Offer:
        offer = self._offers.get(key)
        if offer is None:
            offer = self._offers[key] = _Offer("", 0, 0, asyncio.Event(), asyncio.Event(), time.monotonic())
        return offer

    def offer(self, key: str, prompt_ids: "list[int]", payload: int = 0) -> None:
        """The prompt of ``key`` is computed: its KV (or an encoded item: ``payload``) can be fetched."""
        offer = self._entry(key)
        if offer.offered.is_set():
            raise HandoverFailed(f"hand-over key {key} is already in use")
        offer.digest, offer.prompt_tokens, offer.payload = prompt_digest(prompt_ids), len(prompt_ids), payload
        offer.offered.set()

    async def wait_taken(self, key: str) -> None:
        """Until a decode took ``key``'s KV; HandoverFailed (and the KV freed) after ``timeout_s``."""
        offer = self._offers.get(key)
        if offer is None:
            raise HandoverFailed(f"no KV offered under {key}")
        try:
            await asyncio.wait_for(offer.taken.wait(), self.timeout_s)
        except asyncio.TimeoutError:
            self.expired_total += 1
            raise HandoverFailed(f"no decode fetched the KV of {key} within {self.timeout_s:g} s") from None
        finally:
            self._offers.pop(key, None)

    def expire_later(self, key: str, on_end: "Callable[[], object]" = lambda: None) -> None:
        """vLLM's way: the prefill answers at once and keeps the KV until it is fetched or ``timeout_s`` passed;
        then ``on_end()``."""
        self._tasks.add(asyncio.get_running_loop().create_task(self._expire(key, on_end)))

    async def _expire(self, key: str, on_end: "Callable[[], object]") -> None:
        try:
            await self.wait_taken(key)
        except HandoverFailed as e:
            log.warning("%s", e)
        finally:
            on_end()
            self._tasks.discard(asyncio.current_task())

    def withdraw(self, key: str) -> None:
        """The prefill's request was aborted: nothing to fetch any more."""
        offer = self._offers.pop(key, None)
        if offer is not None and not offer.taken.is_set():
            offer.taken.set()  # a waiting wait_taken ends (the request is gone anyway)

    async def take(self, key: str, digest: str) -> dict:
        """A decode's fetch: waits up to ``timeout_s`` for the key to be offered."""
        offer = self._entry(key)
        try:
            await asyncio.wait_for(offer.offered.wait(), self.timeout_s)
        except asyncio.TimeoutError:
            if not offer.offered.is_set():
                self._offers.pop(key, None)
            self.refused_total += 1
            return {"ok": False, "error": f"nothing was prefilled under {key} within {self.timeout_s:g} s"}
        if offer.digest != digest:
            self.refused_total += 1
            return {"ok": False, "error": f"the KV under {key} is of another prompt"}
        if offer.taken.is_set():
            self.refused_total += 1
            return {"ok": False, "error": f"the KV under {key} was already taken"}
        offer.taken.set()
        self.handed_over_total += 1
        return {"ok": True, "prompt_tokens": offer.prompt_tokens, "payload": offer.payload}

    async def serve_connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            line = await asyncio.wait_for(reader.readline(), self.timeout_s)
            if not line.endswith(b"\n") or len(line) > LINE_BYTES_MAX:
                answer = {"ok": False, "error": "one JSON line of at most 4096 bytes"}
            else:
                try:
                    asked = json.loads(line)
                    key, digest = str(asked["key"]), str(asked["prompt_sha256"])
                except (ValueError, KeyError, TypeError):
                    answer = {"ok": False, "error": "expected {\"key\": ..., \"prompt_sha256\": ...}"}
                else:
                    answer = await self.take(key, digest)
            writer.write(json.dumps(answer).encode() + b"\n")
            await writer.drain()
        except (asyncio.TimeoutError, ConnectionError, asyncio.LimitOverrunError, ValueError):
            pass
        finally:
            writer.close()


async def fetch(host: str, port: int, key: str, prompt_ids: "list[int]", timeout_s: float) -> int:
    """The decode's side: the prompt's KV from the prefill at ``host:port``; its prompt tokens.

    HandoverFailed when it is not there within ``timeout_s`` (or not this prompt's).
    """
    return int((await fetch_offer(host, port, key, prompt_ids, timeout_s)).get("prompt_tokens", 0))


async def fetch_offer(host: str, port: int, key: str, prompt_ids: "list[int]", timeout_s: float) -> dict:
    """What ``fetch`` asks, answered whole (its ``payload`` too)."""
    request = json.dumps({"key": key, "prompt_sha256": prompt_digest(prompt_ids)}).encode() + b"\n"
    try:
        async with asyncio.timeout(timeout_s + 1.0):  # the prefill answers within its own timeout
            reader, writer = await asyncio.open_connection(host, port, limit=LINE_BYTES_MAX)
            try:
                writer.write(request)
                await writer.drain()
                line = await reader.readline()
            finally:
                writer.close()
    except (OSError, asyncio.TimeoutError, asyncio.LimitOverrunError, ValueError) as e:
        raise HandoverFailed(f"cannot fetch the KV of {key} from {host}:{port}: {e or type(e).__name__}") from None
    try:
        answer = json.loads(line)
    except ValueError:
        raise HandoverFailed(f"the prefill at {host}:{port} answered no JSON for {key}") from None
    if not isinstance(answer, dict) or not answer.get("ok"):
        raise HandoverFailed(f"the engine at {host}:{port} refused {key}: "
                             f"{answer.get('error') if isinstance(answer, dict) else answer}")
    return answer


async def start_bootstrap_server(board: HandoverBoard, host: str, port: int) -> asyncio.AbstractServer:
    return await asyncio.start_server(board.serve_connection, host, port, limit=LINE_BYTES_MAX)

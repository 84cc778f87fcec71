"""An OpenAI chat completions stream relayed to an OpenAI chat completions client as it comes, without I/O.

When the client's API and the provider's wire are the same (OpenAI's chat completions, one answer, no log
probabilities, nothing stored from it), the gateway has no translation to make: reading every chunk into the typed
deltas and writing them again (the general path, openai.py's reader and the API's renderer) cost more than the rest
of relaying the stream. ``ChatRelay.feed`` passes the provider's events on as they are, with two changes made on the
bytes: the chunks' ``id`` and ``model`` become the answer's own (what a whole answer from the same route says), and
the provider's usage chunk (always asked for: what the request cost) is dropped when the client did not ask for it;
a server that names reasoning ``reasoning`` has those chunks written again with OpenAI clients' ``reasoning_content``.
Only the few events that carry the finish reason, the usage or an error are read (``_read``): the end of the stream
is known as the general path knows it (``finish``: a ``StreamEnd``).

The swaps need the provider's compact JSON (``"id":"..."``, as OpenAI, Azure and vLLM write it): a stream whose
first chunk is spelled otherwise has each of its events read and written again compactly (the general cost, the same
answer).
"""

from __future__ import annotations

from typing import Any

import orjson

from .base import SERVER, ProviderError, StreamEnd, Usage
from .sse import EVENT_BYTES_MAX, SseDecoder

# The markers of the events worth reading (none can occur inside a JSON string, whose quotes are escaped).
_FINISHED = b'"finish_reason":"'
_USAGE = b'"usage":{'
_ERROR = b'"error"'
_REASONING = b'"reasoning":'  # some servers' name for reasoning_content (vLLM's newer ones): renamed for the client


class ChatRelay:
    def __init__(self, response_id: str, model: str, include_usage: bool, finish_reasons: "dict[str, str]",
                 usage_of: Any, error_of: Any, event_bytes_max: int = EVENT_BYTES_MAX) -> None:
        self._decoder = SseDecoder(event_bytes_max)
        self._id, self._model = orjson.dumps(response_id), orjson.dumps(model)
        self._include_usage = include_usage
        self._finish_reasons = finish_reasons  # the wire's words for a finish -> the gateway's
        self._usage_of, self._error_of = usage_of, error_of
        self._swaps: "list[tuple[bytes, bytes]] | None" = None  # learned from the first chunk
        self._compact = True
        self.finish_reason: str | None = None
        self.usage = Usage()

    def feed(self, data: bytes) -> bytes:
        """The events ``data`` completes, as the client gets them (b"" when none)."""
        out: list[bytes] = []
        for name, raw in self._decoder._raw(data):
            if raw == b"[DONE]":
                continue  # the client's end is the gateway's to send
            if self._swaps is None:
                self._learn(raw)
            if not self._compact:
                raw = orjson.dumps(self._object(raw))
            if name or _FINISHED in raw or _USAGE in raw or _ERROR in raw:
                if not self._read(raw):
                    continue
            if _REASONING in raw:
                raw = _renamed_reasoning(self._object(raw))
            out.append(raw)
        if not out:
            return b""
        body = b"\n\ndata: ".join(out)
        for old, new in self._swaps or ():
            body = body.replace(old, new)
        return b"data: " + body + b"\n\n"

    def _learn(self, raw: bytes) -> None:
        """The provider's id and model as its first chunk spells them: what the swaps look for."""
        chunk = self._object(raw)
        swaps: list[tuple[bytes, bytes]] = []
        for key, new in ((b'"id":', self._id), (b'"model":', self._model)):
            value = chunk.get(key[1:-2].decode())
            if not isinstance(value, str):
                continue
            old = key + orjson.dumps(value)
            if old not in raw:
                self._compact = False  # spelled otherwise: every event is read and written again, compactly
            swaps.append((old, key + new))
        self._swaps = swaps

    @staticmethod
    def _object(raw: bytes) -> "dict[str, Any]":
        try:
            value = orjson.loads(raw)
        except orjson.JSONDecodeError:
            raise ProviderError(SERVER, 502, "the provider streamed an event that is not JSON") from None
        if type(value) is not dict:
            raise ProviderError(SERVER, 502, "the provider streamed an event that is not a chunk")
        return value

    def _read(self, raw: bytes) -> bool:
        """An event with a finish, usage or an error: what it says kept; False when the client does not get it (the
        usage chunk it did not ask for)."""
        chunk = self._object(raw)
        if isinstance(chunk.get("error"), dict):
            raise self._error_of(500, [], raw)
        if chunk.get("usage"):
            self.usage = self._usage_of(chunk["usage"])
        for choice in chunk.get("choices") or ():
            if isinstance(choice, dict) and not choice.get("index") and choice.get("finish_reason"):
                self.finish_reason = self._finish_reasons.get(choice["finish_reason"], "stop")
        return self._include_usage or bool(chunk.get("choices")) or not chunk.get("usage")

    def finish(self) -> StreamEnd:
        if self.finish_reason is None:
            raise ProviderError(SERVER, 502, "the provider's stream ended before its answer did")
        return StreamEnd(self.finish_reason, self.usage)


def _renamed_reasoning(chunk: "dict[str, Any]") -> bytes:
    """A chunk whose deltas say ``reasoning``, as OpenAI's clients read it: ``reasoning_content``."""
    for choice in chunk.get("choices") or ():
        delta = choice.get("delta") if isinstance(choice, dict) else None
        if isinstance(delta, dict) and "reasoning" in delta and "reasoning_content" not in delta:
            delta["reasoning_content"] = delta.pop("reasoning")
    return orjson.dumps(chunk)

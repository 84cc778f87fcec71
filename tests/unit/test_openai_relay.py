"""OpenAI chat streams relayed as they come (gateway/providers/openai_relay.py): the provider's events passed on with
the answer's id and model, the usage chunk only when the client asked, the finish and usage read, errors raised,
events cut anywhere between pieces, servers that write JSON with spaces or name reasoning otherwise."""

from __future__ import annotations

import json

import orjson
import pytest

from gateway.providers.base import ProviderError
from gateway.providers.openai import PROVIDERS


def _relay(include_usage: bool = False):
    return PROVIDERS["openai"].relay("chatcmpl-ours", "route-model", include_usage)


def _events(out: bytes) -> list:
    assert out.startswith(b"data: ") and out.endswith(b"\n\n")
    return [orjson.loads(e) for e in out[6:-2].split(b"\n\ndata: ")]


def _chunk(delta=None, finish=None, usage=None, compact=True, upstream_id="chatcmpl-up", model="gpt-x") -> bytes:
    value = {"id": upstream_id, "object": "chat.completion.chunk", "created": 1, "model": model,
             "system_fingerprint": "fp_1", "choices": [] if usage else [
                 {"index": 0, "delta": delta or {}, "logprobs": None, "finish_reason": finish}]}
    if usage:
        value["usage"] = usage
    text = orjson.dumps(value) if compact else json.dumps(value).encode()
    return b"data: " + text + b"\n\n"


USAGE = {"prompt_tokens": 9, "completion_tokens": 3, "total_tokens": 12,
         "prompt_tokens_details": {"cached_tokens": 4}}


@pytest.mark.parametrize("compact", [True, False])
@pytest.mark.parametrize("include_usage", [True, False])
def test_events_pass_with_the_answers_id_and_model(compact, include_usage):
    relay = _relay(include_usage)
    stream = b"".join([_chunk({"role": "assistant", "content": ""}, compact=compact),
                       _chunk({"content": "Hel"}, compact=compact), _chunk({"content": "lo \\\"id\\\""}, compact=compact),
                       _chunk({}, "stop", compact=compact), _chunk(usage=USAGE, compact=compact), b"data: [DONE]\n\n"])
    out = b"".join(relay.feed(stream[i:i + 37]) for i in range(0, len(stream), 37))  # cut anywhere
    events = _events(out)
    assert {e["id"] for e in events} == {"chatcmpl-ours"} and {e["model"] for e in events} == {"route-model"}
    assert events[0]["system_fingerprint"] == "fp_1"  # the provider's fields kept
    assert "".join(e["choices"][0]["delta"].get("content", "") for e in events if e["choices"]) == 'Hello \\"id\\"'
    assert (events[-1].get("usage") == USAGE) is include_usage and b"[DONE]" not in out
    end = relay.finish()
    assert end.finish_reason == "stop" and end.usage.prompt_tokens == 9 and end.usage.cached_tokens == 4


def test_an_error_mid_stream_and_a_stream_without_its_end_are_provider_errors():
    relay = _relay()
    assert relay.feed(_chunk({"content": "a"}))
    with pytest.raises(ProviderError):
        relay.feed(b'data: {"error":{"message":"overloaded","type":"server_error"}}\n\n')
    cut = _relay()
    cut.feed(_chunk({"content": "a"}))
    with pytest.raises(ProviderError):
        cut.finish()
    with pytest.raises(ProviderError):
        _relay().feed(b"data: not json\n\n")


def test_reasoning_named_otherwise_reaches_the_client_as_reasoning_content():
    relay = _relay()
    (event,) = _events(relay.feed(_chunk({"reasoning": "think"})))
    assert event["choices"][0]["delta"] == {"reasoning_content": "think"} and event["id"] == "chatcmpl-ours"

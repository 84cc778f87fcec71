"""OpenAI's chat chunks passed to a chat client as the provider wrote them (gateway/providers/openai.py's
``_ChatPassed`` over providers/passing.py): the chunks the client gets are the provider's, each checked first, byte
for byte when they came as whole ``data:`` events; the role chunk waits for the answer to begin; [DONE] is the
node's to write and the usage chunk goes only to a client that asked for it; the end is read as the translating
reader reads it; the chat answer's own id replaces the provider's and nothing else. Seeded random streams cut at
random places (seeds printed on failure)."""

from __future__ import annotations

import json
import random

import pytest

from gateway.api.openai import OpenAIShape
from gateway.providers import openai as openai_wire
from gateway.providers.base import Passed, ProviderError
from gateway.providers.passing import HELD_BYTES_MAX
from gateway.providers.sse import SseDecoder
from tests.unit.test_text_events import _chunks


class _Chat:
    def __init__(self, include_usage: bool) -> None:
        self.include_usage = include_usage


def _reader(include_usage: bool = False):
    return openai_wire.OpenAIChat("openai").passing_stream(_Chat(include_usage))


def _framed(chunks: "list[dict]", ensure_ascii: bool) -> "list[bytes]":
    return [b"data: " + json.dumps(c, separators=(",", ":"), ensure_ascii=ensure_ascii).encode() + b"\n\n"
            for c in chunks]


def _passed(body: bytes, cuts: "list[int]", include_usage: bool) -> "tuple[bytes, object]":
    reader = _reader(include_usage)
    out = b""
    for start, end in zip([0, *cuts], [*cuts, len(body)]):
        for delta in reader.feed(body[start:end]):
            out += delta.events
    return out, reader.finish()


def _end_of(end) -> tuple:
    return end.finish_reason, end.usage


@pytest.mark.parametrize("seed", range(40))
def test_a_chat_stream_is_passed_chunk_for_chunk_and_its_end_read_as_the_translating_reader_reads_it(seed):
    rng = random.Random(seed)
    include_usage = rng.random() < 0.5
    chunks = _chunks(rng)
    events = _framed(chunks, rng.random() < 0.5)
    body = b"".join(events) + b"data: [DONE]\n\n"
    # What the client gets: every chunk but the usage chunk when it did not ask, and no [DONE] (the node's own).
    expected = b"".join(event for event, chunk in zip(events, chunks) if include_usage or chunk["choices"])
    ends = [i + 2 for i in range(len(body)) if body[i:i + 2] == b"\n\n"]
    cuts = sorted(rng.sample(ends[:-1], rng.randint(0, len(ends) - 1)))
    passed, end = _passed(body, cuts, include_usage)
    assert passed == expected, f"seed {seed}, cuts {cuts}"
    translated = openai_wire.OpenAIChat("openai").stream()
    translated.feed(body)
    assert _end_of(end) == _end_of(translated.finish()), f"seed {seed}"
    # Cut anywhere, with carriage returns and a comment: the same chunks, written again as data lines.
    body = body.replace(b"\n", b"\r\n") if rng.random() < 0.5 else body
    body = b": keep-alive\n\n" + body
    cuts = sorted(rng.sample(range(1, len(body)), min(len(body) - 1, rng.randint(1, 60))))
    passed, end = _passed(body, cuts, include_usage)
    assert [json.loads(data) for _, data in SseDecoder().raw(passed)] == \
        [json.loads(data) for _, data in SseDecoder().raw(expected)], f"seed {seed}, cuts {cuts}"
    assert b"\r" not in passed and b"keep-alive" not in passed and _end_of(end) == _end_of(translated.finish())


ROLE = b'data: {"id":"c-1","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"role":"assistant",' \
       b'"content":""},"finish_reason":null}]}\n\n'
TEXT = b'data: {"id":"c-1","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"Hi"},' \
       b'"finish_reason":null}]}\n\n'


def test_the_role_chunk_waits_for_the_answer_and_an_error_before_it_passes_nothing():
    reader = _reader()
    assert reader.feed(ROLE) == []
    with pytest.raises(ProviderError) as failed:
        reader.feed(b'data: {"error": {"message": "overloaded", "type": "server_error"}}\n\n')
    assert "overloaded" in failed.value.message
    reader = _reader()
    reader.feed(ROLE)
    [delta] = reader.feed(TEXT)
    assert delta.events == ROLE + TEXT and delta.answer_id == b'"c-1"'


def test_what_waits_for_the_answer_is_bounded():
    """A provider that sends empty chunks without end has them passed on past the bound, not held."""
    reader = _reader()
    sent = b""
    for _ in range(HELD_BYTES_MAX // len(ROLE) + 2):
        sent += b"".join(delta.events for delta in reader.feed(ROLE))
    assert sent and len(sent) <= HELD_BYTES_MAX + 2 * len(ROLE) and reader._held_bytes <= HELD_BYTES_MAX + len(ROLE)


@pytest.mark.parametrize("event", [b"data: [1, 2]", b"data: {\"choices\": [", b"data: nothing"])
def test_an_event_that_is_not_a_chat_chunk_is_not_passed(event):
    for pieces in ([event + b"\n\n"], [event[:8], event[8:] + b"\n\n"]):
        reader = _reader()
        reader.feed(ROLE + TEXT)
        with pytest.raises(ProviderError):
            for piece in pieces:
                reader.feed(piece)


def test_the_answers_own_id_replaces_the_providers_and_nothing_else():
    shape = OpenAIShape(True, "chatcmpl-ours", "m")
    text = '"id":"c-1" and "id": "c-1"'  # the provider's id spelled inside a text: escaped, so left alone
    chunk = {"id": "c-1", "choices": [{"index": 0, "delta": {"content": text, "tool_calls": [{"id": "c-1x"}]}}]}
    compact = b"data: " + json.dumps(chunk, separators=(",", ":")).encode() + b"\n\n"
    spaced = b"data: " + json.dumps(chunk).encode() + b"\n\n"
    for events in (compact, spaced):
        out = json.loads(shape.passed(Passed(events, b'"c-1"'))[6:])
        assert out["id"] == "chatcmpl-ours" and out["choices"][0]["delta"]["content"] == text
        assert out["choices"][0]["delta"]["tool_calls"][0]["id"] == "c-1x"
    assert shape.passed(Passed(compact)) == compact  # no id learned: as it came


def test_an_event_of_several_data_lines_is_written_again_as_several():
    """The decoder joins an event's data lines with newlines: written again, each is a line of its own, so the
    client reads the same JSON (a newline inside a JSON value's whitespace)."""
    reader = _reader()
    reader.feed(ROLE + TEXT)
    [delta] = reader.feed(b'data: {"id":"c-1","choices":[{"index":0,"delta":{"content":"A"},\n'
                          b'data: "finish_reason":"stop"}]}\n\n')
    assert delta.events == b'data: {"id":"c-1","choices":[{"index":0,"delta":{"content":"A"},\n' \
                           b'data: "finish_reason":"stop"}]}\n\n'
    assert [json.loads(data)["choices"][0]["finish_reason"] for _, data in SseDecoder().raw(delta.events)] == ["stop"]
    assert reader.finish().finish_reason == "stop"

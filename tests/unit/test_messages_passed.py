"""Anthropic's stream passed to a Messages client as Anthropic wrote it (gateway/providers/anthropic.py's
``_MessagesPassed``): the events the client gets are the provider's, each checked first, byte for byte when they
came as the usual two lines, written again in that form when not; message_start waits for the answer to begin
(pings before it dropped), so an error right after it is still the route's; the end read as the translating
reader reads it. Seeded random streams cut at random places (seeds printed on failure)."""

from __future__ import annotations

import json
import random

import pytest

from gateway.providers import anthropic as anthropic_wire
from gateway.providers.base import ProviderError
from gateway.providers.sse import SseDecoder
from gateway.providers.text_events import ShapeMemory, TextShape
from tests.unit.test_text_events import _anthropic_events


def _body(events: "list[tuple[str, dict]]", rng: random.Random) -> bytes:
    ensure_ascii = rng.random() < 0.5
    return b"".join(b"event: " + name.encode() + b"\ndata: " +
                    json.dumps(value, separators=(",", ":"), ensure_ascii=ensure_ascii).encode() + b"\n\n"
                    for name, value in events)


def _passed(body: bytes, cuts: "list[int]", shapes: "ShapeMemory | None" = None) -> "tuple[bytes, object]":
    """The bytes a Messages client is sent for ``body`` read in the pieces ``cuts`` makes, and the stream's end; the
    reader starts with ``shapes``' text shape (none when not given)."""
    reader = anthropic_wire._MessagesPassed(shapes or ShapeMemory())
    out = b""
    for start, end in zip([0, *cuts], [*cuts, len(body)]):
        for delta in reader.feed(body[start:end]):
            out += delta.events
    return out, reader.finish()


def _events(body: bytes) -> "list[tuple[str, object]]":
    return [(name, json.loads(data)) for name, data in SseDecoder().raw(body)]


def _without_early_pings(events: "list[tuple[str, dict]]") -> "list[tuple[str, dict]]":
    """What the client gets: the stream less the pings before the first event after message_start."""
    began = False
    out = []
    for name, value in events:
        if name not in ("message_start", "ping"):
            began = True
        if began or name != "ping":
            out.append((name, value))
    return out


def _end_of(reader_end) -> tuple:
    return reader_end.finish_reason, reader_end.usage, reader_end.stop_sequence


@pytest.mark.parametrize("seed", range(40))
def test_a_stream_is_passed_event_for_event_and_its_end_read_as_the_translating_reader_reads_it(seed):
    rng = random.Random(seed)
    events = _anthropic_events(rng)
    if rng.random() < 0.5:
        events.insert(1, ("ping", {"type": "ping"}))
    body = _body(events, rng)
    expected = _without_early_pings(events)
    # Pieces of whole events (as a provider sends them): the client gets the provider's bytes as they are.
    ends = [i + 2 for i in range(len(body)) if body[i:i + 2] == b"\n\n"]
    cuts = sorted(rng.sample(ends[:-1], rng.randint(0, len(ends) - 1)))
    passed, end = _passed(body, cuts)
    assert passed == _body_of(expected, body), f"seed {seed}, cuts {cuts}"
    # The same when the reader starts with the shape an earlier stream learned (this one's; another block's).
    remembered = ShapeMemory()
    _passed(body, [], remembered)
    assert _passed(body, cuts, remembered)[0] == passed, f"seed {seed}, cuts {cuts}"
    other = ShapeMemory()
    other.shape = TextShape.learn(b'{"type":"content_block_delta","index":7,"delta":{"type":"text_delta","text":"a"}}',
                                  b"text", "a", anthropic_wire._TEXT_FRAME)
    assert _passed(body, cuts, other)[0] == passed, f"seed {seed}, cuts {cuts}"
    translated = anthropic_wire.AnthropicMessages().stream()
    translated.feed(body)
    assert _end_of(end) == _end_of(translated.finish()), f"seed {seed}"
    # Cut anywhere, with carriage returns and comments: the same events, written again as the usual two lines.
    if rng.random() < 0.5:
        body = body.replace(b"\n", b"\r\n")
    body = body.replace(b"event: message_delta", b": a comment\nevent: message_delta")
    cuts = sorted(rng.sample(range(1, len(body)), min(len(body) - 1, rng.randint(1, 60))))
    passed, end = _passed(body, cuts)
    assert _events(passed) == expected, f"seed {seed}, cuts {cuts}"
    assert b"\r" not in passed and b": a comment" not in passed, f"seed {seed}"
    assert _end_of(end) == _end_of(translated.finish()), f"seed {seed}"


def _body_of(expected: "list[tuple[str, dict]]", body: bytes) -> bytes:
    """``body``'s own bytes of the events in ``expected`` (its early pings left out)."""
    pieces = [piece + b"\n\n" for piece in body.split(b"\n\n")[:-1]]
    out, kept = b"", iter(expected)
    want = next(kept, None)
    for piece, (name, _) in zip(pieces, SseDecoder().raw(body)):
        if want is not None and name == want[0] and json.loads(piece.split(b"\ndata: ", 1)[1]) == want[1]:
            out += piece
            want = next(kept, None)
    return out


def _start() -> bytes:
    return (b'event: message_start\ndata: {"type":"message_start","message":{"id":"msg_1","type":"message",'
            b'"role":"assistant","model":"claude","content":[],"stop_reason":null,"stop_sequence":null,'
            b'"usage":{"input_tokens":9,"output_tokens":1}}}\n\n')


def test_message_start_waits_for_the_answer_and_an_error_before_it_passes_nothing():
    reader = anthropic_wire.AnthropicMessages().passing_stream(None)
    assert reader.feed(_start()) == []
    assert reader.feed(b'event: ping\ndata: {"type":"ping"}\n\n') == []
    with pytest.raises(ProviderError) as failed:
        reader.feed(b'event: error\ndata: {"type":"error","error":{"type":"overloaded_error","message":"Busy"}}\n\n')
    assert failed.value.status == 529 and failed.value.kind == "overloaded" and "Busy" in failed.value.message
    # Once the answer began, message_start goes with its first event (the pings before it do not).
    reader = anthropic_wire.AnthropicMessages().passing_stream(None)
    reader.feed(_start())
    reader.feed(b'event: ping\ndata: {"type":"ping"}\n\n')
    block = b'event: content_block_start\ndata: {"type":"content_block_start","index":0,"content_block":' \
            b'{"type":"redacted_thinking","data":"EnCrYpTeD"}}\n\n'
    [delta] = reader.feed(block)
    assert delta.events == _start() + block


@pytest.mark.parametrize("event, says", [
    (b'event: content_block_delta\ndata: {"type":"content_block_delta","index":0,"delta":{"type":"text_del', "JSON"),
    (b'event: content_block_delta\ndata: [1, 2]', "not a Messages event"),
    (b'event: content_block_delta\ndata: {"index": 0}', "not a Messages event"),
    (b'event: content_block_delta\ndata: {"type": 7}', "not a Messages event"),
    # a type that would write an event of its own when the event is written again under its name
    (b'event: x\ndata: {"type": "ping\\n\\ndata: {}"}', "not a Messages event"),
])
def test_an_event_that_is_not_a_messages_event_is_not_passed(event, says):
    """Checked before it goes, in a piece of whole events or cut, after the text's shape was learned or not."""
    text = b'event: content_block_delta\ndata: {"type":"content_block_delta","index":0,"delta":' \
           b'{"type":"text_delta","text":"Hi"}}\n\n'
    for learned in (False, True):
        for pieces in ([event + b"\n\n"], [event[:20], event[20:] + b"\n\n"]):
            reader = anthropic_wire.AnthropicMessages().passing_stream(None)
            reader.feed(_start() + (text if learned else b""))
            with pytest.raises(ProviderError, match=says):
                for piece in pieces:
                    reader.feed(piece)


def test_a_text_of_the_learned_shape_that_is_not_json_is_refused():
    text = b'event: content_block_delta\ndata: {"type":"content_block_delta","index":0,"delta":' \
           b'{"type":"text_delta","text":"Hi"}}\n\n'
    reader = anthropic_wire.AnthropicMessages().passing_stream(None)
    reader.feed(_start() + text)
    with pytest.raises(ProviderError, match="JSON"):
        reader.feed(text + text.replace(b'"Hi"', b'"a\\q"'))  # a bad escape in a run of the shape


def test_a_stream_that_ends_before_message_stop_fails_and_done_is_not_passed():
    reader = anthropic_wire.AnthropicMessages().passing_stream(None)
    text = b'event: content_block_delta\ndata: {"type":"content_block_delta","index":0,"delta":' \
           b'{"type":"text_delta","text":"Hi"}}\n\n'
    [delta] = reader.feed(_start() + text + b"event: done\ndata: [DONE]\n\n")
    assert delta.events == _start() + text
    with pytest.raises(ProviderError, match="ended before"):
        reader.finish()


def test_events_that_say_only_their_kind_are_known_by_their_bytes_the_second_time(monkeypatch):
    """A text block's start, a block's stop and the message's stop are parsed once; the same bytes later are known
    without parsing (a bounded memo), and the stream passes and ends as it did. Events the node reads (message_start,
    message_delta) and a tool_use block's start (its id) are parsed each time."""
    monkeypatch.setattr(anthropic_wire, "_KNOWN_EVENTS", {})
    parsed: list[bytes] = []
    json_object = anthropic_wire.json_object
    monkeypatch.setattr(anthropic_wire, "json_object", lambda data: parsed.append(data) or json_object(data))
    rng = random.Random(7)
    events = [e for e in _anthropic_events(rng) if e[0] != "content_block_delta"]
    body = _body(events, rng)
    first, end = _passed(body, [])
    kinds = [json.loads(p)["type"] for p in parsed]
    parsed.clear()
    again, end_again = _passed(body, [])
    assert (again, _end_of(end_again)) == (first, _end_of(end))
    starts = [value for name, value in events if name == "content_block_start"]
    assert [json.loads(p)["type"] for p in parsed] == [
        "message_start", *["content_block_start" for s in starts if s["content_block"]["type"] != "text"],
        "message_delta"], kinds
    # Bounded: once full, nothing more is kept (and every event is still parsed and checked).
    monkeypatch.setattr(anthropic_wire, "KNOWN_EVENTS_MAX", 0)
    monkeypatch.setattr(anthropic_wire, "_KNOWN_EVENTS", {})
    _passed(body, [])
    assert anthropic_wire._KNOWN_EVENTS == {}

"""A stream's text events read from their bytes (gateway/providers/text_events.py): what the shape reads equals what
parsing reads, and anything the shape cannot vouch for is left to parsing; an OpenAI chat stream read with the
shape gives the deltas it gives without it, over seeded random streams cut at random places."""

from __future__ import annotations

import functools
import json
import random

import pytest

from gateway.providers import anthropic as anthropic_wire
from gateway.providers import openai as openai_wire
from gateway.providers.base import ProviderError
from gateway.providers import text_events
from gateway.providers.text_events import ShapeMemory, TextEvents, TextShape
from gateway.serving.chat import Call, Content, Reasoning

HEAD = {"id": "chatcmpl-9", "object": "chat.completion.chunk", "created": 17, "model": "m", "system_fingerprint": "fp"}


def event(content, **choice) -> bytes:
    body = {**HEAD, "choices": [{"index": 0, "delta": {"content": content}, "logprobs": None,
                                 "finish_reason": None, **choice}]}
    return json.dumps(body, separators=(",", ":")).encode()


FIRST = event("Hello")
SHAPE = TextShape.learn(FIRST, b"content", "Hello")


@pytest.mark.parametrize("text", ["", " world", "é ü 字 🙂", 'a "quoted" word', "line\nbreak\ttab", "back\\slash",
                                  "\u2028", "x" * 5000])
def test_the_text_of_an_event_of_the_shape_is_what_parsing_reads(text):
    for ensure_ascii in (True, False):
        body = json.loads(FIRST)
        body["choices"][0]["delta"]["content"] = text
        payload = json.dumps(body, separators=(",", ":"), ensure_ascii=ensure_ascii).encode()
        assert SHAPE.text(payload) == text


@pytest.mark.parametrize("payload", [
    event("x", finish_reason="stop"),  # another shape: the finish
    event(None),  # not a string
    event(7),
    FIRST.replace(b'"Hello"', b'"a","extra":"b"'),  # a string, then another member: not one token
    FIRST.replace(b'"Hello"', b'"a\nb"'),  # a raw newline: not JSON
    FIRST.replace(b'"Hello"', b'"a\x01b"'),  # a raw control character: not JSON
    FIRST.replace(b'"Hello"', b'"\xff\xfe"'),  # not UTF-8
    FIRST.replace(b'"Hello"', b'"broken'),
    FIRST.replace(b'"Hello"', b' "spaced"'),
    FIRST[:40],
    b"",
])
def test_what_the_shape_cannot_vouch_for_is_left_to_parsing(payload):
    assert SHAPE.text(payload) is None


def test_a_shape_is_learnt_only_where_the_bytes_say_which_member_is_the_text():
    assert TextShape.learn(FIRST, b"content", "Hello") is not None
    assert TextShape.learn(FIRST, b"content", "Other") is None  # the bytes disagree with the parse
    twice = json.dumps({**HEAD, "choices": [{"index": 0, "delta": {"content": "Hi"},
                                             "logprobs": {"content": [{"token": "Hi"}]}}]}).encode()
    assert TextShape.learn(twice, b"content", "Hi") is None  # which "content" is the text: not told by the bytes
    spaced = json.dumps(json.loads(FIRST)).encode()  # json.dumps' default ", " and ": "
    shape = TextShape.learn(spaced, b"content", "Hello")
    assert shape is not None and shape.text(spaced.replace(b'"Hello"', b'"Bye"')) == "Bye"


def _chunks(rng: random.Random) -> "list[dict]":
    """An OpenAI chat stream: the role, texts (some with escapes), now and then reasoning, a field that differs per
    chunk (OpenAI's obfuscation), a tool call in pieces; the finish and usage."""
    texts = [" ".join(rng.choice(["word", "é", "a\"b", "new\nline", "tab\t", "🙂", "", "x\\y", "z", "end\\"])
                      for _ in range(rng.randint(1, 3))) for _ in range(rng.randint(1, 40))]
    chunks = [{**HEAD, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""},
                                    "finish_reason": None}]}]
    for k, text in enumerate(texts):
        delta: dict = {"content": text}
        chunk = {**HEAD, "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": None}]}
        roll = rng.random()
        if roll < 0.05:
            delta["reasoning_content"] = "thinking " + text
        elif roll < 0.1:
            chunk["obfuscation"] = "o" * rng.randint(1, 12)
        elif roll < 0.12:
            chunk["usage"] = None
        chunks.append(chunk)
    if rng.random() < 0.3:
        call = {"index": 0, "id": "call_1", "type": "function", "function": {"name": "f", "arguments": ""}}
        chunks.append({**HEAD, "choices": [{"index": 0, "delta": {"tool_calls": [call]}, "finish_reason": None}]})
        for piece in ['{"a"', ': 1}']:
            chunks.append({**HEAD, "choices": [{"index": 0, "delta": {"tool_calls": [
                {"index": 0, "function": {"arguments": piece}}]}, "finish_reason": None}]})
    chunks.append({**HEAD, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
    chunks.append({**HEAD, "choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": len(texts),
                                                     "total_tokens": 3 + len(texts)}})
    return chunks


def _read(body: bytes, cuts: "list[int]", shaped: bool, monkeypatch, wire=openai_wire, reader: str = "_ChatStream",
          shapes: "ShapeMemory | None" = None) -> "tuple[list, str, str, bool]":
    """A stream read by ``wire``'s reader in the pieces ``cuts`` makes, its shape learned or (``shaped`` False)
    never: its deltas (consecutive texts joined: the cuts decide how they group), finish, usage, and whether a shape
    was learned from it. An Anthropic reader starts with ``shapes``' shape (none when not given)."""
    with monkeypatch.context() as patch:
        if not shaped:
            patch.setattr(text_events.TextShape, "learn", classmethod(lambda cls, *a: None))
        stream = getattr(wire, reader)(*([shapes or ShapeMemory()] if wire is anthropic_wire else []))
        deltas = []
        for start, end in zip([0, *cuts], [*cuts, len(body)]):
            deltas += stream.feed(body[start:end])
        end = stream.finish()
        learned = stream._events.learned
    merged: list = []
    for d in [*deltas, *end.deltas]:
        if merged and type(d) in (Content, Reasoning) and type(merged[-1]) is type(d):
            merged[-1] = type(d)(merged[-1].text + d.text)
        else:
            merged.append(d)
    return merged, end.finish_reason, repr(end.usage), learned


@pytest.mark.parametrize("seed", range(40))
def test_a_stream_read_with_its_shape_gives_what_it_gives_without(seed, monkeypatch):
    rng = random.Random(seed)
    ensure_ascii = rng.random() < 0.5
    chunks = _chunks(rng)
    body = b"".join(b"data: " + json.dumps(c, separators=(",", ":"), ensure_ascii=ensure_ascii).encode() + b"\n\n"
                    for c in chunks) + b"data: [DONE]\n\n"
    deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
    learnable = any(list(delta) == ["content"] and delta["content"] for delta in deltas)
    whole = _read(body, [], True, monkeypatch)
    assert whole[:3] == _read(body, [], False, monkeypatch)[:3], f"seed {seed}"
    cuts = sorted(rng.sample(range(1, len(body)), min(len(body) - 1, rng.randint(1, 60))))
    assert _read(body, cuts, True, monkeypatch)[:3] == whole[:3], f"seed {seed}, cuts {cuts}"
    assert whole[3] == learnable, f"seed {seed}: a shape learned where it could be, only there"
    assert any(type(d) is Content for d in whole[0]), f"seed {seed}"
    if b"tool_calls" in body:
        assert any(type(d) is Call for d in whole[0]), f"seed {seed}"


def test_a_broken_event_of_the_shape_is_still_refused_as_parsing_refuses_it():
    reader = openai_wire._ChatStream()
    reader.feed(b"data: " + FIRST + b"\n\n")
    with pytest.raises(ProviderError, match="not JSON"):
        reader.feed(b"data: " + FIRST.replace(b'"Hello"', b'"a\nb"') + b"\n\n")


def _anthropic_events(rng: random.Random) -> "list[tuple[str, dict]]":
    """An Anthropic Messages stream: message_start, now and then a thinking block, text blocks (some texts with
    escapes), pings, a tool_use block in pieces, message_delta and message_stop."""
    events = [("message_start", {"type": "message_start", "message": {
        "id": "msg_1", "type": "message", "role": "assistant", "model": "claude", "content": [], "stop_reason": None,
        "stop_sequence": None, "usage": {"input_tokens": 9, "output_tokens": 1}}})]
    index = 0
    for _ in range(rng.randint(1, 3)):
        kind = rng.choice(["text", "text", "thinking", "tool_use"])
        block = {"type": kind, **({"text": ""} if kind == "text" else {"thinking": ""} if kind == "thinking" else
                                  {"id": f"toolu_{index}", "name": "f", "input": {}})}
        events.append(("content_block_start", {"type": "content_block_start", "index": index, "content_block": block}))
        for _ in range(rng.randint(1, 30)):
            piece = " ".join(rng.choice(["word", "é", "a\"b", "new\nline", "🙂", "", "x\\y", "end\\"])
                             for _ in range(rng.randint(1, 3)))
            delta = {"text": {"type": "text_delta", "text": piece},
                     "thinking": {"type": "thinking_delta", "thinking": piece},
                     "tool_use": {"type": "input_json_delta", "partial_json": '{"a": 1}' if piece else ""}}[kind]
            events.append(("content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta}))
            if rng.random() < 0.05:
                events.append(("ping", {"type": "ping"}))
        events.append(("content_block_stop", {"type": "content_block_stop", "index": index}))
        index += 1
    events.append(("message_delta", {"type": "message_delta", "delta": {"stop_reason": "end_turn",
                                                                        "stop_sequence": None},
                                     "usage": {"output_tokens": 40}}))
    events.append(("message_stop", {"type": "message_stop"}))
    return events


@pytest.mark.parametrize("seed", range(40))
def test_an_anthropic_stream_read_with_its_shape_gives_what_it_gives_without(seed, monkeypatch):
    rng = random.Random(seed)
    ensure_ascii = rng.random() < 0.5
    events = _anthropic_events(rng)
    body = b"".join(b"event: " + name.encode() + b"\ndata: " +
                    json.dumps(value, separators=(",", ":"), ensure_ascii=ensure_ascii).encode() + b"\n\n"
                    for name, value in events)
    read = functools.partial(_read, monkeypatch=monkeypatch, wire=anthropic_wire, reader="_MessagesStream")
    whole = read(body, [], True)
    assert whole[:3] == read(body, [], False)[:3], f"seed {seed}"
    cuts = sorted(rng.sample(range(1, len(body)), min(len(body) - 1, rng.randint(1, 60))))
    assert read(body, cuts, True)[:3] == whole[:3], f"seed {seed}, cuts {cuts}"
    learnable = any(value.get("delta", {}).get("type") == "text_delta" and value["delta"]["text"]
                    for _, value in events)
    assert whole[3] == learnable, f"seed {seed}: a shape learned where it could be, only there"
    # A stream that starts with the shape another learned (the same one, or one of another block's index that
    # fits none of its events) reads what it reads alone.
    remembered = ShapeMemory()
    read(body, [], True, shapes=remembered)
    assert read(body, cuts, True, shapes=remembered)[:3] == whole[:3], f"seed {seed}, cuts {cuts}"
    other = ShapeMemory()
    other.shape = TextShape.learn(b'{"type":"content_block_delta","index":7,"delta":{"type":"text_delta","text":"a"}}',
                                  b"text", "a", anthropic_wire._TEXT_FRAME)
    assert read(body, cuts, True, shapes=other)[:3] == whole[:3], f"seed {seed}, cuts {cuts}"


def test_an_anthropic_stream_starts_with_the_shape_the_last_one_learned(monkeypatch):
    """Anthropic's text deltas name no id: a stream's first text events are read by the shape an earlier stream
    learned (not parsed); a stream whose texts it does not fit learns its own, which the next ones start with."""
    frame = anthropic_wire._TEXT_FRAME
    payload = b'{"type":"content_block_delta","index":%d,"delta":{"type":"text_delta","text":"%s"}}'
    start = (b'event: message_start\ndata: {"type":"message_start","message":{"usage":{"input_tokens":3}}}\n\n'
             b'event: content_block_start\ndata: {"type":"content_block_start","index":0,'
             b'"content_block":{"type":"text","text":""}}\n\n')
    end = (b'event: message_delta\ndata: {"type":"message_delta","delta":{"stop_reason":"end_turn"},'
           b'"usage":{"output_tokens":2}}\n\nevent: message_stop\ndata: {"type":"message_stop"}\n\n')
    parsed: list[bytes] = []
    json_object = anthropic_wire.json_object
    monkeypatch.setattr(anthropic_wire, "json_object", lambda data: parsed.append(data) or json_object(data))
    memory = ShapeMemory()

    def stream(index: int) -> "list":
        parsed.clear()
        reader = anthropic_wire._MessagesStream(memory)
        texts = b"".join(frame + payload % (index, w) + b"\n\n" for w in (b"one ", b"two"))
        return reader.feed(start + texts + end)

    assert stream(0) == [Content("one two")] and len(parsed) == 5  # the first text parsed, its shape learned
    assert stream(0) == [Content("one two")] and len(parsed) == 4  # no text parsed: the shape remembered
    assert stream(1) == [Content("one two")] and len(parsed) == 5  # another index: its own learned
    assert memory.shape.text(payload % (1, b"x")) == "x"


def _framed(*strings: bytes, frame: bytes = b"data: ") -> bytes:
    """Events of SHAPE whose strings are ``strings`` as spelled (escapes and all), framed as in a body."""
    return b"".join(frame + FIRST.replace(b'"Hello"', b'"' + s + b'"') + b"\n\n" for s in strings)


def test_a_run_of_events_of_the_shape_is_read_at_once_up_to_the_first_other_event():
    finish = b"data: " + event("x", finish_reason="stop") + b"\n\n"
    body = _framed(b"a", b"", b"b \\u00e9\\n", "字".encode()) + finish + _framed(b"c")
    assert SHAPE.run(body, 0) == (body.index(finish), "ab \u00e9\n字")
    at = body.index(finish) + len(finish)
    assert SHAPE.run(body, at) == (len(body), "c")
    assert SHAPE.run(body, body.index(finish)) == (body.index(finish), None)  # not one of the shape: read alone


@pytest.mark.parametrize("strings, readable", [
    ((b"a", b'say \\"hi\\"', b"b"), 1),  # an escaped quote: the run ends before that event (read alone)
    ((b"a", b"back\\\\", b"b"), 0),  # a string ending with an escaped backslash: read one at a time
    ((b"a\\", b",", b"b"), 0),  # a backslash escaping the closing quote: not JSON, whatever an array would read
    ((b"a\xe2\x82", b"\xac"), 0),  # a character cut between two events: not UTF-8 in either
    ((b"a", b"b\x01"), 0),  # a raw control character
    ((b"a", b"\\x"), 0),  # not an escape
])
def test_a_run_the_bytes_cannot_vouch_for_is_left_to_the_events_one_at_a_time(strings, readable):
    body = _framed(*strings)
    end, text = SHAPE.run(body, 0)
    if readable:
        assert text == "a" and end == len(_framed(*strings[:readable]))
    else:
        assert text is None and end in (len(body), len(_framed(*strings[:1])))
    # What the reader makes of the same body is what parsing each event makes of it.
    events = TextEvents(b"content")
    events.shape = SHAPE
    read = "".join(item for item in events.items(body) if type(item) is str)
    parsed = []
    for s in strings:
        try:
            parsed.append(json.loads(b'"' + s + b'"'))
        except ValueError:
            parsed = None
            break
    if parsed is not None:
        assert read == "".join(parsed)
    else:  # the reader hands the events it cannot read to parsing, which refuses them
        leftover = [item for item in TextEvents(b"content").items(body)]
        assert all(type(item) is bytes for item in leftover)
        with pytest.raises(ProviderError, match="not JSON"):
            reader = openai_wire._ChatStream()
            reader._events.shape = SHAPE
            reader.feed(body)


def test_anthropic_text_deltas_are_read_in_runs_under_their_event_line():
    payload = b'{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"%s"}}'
    frame = b"event: content_block_delta\ndata: "
    shape = TextShape.learn(payload % b"Hi", b"text", "Hi", frame)
    body = b"".join(frame + payload % w + b"\n\n" for w in (b"one ", b"two ", b"three"))
    assert shape.run(body, 0) == (len(body), "one two three")
    assert shape.run(body.replace(b"event: content_block_delta", b"event: other", 1), 0)[1] is None
    reader = anthropic_wire._MessagesStream()
    start = (b'event: message_start\ndata: {"type":"message_start","message":{"usage":{"input_tokens":3}}}\n\n'
             b'event: content_block_start\ndata: {"type":"content_block_start","index":0,'
             b'"content_block":{"type":"text","text":""}}\n\n')
    assert reader.feed(start + frame + payload % b"Hi" + b"\n\n" + body) == [Content("Hione two three")]
    assert reader._events.shape is not None


def test_a_shape_is_not_learnt_from_data_of_several_lines():
    assert TextShape.learn(FIRST.replace(b',"model"', b',\n"model"'), b"content", "Hello") is None


@pytest.mark.parametrize("reader", ["_ChatStream", "passing"])
def test_a_stream_whose_text_events_give_no_shape_stops_being_asked_for_one(reader, monkeypatch):
    """OpenAI's chunks with logprobs name "content" twice: no shape can say which is the text. Trying costs more
    than the parse, so a stream is asked at most LEARN_TRIES times."""
    tries = []
    learn = TextShape.learn.__func__
    monkeypatch.setattr(TextShape, "learn", classmethod(lambda cls, *a: tries.append(1) or learn(cls, *a)))
    chunks = [{**HEAD, "choices": [{"index": 0, "delta": {"content": f"w{k} "}, "finish_reason": None,
                                    "logprobs": {"content": [{"token": f"w{k} ", "logprob": -0.5, "bytes": [],
                                                              "top_logprobs": []}]}}]} for k in range(20)]
    chunks.append({**HEAD, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
    body = b"".join(b"data: " + json.dumps(c, separators=(",", ":")).encode() + b"\n\n" for c in chunks)
    wire = openai_wire.OpenAIChat("openai")
    stream = wire.stream() if reader == "_ChatStream" else wire.passing_stream(type("Chat", (), {
        "include_usage": False})())
    for k in range(0, len(body), 97):
        stream.feed(body[k:k + 97])
    assert stream.finish().finish_reason == "stop"
    assert len(tries) == text_events.LEARN_TRIES and stream._events.shape is None

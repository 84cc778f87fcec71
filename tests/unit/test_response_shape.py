"""The Responses API's streamed events (gateway/api/responses/shape.py ``ResponseShape``, events.py): an event made
from a template (text deltas, a message's opening and closing) is the very event ``event()`` makes; every event is
numbered and logged by the one ``emit``, in the stream's grammar, and one out of it is refused; ids are fresh and
unguessable (gateway/base/ids.py)."""

from __future__ import annotations

import os

import orjson

from gateway.serving.chat import Content, Reasoning
from gateway.api.responses.stream_log import StreamLog
import pytest

from gateway.api.responses import ResponseShape
from gateway.api.responses.events import FOLLOWS, HEADS, KINDS, START, EventOrderError, EventStream
from gateway.base.ids import ID_BYTES, new_id


def shape(log: "StreamLog | None" = None) -> ResponseShape:
    return ResponseShape("resp_1", "sim-model", {}, {}, None, True, log=log)


def made(kind: str, sequence: int, fields: dict) -> bytes:
    """The bytes ``event(kind, **fields)`` makes at ``sequence``: its head, the number, the fields encoded."""
    return HEADS[kind] + b"%d" % sequence + b"," + orjson.dumps(fields)[1:] + b"\n\n"


def frames(out: bytes) -> list[bytes]:
    return [part + b"\n\n" for part in out.split(b"\n\n") if part]


def data(frame: bytes) -> dict:
    return orjson.loads(frame.split(b"\ndata: ", 1)[1])


def test_a_templated_text_delta_is_the_event_event_makes():
    s = shape(StreamLog(stored_bytes_max=1 << 20))
    out = s.text_event("", True)
    texts = ["Hello", ' "quoted" \\ ', "ünïcödé 🦊", "\n\t\u2028"]
    for text in texts:
        out += s.text_event(text, False)
    out += s.delta_events([Reasoning("thinking "), Content("again")], False)  # a second message, output_index 2
    out += s.close()
    done = {(data(f)["type"], data(f)["output_index"]): data(f) for f in frames(out) if data(f)["type"].endswith(".done")}
    assert done[("response.output_text.done", 0)]["text"] == "".join(texts)  # the pieces, joined once it closed
    assert done[("response.reasoning_text.done", 1)]["text"] == "thinking "
    assert done[("response.output_item.done", 2)]["item"]["content"][0]["text"] == "again"
    deltas = [f for f in frames(out) if data(f)["type"] == "response.output_text.delta"]
    assert [data(f)["delta"] for f in deltas] == [*texts, "again"]
    assert [data(f)["output_index"] for f in deltas] == [0, 0, 0, 0, 2]
    for frame in frames(out):  # the templated ones (deltas, a message's opening and closing) too
        fields = data(frame)
        sequence, kind = fields.pop("sequence_number"), fields.pop("type")
        assert frame == made(kind, sequence, fields)  # byte for byte
    numbers = [data(f)["sequence_number"] for f in frames(out)]
    assert numbers == list(range(len(numbers)))
    assert [sequence for sequence, _ in s.log.stored_events()] == numbers  # the background log has every one


def test_a_messages_templated_events_carry_what_the_api_names_in_its_order():
    s = shape()
    texts = ['50 % "off"', " %s %d %%", "\u00e9\U0001f98a"]
    out = s.text_event(texts[0], True) + b"".join(s.text_event(text, False) for text in texts[1:]) + s.close()
    events = [data(f) for f in frames(out)]
    assert [e["type"] for e in events] == [
        "response.created", "response.in_progress", "response.output_item.added", "response.content_part.added",
        *["response.output_text.delta"] * 3, "response.output_text.done", "response.content_part.done",
        "response.output_item.done"]
    item_id = s.output[0]["id"]
    assert events[2] == {"type": "response.output_item.added", "sequence_number": 2, "output_index": 0,
                         "item": {"type": "message", "id": item_id, "status": "in_progress", "role": "assistant",
                                  "content": []}}
    assert list(events[2]["item"]) == ["type", "id", "status", "role", "content"]
    assert events[3] == {"type": "response.content_part.added", "sequence_number": 3, "item_id": item_id,
                         "output_index": 0, "content_index": 0,
                         "part": {"type": "output_text", "text": "", "annotations": []}}
    part = {"type": "output_text", "text": "".join(texts), "annotations": [], "logprobs": []}
    assert events[7] == {"type": "response.output_text.done", "sequence_number": 7, "item_id": item_id,
                         "output_index": 0, "content_index": 0, "text": "".join(texts), "logprobs": []}
    assert events[8] == {"type": "response.content_part.done", "sequence_number": 8, "item_id": item_id,
                         "output_index": 0, "content_index": 0, "part": part}
    done = {"type": "message", "id": item_id, "status": "completed", "role": "assistant", "content": [part]}
    assert events[9] == {"type": "response.output_item.done", "sequence_number": 9, "output_index": 0, "item": done}
    assert s.output == [done]  # the item the final response carries is the one the stream closed
    assert orjson.dumps(s.output[0]) == orjson.dumps(events[9]["item"])  # in the same field order


def test_a_closed_messages_events_carry_its_logprobs():
    s = shape()
    s.text_event("a", True)
    s.text_event("b", False)
    s._text_logprobs = [{"token": "a", "logprob": -0.5, "bytes": [97], "top_logprobs": []}]
    events = [data(f) for f in frames(s.close())]
    assert events[0]["logprobs"] == s._text_logprobs
    assert events[1]["part"]["logprobs"] == events[2]["item"]["content"][0]["logprobs"] == s._text_logprobs
    assert s.close() == b""  # closed once


def test_ids_are_fresh_hex_of_the_pool_and_a_forked_child_draws_its_own():
    ids = [new_id("resp") for _ in range(1000)]
    assert len(set(ids)) == 1000 and all(len(i) == len("resp_") + 2 * ID_BYTES for i in ids)
    assert all(i.startswith("resp_") and set(i[5:]) <= set("0123456789abcdef") for i in ids)  # across refills
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.write(write, new_id("x").encode())
        os._exit(0)
    os.waitpid(pid, 0)
    child = os.read(read, 100).decode()
    assert child != new_id("x")  # the parent's next id: the child did not reuse the inherited pool


def test_an_event_out_of_the_streams_order_is_refused_and_the_end_is_the_end():
    events = EventStream()
    with pytest.raises(EventOrderError, match="response.output_text.delta cannot follow"):
        events.emit("response.output_text.delta", b',"delta":"x"}\n\n')
    s = shape()
    s.text_event("hi", True)
    with pytest.raises(EventOrderError, match="response.content_part.added cannot follow response.output_text.delta"):
        s.event("response.content_part.added", item_id="x")
    s.close()
    s.final = s.response("completed")
    s.terminal_event()
    assert s.events.ended
    with pytest.raises(EventOrderError, match="cannot follow response.completed"):
        s.event("response.output_item.added", output_index=1, item={})


def test_the_grammar_names_every_kind_once_and_failed_may_end_any_stream():
    assert set(FOLLOWS) == KINDS | {START} and set().union(*FOLLOWS.values()) <= KINDS
    for kind, nexts in FOLLOWS.items():
        ended = kind in ("response.completed", "response.incomplete", "response.failed")
        assert ("response.failed" in nexts) is (not ended and kind != START), kind


def test_a_response_answered_whole_makes_no_events():
    s = ResponseShape("resp_1", "sim-model", {}, {}, None, True, streamed=False)
    assert s.event("response.mcp_call.in_progress", item_id="x", output_index=0) == b""  # a tool loop's step
    assert s.events.sequence == 0

"""The Responses API's streamed events (gateway/api/responses.py ``ResponseShape``): a text delta made from its
template is the very event ``event()`` makes; ids are fresh and unguessable (gateway/ids.py)."""

from __future__ import annotations

import os

import orjson

from gateway.api.chat_output import Content, Reasoning
from gateway.api.response_stream import StreamLog
from gateway.api.responses import ResponseShape
from gateway.ids import ID_BYTES, new_id


def shape() -> ResponseShape:
    return ResponseShape("resp_1", "sim-model", {}, {}, None, True)


def frames(out: bytes) -> list[bytes]:
    return [part + b"\n\n" for part in out.split(b"\n\n") if part]


def data(frame: bytes) -> dict:
    return orjson.loads(frame.split(b"\ndata: ", 1)[1])


def test_a_templated_text_delta_is_the_event_event_makes():
    s = shape()
    s.log = StreamLog(stored_bytes_max=1 << 20)
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
    for frame in deltas:
        fields = data(frame)
        reference = shape()
        reference._sequence = fields.pop("sequence_number")
        assert frame == reference.event(fields.pop("type"), **fields)  # byte for byte
    numbers = [data(f)["sequence_number"] for f in frames(out)]
    assert numbers == list(range(len(numbers)))
    assert [sequence for sequence, _ in s.log.stored_events()] == numbers  # the background log has every one


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

"""A Responses request as the chat request it means (gateway/api/responses.py): items to messages,
a stored conversation first, and what is refused with a 400 naming the field (bounded metadata, item
types, tools)."""

from __future__ import annotations

import dataclasses
import time

import pytest

from gateway.api.errors import BadRequest
from gateway.api.responses import _abandoned, chat_messages, input_items, metadata_of, to_chat_body
from gateway.history import StoredResponse


def test_items_become_messages_calls_join_their_turn_and_reasoning_goes_with_it():
    items = input_items([
        {"role": "user", "content": "Weather?"},
        {"type": "reasoning", "content": [{"type": "reasoning_text", "text": "call it"}], "summary": []},
        {"type": "function_call", "call_id": "c1", "name": "w", "arguments": "{\"c\": 1}"},
        {"type": "function_call", "call_id": "c2", "name": "t", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "12C"},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "It is 12C."}]}])
    assert chat_messages(items) == [
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": "", "reasoning_content": "call it", "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "w", "arguments": "{\"c\": 1}"}},
            {"id": "c2", "type": "function", "function": {"name": "t", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "12C"},
        {"role": "assistant", "content": "It is 12C."}]


def test_history_instructions_and_fields():
    history = input_items("first question") + [
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "first answer"}]}]
    chat = to_chat_body({"model": "m", "input": "second", "instructions": "Be brief.", "max_output_tokens": 9,
                         "tools": [{"type": "function", "name": "w", "parameters": {"type": "object"}}],
                         "tool_choice": {"type": "function", "name": "w"}, "reasoning": {"effort": "low"},
                         "text": {"format": {"type": "json_schema", "name": "x", "schema": {"type": "object"}}}},
                        history)
    assert [m["content"] for m in chat["messages"]] == ["Be brief.", "first question", "first answer", "second"]
    assert chat["max_tokens"] == 9 and chat["reasoning_effort"] == "low"
    assert chat["tool_choice"] == {"type": "function", "function": {"name": "w"}}
    assert chat["response_format"] == {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object"}}}


@pytest.mark.parametrize("raw, param", [
    ([], "input"),
    ([{"type": "input_image", "image_url": "x"}], "input[0]"),
    ([{"role": "robot", "content": "x"}], "input[0].role"),
    ([{"type": "function_call", "call_id": "c"}], "input[0]"),
    ([{"role": "user", "content": [{"type": "input_file"}]}], "input[0].content"),
])
def test_bad_items_are_400s(raw, param):
    with pytest.raises(BadRequest) as e:
        input_items(raw)
    assert e.value.param == param


@pytest.mark.parametrize("metadata", [{f"k{i}": "v" for i in range(17)}, {"k": "v" * 513}, {"k" * 65: "v"},
                                      {"k": 1}, ["k"]])
def testmetadata_of_is_bounded(metadata):
    with pytest.raises(BadRequest) as e:
        metadata_of({"metadata": metadata})
    assert e.value.param == "metadata"


def test_only_function_tools():
    with pytest.raises(BadRequest) as e:
        to_chat_body({"model": "m", "input": "x", "tools": [{"type": "file_search"}]}, [])
    assert e.value.param == "tools[0]"


def test_a_background_response_past_its_bound_shows_as_failed():
    """The node generating it stopped: nobody will write its end, so readers report it failed."""
    running = StoredResponse("resp_b", "a", {"id": "resp_b", "status": "in_progress", "error": None}, (), (),
                             unfinished_until_s=time.time() - 1)
    shown = _abandoned(running).response
    assert shown["status"] == "failed" and "stopped" in shown["error"]["message"]
    later = dataclasses.replace(running, unfinished_until_s=time.time() + 60)
    assert _abandoned(later) == later  # not yet
    done = dataclasses.replace(running, response={"id": "resp_b", "status": "completed"})
    assert _abandoned(done) == done  # finished responses are what they are

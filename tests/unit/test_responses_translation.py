"""A Responses request as the chat request it means (gateway/api/responses/translate.py to_chat_request, the typed
request itself: no chat body in between): items to messages, a stored conversation first, and what is
refused with a 400 naming the field (bounded metadata, item types, tools)."""

from __future__ import annotations

import dataclasses
import time

import pytest

from gateway.api.errors import BadRequest
from gateway.api.items import input_items, metadata_of
from gateway.api.responses import chat_messages, to_chat_request
from gateway.api.responses.endpoints import _abandoned
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
    body = {"model": "m", "input": [{"role": "developer", "content": "Use tools."}, {"role": "user", "content": "second"}],
            "instructions": "Be brief.", "max_output_tokens": 9, "temperature": 0.5,
            "tools": [{"type": "function", "name": "w", "parameters": {"type": "object"}}],
            "reasoning": {"effort": "low"}, "include": ["message.output_text.logprobs"], "top_logprobs": 2,
            "text": {"format": {"type": "json_schema", "name": "x", "schema": {"type": "object"}}}}
    chat = to_chat_request(body, history)
    assert [(m["role"], m["content"]) for m in chat.messages] == [
        ("system", "Be brief."), ("user", "first question"), ("assistant", "first answer"), ("system", "Use tools."),
        ("user", "second")]
    assert (chat.sampling.max_tokens, chat.sampling.temperature, chat.sampling.logprobs) == (9, 0.5, 2)
    assert chat.template_kwargs == {"reasoning_effort": "low", "enable_thinking": True, "thinking": True}
    assert chat.sampling.constraint.kind == "json_schema" and chat.sampling.constraint_field == "text.format"
    assert (chat.tool_choice, [t["function"]["name"] for t in chat.tools]) == ("auto", ["w"])
    named = to_chat_request({"model": "m", "input": "x", "tools": body["tools"],
                             "tool_choice": {"type": "function", "name": "w"}}, [])
    assert (named.tool_choice, named.tool_name, named.sampling.constraint_field) == ("named", "w", "tool_choice")


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
        to_chat_request({"model": "m", "input": "x", "tools": [{"type": "file_search"}]}, [])
    assert e.value.param == "tools[0]"


@pytest.mark.parametrize("extra, param", [
    ({"max_output_tokens": 0}, "max_output_tokens"),
    ({"temperature": 3}, "temperature"),
    ({"reasoning": {"effort": "extreme"}}, "reasoning.effort"),
    ({"reasoning": {"effort": 1}}, "reasoning.effort"),
    ({"text": {"format": {"type": "json_schema", "name": "bad name!"}}}, "text.format.json_schema.name"),
    ({"parallel_tool_calls": "yes"}, "parallel_tool_calls"),
    ({"stream": "yes"}, "stream"),
])
def test_fields_are_checked_under_their_own_names(extra, param):
    with pytest.raises(BadRequest) as e:
        to_chat_request({"model": "m", "input": "x", **extra}, [])
    assert e.value.param == param, e.value.message


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

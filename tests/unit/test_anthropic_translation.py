"""A Messages request as the chat request it means (gateway/api/anthropic.py to_chat_request: the typed request,
no chat body in between), the answer's stop reasons, and what it refuses with a 400 naming the field."""

from __future__ import annotations

import json

import pytest

from gateway.api.anthropic import stop_reason, to_chat_request
from gateway.api.errors import BadRequest
from gateway.serving.generation import GenerationResult

BASE = {"model": "m", "max_tokens": 64}


def test_blocks_become_chat_messages():
    chat = to_chat_request({**BASE, "system": [{"type": "text", "text": "Be brief."}], "messages": [
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": [{"type": "redacted_thinking", "data": "EnC"},
                                          {"type": "thinking", "thinking": "call it", "signature": "s"},
                                          {"type": "text", "text": "Checking."},
                                          {"type": "tool_use", "id": "toolu_1", "name": "w", "input": {"c": "Oslo"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "12C"},
                                     {"type": "tool_result", "tool_use_id": "toolu_2", "is_error": True,
                                      "content": [{"type": "text", "text": "timeout"}]},
                                     {"type": "text", "text": "And tomorrow?"}]}]})
    assert chat.messages == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather?"},
        # the thinking block's signature rides along so an Anthropic or Bedrock provider can send the block back,
        # and the blocks as they were (redacted ones too) for Anthropic
        {"role": "assistant", "content": "Checking.", "reasoning_content": "call it", "reasoning_signature": "s",
         "thinking_blocks": [{"type": "redacted_thinking", "data": "EnC"},
                             {"type": "thinking", "thinking": "call it", "signature": "s"}],
         "tool_calls": [
            {"id": "toolu_1", "type": "function", "function": {"name": "w", "arguments": json.dumps({"c": "Oslo"},
                                                                                                    separators=(",", ":"))}}]},
        {"role": "tool", "tool_call_id": "toolu_1", "content": "12C"},
        {"role": "tool", "tool_call_id": "toolu_2", "content": "Error: timeout"},
        {"role": "user", "content": "And tomorrow?"}]


@pytest.mark.parametrize("choice, expected, parallel", [
    ({"type": "auto"}, ("auto", None), True), ({"type": "any"}, ("required", None), True),
    ({"type": "any", "disable_parallel_tool_use": True}, ("required", None), False),
    ({"type": "tool", "name": "w", "disable_parallel_tool_use": True}, ("named", "w"), False),
    ({"type": "none"}, ("none", None), True),
])
def test_tools_and_tool_choice(choice, expected, parallel):
    chat = to_chat_request({**BASE, "messages": [{"role": "user", "content": "x"}], "tool_choice": choice,
                            "tools": [{"name": "w", "description": "d", "input_schema": {"type": "object"}}]})
    assert chat.tools == [{"type": "function", "function": {"name": "w", "parameters": {"type": "object"},
                                                            "description": "d"}}]
    assert (chat.tool_choice, chat.tool_name) == expected
    if chat.tool_choice == "required":  # one call at most when parallel calls are off: the constraint says so
        assert ('"maxItems"' in chat.sampling.constraint.spec) is not parallel


@pytest.mark.parametrize("extra, param", [
    ({"max_tokens": None}, "max_tokens"),
    ({"messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]}, "messages[0].content[0].source"),
    ({"messages": [{"role": "user", "content": [{"type": "image", "source": {"type": "base64", "media_type": "image/tiff",
                                                                              "data": "AA=="}}]}]},
     "messages[0].content[0].source"),
    ({"messages": [{"role": "user", "content": [{"type": "document", "source": {}}]}]}, "messages[0].content[0]"),
    ({"tools": [{"type": "bash_20250124", "name": "bash"}]}, "tools[0]"),
    ({"tool_choice": {"type": "sometimes"}}, "tool_choice"),
    ({"thinking": {"type": "enabled", "budget_tokens": 64}}, "thinking.budget_tokens"),
    ({"thinking": {"type": "maybe"}}, "thinking"),
    ({"system": 5}, "system"),
    ({"stop_sequences": "x" * 2000}, "stop_sequences"),
    ({"temperature": "hot"}, "temperature"),
    ({"max_tokens": 2 ** 40}, "max_tokens"),
])
def test_what_is_refused(extra, param):
    body = {**BASE, "messages": [{"role": "user", "content": "x"}], **extra}
    with pytest.raises(BadRequest) as e:
        to_chat_request(body)
    assert e.value.param == param, e.value.message


def test_image_blocks_become_image_parts_in_order():
    chat = to_chat_request({**BASE, "messages": [{"role": "user", "content": [
        {"type": "text", "text": "Compare"},
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}},
        {"type": "image", "source": {"type": "url", "url": "https://img.example.com/b.jpg"}},
        {"type": "text", "text": "please."}]}]})
    assert chat.messages == [{"role": "user", "content": [
        {"type": "text", "text": "Compare"}, {"type": "image"}, {"type": "image"}, {"type": "text", "text": "please."}]}]
    assert [(ref.url, ref.where) for ref in chat.images] == [
        ("data:image/png;base64,iVBORw0KGgo=", "messages[0].content[1]"),
        ("https://img.example.com/b.jpg", "messages[0].content[2]")]


def test_thinking_switch_and_stop_reasons():
    chat = to_chat_request({**BASE, "max_tokens": 4096, "messages": [{"role": "user", "content": "x"}],
                            "stop_sequences": ["END"], "thinking": {"type": "enabled", "budget_tokens": 2048}})
    assert chat.template_kwargs == {"enable_thinking": True, "thinking": True} and chat.thinking
    assert (chat.sampling.max_tokens, chat.sampling.stop) == (4096, ("END",))
    counted = to_chat_request({"model": "m", "messages": [{"role": "user", "content": "x"}]}, count_only=True)
    assert counted.sampling.max_tokens is None  # count_tokens has no max_tokens, and needs none

    def result(finish, matched=None):
        return GenerationResult("", [], finish, matched, 1, 1, 0, "w")
    assert stop_reason(result("stop"), False) == ("end_turn", None)
    assert stop_reason(result("stop", "END"), False) == ("stop_sequence", "END")
    assert stop_reason(result("stop", 151645), False) == ("end_turn", None)  # the EOS id, not a sequence
    assert stop_reason(result("stop"), True) == ("tool_use", None)
    assert stop_reason(result("length"), True) == ("max_tokens", None)

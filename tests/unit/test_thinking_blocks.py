"""A provider's reasoning block by block (serving.chat.ThinkingBlock): several signed blocks (Anthropic's interleaved
thinking, each signature of its own block) and redacted ones, as each client API carries them and gives them back:
Responses' reasoning items (a redacted block marked in ``encrypted_content``), chat's ``thinking_blocks``, and what
a provider is sent of a client's blocks (only signed and redacted ones, rebuilt from their own fields)."""

from __future__ import annotations

import orjson

from gateway.api.openai import OpenAIShape
from gateway.api.responses import ResponseShape
from gateway.api.responses.translate import chat_messages
from gateway.providers.base import thinking_blocks_of
from gateway.serving.chat import REDACTED_REASONING_PREFIX, Content, Reasoning, ReasoningSignature, RedactedReasoning

BLOCKS = [{"type": "redacted_thinking", "data": "RW5j"},
          {"type": "thinking", "thinking": "First.", "signature": "sig-a"},
          {"type": "thinking", "thinking": "Second.", "signature": "sig-b"}]


def test_only_signed_and_redacted_blocks_are_given_to_a_provider_each_from_its_own_fields():
    sent = [*BLOCKS, {"type": "thinking", "thinking": "unsigned", "signature": ""},
            {"type": "thinking", "thinking": "no signature"}, {"type": "redacted_thinking", "data": ""},
            {"type": "text", "text": "not reasoning"}, "a string", None,
            {"type": "thinking", "thinking": "Third.", "signature": "sig-c", "cache_control": {"type": "ephemeral"}}]
    assert thinking_blocks_of(sent) == [*BLOCKS, {"type": "thinking", "thinking": "Third.", "signature": "sig-c"}]
    assert thinking_blocks_of("not a list") == [] and thinking_blocks_of(None) == []


def test_reasoning_items_go_back_block_by_block_a_redacted_one_as_it_was():
    items = [{"type": "message", "role": "user", "content": "Weather?"},
             {"type": "reasoning", "content": [], "encrypted_content": REDACTED_REASONING_PREFIX + "RW5j"},
             {"type": "reasoning", "content": [{"type": "reasoning_text", "text": "First."}],
              "encrypted_content": "sig-a"},
             {"type": "reasoning", "content": [{"type": "reasoning_text", "text": "Second."}],
              "encrypted_content": "sig-b"},
             {"type": "function_call", "call_id": "call_1", "name": "f", "arguments": "{}"}]
    assistant = chat_messages(items)[1]
    assert assistant["thinking_blocks"] == BLOCKS
    # The joined text and the last signature too: what a wire that takes one reasoning per turn reads.
    assert (assistant["reasoning_content"], assistant["reasoning_signature"]) == ("First.Second.", "sig-b")


def _events(out: bytes) -> list[dict]:
    return [orjson.loads(frame.split(b"data: ", 1)[1]) for frame in out.split(b"\n\n") if frame]


def test_a_streamed_redacted_block_is_a_reasoning_item_of_its_own_between_signed_ones():
    shape = ResponseShape("resp_1", "claude", {}, {}, None, True)
    out = shape.delta_events([Reasoning("First."), ReasoningSignature("sig-a", "First."), RedactedReasoning("RW5j"),
                              Reasoning("Second."), ReasoningSignature("sig-b", "Second."), Content("Hi")], True)
    done = [e["item"] for e in _events(out) if e["type"] == "response.output_item.done"]
    assert [(item["type"], item.get("encrypted_content"), item["content"]) for item in done] == [
        ("reasoning", "sig-a", [{"type": "reasoning_text", "text": "First."}]),
        ("reasoning", REDACTED_REASONING_PREFIX + "RW5j", []),
        ("reasoning", "sig-b", [{"type": "reasoning_text", "text": "Second."}])]


def test_a_chat_stream_gives_each_block_whole_when_it_ends():
    shape = OpenAIShape(True, "chatcmpl-1", "claude")
    out = shape.delta_events([RedactedReasoning("RW5j"), Reasoning("Fir"), Reasoning("st."),
                              ReasoningSignature("sig-a", "First."), Reasoning("Second."),
                              ReasoningSignature("sig-b", "Second.")], True)
    deltas = [e["choices"][0]["delta"] for e in _events(out) if e != "[DONE]"]
    assert [b for d in deltas for b in d.get("thinking_blocks") or ()] == BLOCKS
    assert "".join(d.get("reasoning_content") or "" for d in deltas) == "First.Second."


def test_unsigned_reasoning_beside_a_redacted_block_is_kept_in_a_whole_answer():
    """A model that does not sign its reasoning (Bedrock's others) with a redacted block too: both blocks, the text
    with no signature to send back (and none invented), nothing of it lost to a Responses client."""
    from gateway.providers.bedrock import BedrockConverse
    from gateway.serving.chat import ChatAnswer
    from gateway.serving.generation import GenerationResult

    answer = BedrockConverse().answer(orjson.dumps({"output": {"message": {"role": "assistant", "content": [
        {"reasoningContent": {"reasoningText": {"text": "Plain."}}}, {"reasoningContent": {"redactedContent": "RW5j"}},
        {"text": "Hi"}]}}, "stopReason": "end_turn", "usage": {"inputTokens": 3, "outputTokens": 2}}))
    assert answer.thinking_blocks == ({"type": "thinking", "thinking": "Plain.", "signature": ""}, BLOCKS[0])
    assert thinking_blocks_of(list(answer.thinking_blocks)) == [BLOCKS[0]]  # only what a provider takes back
    shape = ResponseShape("resp_1", "aws", {}, {}, None, False)
    result = GenerationResult("Hi", [], "stop", None, 3, 2, 0, "aws")
    body = shape.whole(ChatAnswer(result, "stop", False, 0, "Hi", answer.reasoning,
                                  thinking_blocks=answer.thinking_blocks))
    items = [item for item in body["output"] if item["type"] == "reasoning"]
    assert [(item["content"], item.get("encrypted_content")) for item in items] == [
        ([{"type": "reasoning_text", "text": "Plain."}], None), ([], REDACTED_REASONING_PREFIX + "RW5j")]

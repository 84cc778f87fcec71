"""A chat answer under OpenAI's chat renderer, driven as the pipeline drives them, and its stream assembled back into
the message it says (the chat-output and parser tests share them)."""

from __future__ import annotations

import dataclasses

import orjson

from gateway.api.chat_output import ChatOutput
from gateway.api.openai import OpenAIShape


class Rendered:
    """A ChatOutput under OpenAI's chat renderer, driven as the pipeline drives them (pipeline.answer_chat)."""

    def __init__(self, output: ChatOutput) -> None:
        self.output = output
        self.shape = OpenAIShape(True, "chatcmpl-x", "m")

    def full(self, text, done):
        return self.shape.whole(self.output.whole(dataclasses.replace(done, text=text)))

    def text_event(self, text, first):
        return self.shape.delta_events(self.output.feed(text), first)

    def final_events(self, done, include_usage):
        self.shape.include_usage = include_usage
        return self.shape.final_events(self.output.finish(), self.output.streamed_answer(done))


def assemble(events: bytes):
    content, reasoning, calls, finish, first_role = None, "", {}, None, None
    for line in events.split(b"\n\n"):
        if not line.startswith(b"data: ") or line == b"data: [DONE]":
            continue
        chunk = orjson.loads(line[6:])
        if not chunk["choices"]:
            continue
        choice = chunk["choices"][0]
        delta = choice["delta"]
        first_role = first_role or delta.get("role")
        if "content" in delta and delta["content"] is not None:
            content = (content or "") + delta["content"]
        reasoning += delta.get("reasoning_content") or ""
        for call in delta.get("tool_calls") or []:
            entry = calls.setdefault(call["index"], {"name": "", "arguments": ""})
            entry["name"] += call.get("function", {}).get("name") or ""
            entry["arguments"] += call.get("function", {}).get("arguments") or ""
        finish = choice["finish_reason"] or finish
    return first_role, content, reasoning, [calls[i] for i in sorted(calls)], finish

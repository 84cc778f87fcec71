"""The parts of a tool loop every API shares (the Responses API's MCP tools, the Messages API's mcp_servers): one
generation step at a time, each with its own admission and rate limits (a slot is not held while a tool runs),
its text streamed as typed deltas to the API's renderer; the tool calls it made; the usage of all the steps.

A loop is: generate; if the model called hosted tools, run them and generate again with their results, until
it answers without them, a call waits for approval, the budget of calls is spent (then one last step with no
tools, so the model answers), or its time is up. What each API shows of it is its own (responses/tools.py,
anthropic.py).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Awaitable, Callable
from typing import Any

import trio

from ..engine.errors import EngineCallError
from ..serving.generation import GenerationResult, MidStreamError
from ..mcp.results import CallOutcome
from ..mcp.sessions import McpUnavailable
from .chat_output import ChatOutput
from ..serving.chat import Call, ChatAnswer, ChatRequest, Content, Delta, Reasoning
from .errors import BadRequest, from_engine_error
from .http import Request
from .mcp_tools import HostedServer, HostedTools
from .pipeline import admitted, chat_prompt, plan_generation
from .state import GatewayState

DeltaWriter = Callable[["list[Delta]"], Awaitable[None]]


@dataclasses.dataclass(frozen=True)
class Step:
    answer: ChatAnswer
    calls: "tuple[Call, ...]"  # every call the model made, hosted or not, in order
    text: str = ""  # its content and reasoning (a streamed answer's, gathered from its deltas)
    reasoning: str = ""

    def assistant_turn(self, calls: "list[Call]") -> dict[str, Any]:
        """The step's answer with ``calls``, as the next step's prompt reads it (an assistant message)."""
        message: dict[str, Any] = {"role": "assistant", "content": self.text, "tool_calls": [
            {"id": call.id, "type": "function", "function": {"name": call.name, "arguments": call.arguments}}
            for call in calls]}
        if self.reasoning:
            message["reasoning_content"] = self.reasoning
        return message


@dataclasses.dataclass
class Usage:
    """The steps' usage together (the response's)."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    reasoning_tokens: int = 0
    last: GenerationResult | None = None

    def add(self, answer: ChatAnswer) -> None:
        result = answer.result
        self.prompt_tokens += result.prompt_tokens
        self.completion_tokens += result.completion_tokens
        self.cached_tokens += result.cached_tokens
        self.reasoning_tokens += answer.reasoning_tokens
        self.last = result

    def result(self) -> GenerationResult | None:
        """The last step's result with every step's counts: what a response reports."""
        if self.last is None:
            return None
        return dataclasses.replace(self.last, prompt_tokens=self.prompt_tokens,
                                   completion_tokens=self.completion_tokens, cached_tokens=self.cached_tokens)


async def generate_step(state: GatewayState, request: Request, chat: ChatRequest, api: str,
                        write: DeltaWriter | None) -> Step:
    """One generation of the loop: admitted, run, its deltas written as they are decided (``write``; None: the
    answer whole). Engine failures are the API's errors (a stream's, mid-way, too)."""
    prompt = await chat_prompt(state, request, chat, api)
    entry, tokenizer = prompt.entry, prompt.tokenizer
    output = ChatOutput.for_request(entry, chat)
    if output is None:
        raise BadRequest(f"the model '{entry.name}' has no tool-call parser on this node, so it cannot call the "
                         "request's MCP tools (start the node with --tool-call-parser)", param="tools",
                         code="unsupported_model")
    plan = plan_generation(state, request, entry, prompt.ids, chat.sampling, write is not None, "input", prompt.media,
                           prompt.routing_ids)
    plan.kept_special = output.kept_special
    plan.answer_bytes_max = state.config.answer_bytes_max
    sink = _DeltaSink(output, write) if write is not None else None
    try:
        async with admitted(state, request, plan):
            result = await state.generator.run(plan, tokenizer, sink)
    except MidStreamError as e:
        raise from_engine_error(e.error, plan.model) from None
    except EngineCallError as e:
        raise from_engine_error(e, plan.model) from None
    state.count_tokens(plan.model, result)
    if sink is None:
        answer = output.whole(result)
        return Step(answer, answer.calls, answer.content or "", answer.reasoning or "")
    last = output.finish()
    await sink.deltas(last)
    return Step(output.streamed_answer(result), tuple(sink.calls), "".join(sink.text), "".join(sink.reasoning))


class _DeltaSink:
    """``generation.TextSink`` of a loop's step: the text's deltas go to the API's writer, in the request's task;
    the calls among them are kept for the loop."""

    __slots__ = ("_output", "_write", "calls", "text", "reasoning")

    def __init__(self, output: ChatOutput, write: DeltaWriter) -> None:
        self._output, self._write = output, write
        self.calls: list[Call] = []
        self.text: list[str] = []
        self.reasoning: list[str] = []

    async def __call__(self, text: str) -> None:
        await self.deltas(self._output.feed(text))

    async def deltas(self, deltas: "list[Delta]") -> None:
        for delta in deltas:
            kind = type(delta)
            if kind is Call:
                self.calls.append(delta)
            elif kind is Content:
                self.text.append(delta.text)
            elif kind is Reasoning:
                self.reasoning.append(delta.text)
        if deltas:
            await self._write(deltas)

    def ready_now(self) -> bool:
        return False  # always through __call__: a step's writes interleave with the loop's own events

    def send_now(self, text: str) -> bool:
        raise AssertionError("ready_now is never true")

    async def flush(self) -> None:
        pass


def call_arguments(text: str) -> "dict[str, Any] | str":
    """A call's arguments (JSON text) as the MCP call takes them (an object), or why they cannot be (the model's
    error)."""
    try:
        arguments = json.loads(text) if text.strip() else {}
    except ValueError:
        return "the arguments are not valid JSON"
    if not isinstance(arguments, dict):
        return "the arguments are not a JSON object"
    return arguments


async def call_hosted(state: GatewayState, hosted: HostedTools, name: str, arguments_text: str) -> CallOutcome:
    """Run the model's call of the hosted tool ``name`` (a span of its own when tracing is on); arguments that are
    no JSON object are the model's error, told back to it."""
    server, tool = hosted.tools[name]
    arguments = call_arguments(arguments_text)
    if isinstance(arguments, str):
        return CallOutcome(error={"type": "mcp_tool_execution_error",
                                  "content": [{"type": "text", "text": f"not called: {arguments}"}]})
    tracing = state.tracing
    if tracing is None or not tracing.active():
        return await state.mcp.call(server.ref, tool.name, arguments)
    with tracing.span("mcp.call", attributes={"mcp.server": server.label, "mcp.tool": tool.name}):
        return await state.mcp.call(server.ref, tool.name, arguments)


async def list_servers(state: GatewayState, hosted: HostedTools, servers: "list[HostedServer]",
                       function_names: "set[str]") -> "list[tuple[HostedServer, list[Any] | None, str | None]]":
    """Each server's tools, listed at once (each bounded by its own timeout): (server, its tools or None, the
    error). The tools it offers join ``hosted``."""
    outcomes: list[Any] = [None] * len(servers)

    async def one(index: int, server: HostedServer) -> None:
        try:
            outcomes[index] = (server, await state.mcp.list_tools(server.ref), None)
        except McpUnavailable as e:
            outcomes[index] = (server, None, str(e))

    async with trio.open_nursery() as nursery:
        for index, server in enumerate(servers):
            nursery.start_soon(one, index, server)
    for server, tools, _ in outcomes:
        if tools is not None:
            hosted.add(server, tools, function_names)
    return outcomes

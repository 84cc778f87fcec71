"""Anthropic's MCP connector on the Messages API: ``mcp_servers`` the node calls itself (issue 38).

Each server's tools are listed (the session keeps its list: a conversation's next turn costs no new listing) and
offered to the model beside the request's own tools; a call to one is an ``mcp_tool_use`` block, run at once,
its answer an ``mcp_tool_result`` block (``is_error`` when the tool or the server failed), and the model is asked
again with it, until it answers without them, calls a client tool (``stop_reason: tool_use``: the client's turn),
or --mcp-max-tool-calls calls ran (then one last step without tools). A server that cannot list its tools is
refused before anything is answered (Anthropic's connector does the same: a 400). No approvals: Anthropic's
connector has none. Usage is every step's together; max_tokens bounds them together. Streamed as one message:
its blocks numbered across the steps.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import trio

from .errors import BadRequest, UpstreamTimeout, to_api_error
from .http import SSE_HEADERS, Request
from .mcp_tools import HostedTools, messages_servers
from ..serving.chat import ChatRequest
from .pipeline import ready_model_entry
from .state import GatewayState
from .tool_loop import Usage, call_hosted, generate_step, list_servers


async def answer_with_mcp(state: GatewayState, request: Request, body: dict[str, Any],
                          to_chat: Callable[..., Any], new_shape: Callable[[str], Any]) -> None:
    """Answer a Messages request with ``mcp_servers``: ``to_chat`` its translation (anthropic.to_chat_request),
    ``new_shape(model)`` its renderer (a MessagesShape)."""
    stream = body.get("stream") is True
    entry = await ready_model_entry(state, body.get("model") if isinstance(body.get("model"), str) else None,
                                    request.principal)
    servers = await messages_servers(state, request, body["mcp_servers"])
    hosted = HostedTools(servers)
    function_names = {t.get("name") for t in body.get("tools") or () if isinstance(t, dict)}
    for server, tools, error in await list_servers(state, hosted, servers, function_names):
        if tools is None:
            raise BadRequest(f"the MCP server '{server.label}' could not list its tools: {error}",
                             param=server.where, code="mcp_server_unavailable")
    chat = to_chat(body, hosted=hosted.function_tools())  # checked before anything is answered
    shape = new_shape(entry.name)
    shape.hosted = hosted
    async with request.cancel_on_disconnect():
        if not stream:
            usage, called = await _loop(state, request, chat, shape, hosted, None)
            await request.send_json(200, shape.message(usage.result(), called))
            return
        await request.start_stream(200, SSE_HEADERS)
        await request.send_chunk(shape.opening())
        try:
            usage, called = await _loop(state, request, chat, shape, hosted, request.send_chunk)
            end = shape.closing_events(usage.result(), called)
        except Exception as e:
            error = to_api_error(e)
            if error is None:
                raise
            end = shape.close() + shape.error_event(error)
        await request.end_stream(end)


async def _loop(state: GatewayState, request: Request, chat: ChatRequest, shape: Any, hosted: HostedTools,
                emit: Any) -> "tuple[Usage, bool]":
    """The steps; (their usage, whether the last one called a client tool)."""
    config = state.mcp.config
    tokens_max = chat.sampling.max_tokens
    usage, calls_run, tools_off = Usage(), 0, False
    try:
        with trio.fail_after(config.response_time_max_s):
            while True:
                if tools_off:  # the calls are spent: the model answers
                    chat = dataclasses.replace(chat, tools=None, tool_choice="none", tool_name=None)
                chat.sampling.max_tokens = tokens_max - usage.completion_tokens
                write = (lambda deltas: emit(shape.delta_events(deltas, False))) if emit is not None else None
                step = await generate_step(state, request, chat, "Messages API", write)
                if emit is None:
                    shape.add_answer(step.answer)
                usage.add(step.answer)
                pending, shape.pending = shape.pending, []
                client_calls = len(step.calls) > len(pending)
                if tools_off or not pending or step.answer.result.finish_reason == "length" or \
                        usage.completion_tokens >= tokens_max:
                    return usage, client_calls
                results = await _run(state, hosted, pending[:config.tool_calls_max - calls_run])
                calls_run += len(results)
                not_run = (f"Error: not run: the message reached --mcp-max-tool-calls ({config.tool_calls_max})", True)
                for index, (block, _) in enumerate(pending):
                    text, is_error = results[index] if index < len(results) else not_run
                    out = shape.result_events(block, text, is_error, emit is not None)
                    if emit is not None:
                        await emit(out)
                if client_calls:
                    return usage, True
                done = pending[:len(results)]
                chat = dataclasses.replace(chat, messages=[
                    *chat.messages, step.assistant_turn([call for _, call in done]),
                    *({"role": "tool", "tool_call_id": c.id, "content": text} for (_, c), (text, _) in zip(done, results))])
                tools_off = calls_run >= config.tool_calls_max or len(results) < len(pending)
    except trio.TooSlowError:
        raise UpstreamTimeout(f"the message's MCP tool loop took longer than {config.response_time_max_s:g} s "
                              "(--mcp-response-time-limit-secs)", code="response_timeout") from None


async def _run(state: GatewayState, hosted: HostedTools, pending: "list[tuple[dict[str, Any], Any]]"
               ) -> "list[tuple[str, bool]]":
    """The calls at once: (the text the model reads, whether it is an error), in order."""
    results: list[Any] = [None] * len(pending)

    async def one(index: int, call: Any) -> None:
        outcome = await call_hosted(state, hosted, call.name, call.arguments)
        results[index] = (outcome.for_model(), outcome.failed)

    async with trio.open_nursery() as nursery:
        for index, (_, call) in enumerate(pending):
            nursery.start_soon(one, index, call)
    return results

"""The Responses API's tool loop: MCP tools the node runs itself (issue 38), for a request whose ``tools`` name
MCP servers (or a built-in type a configured server serves), or whose input answers an approval.

    1. Each server's tools: from the chain's last ``mcp_list_tools`` item of that label when there is one (a
       follow-up by previous_response_id or in a conversation does not list again, as OpenAI's), else listed now:
       an ``mcp_list_tools`` item (``error`` set when the server could not say; the loop goes on without it).
    2. The approvals the input answers: an approved call runs now (its ``mcp_call`` has the
       ``approval_request_id``); a refused one is told to the model as refused.
    3. Generate (tool_loop.generate_step); a call to an MCP tool becomes an ``mcp_call`` item and runs, or, where
       ``require_approval`` says so, an ``mcp_approval_request`` item and the response ends there for the user to
       answer. Function tools' calls still go back to the client (the response ends with them). With every MCP call
       of this step run, generate again with their results, at most ``max_tool_calls`` calls (the request's, else
       --mcp-max-tool-calls; then one last step without tools, so the model answers) and
       --mcp-response-time-limit-secs in all.

Streamed with OpenAI's events (``response.mcp_list_tools.*``, ``response.mcp_call_arguments.delta/done``,
``response.mcp_call.in_progress/completed/failed``, each item added and done), the sequence numbers running
across steps. The response's usage is every step's together; max_output_tokens bounds them together. Stored as
every response: a follow-up on any node sees the calls and their outputs; ``background`` runs the loop in the
background, and a cancel stops it (the call in flight too).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import trio

from ...base.ids import new_id
from ...mcp.results import CallOutcome, ToolInfo
from ..errors import BadRequest, UpstreamTimeout
from ..http import Request
from ..mcp_tools import HostedServer, HostedTools
from ..protocol import positive_int
from ..state import GatewayState
from ..tool_loop import Usage, call_hosted, generate_step, list_servers

Emit = Callable[[bytes], Awaitable[None]]


async def no_emit(_: bytes) -> None:
    """Where a response's events go when nobody reads them live (a whole answer; a background stream's are in
    its log already)."""


@dataclasses.dataclass
class ToolLoop:
    state: GatewayState
    request: Request
    body: dict[str, Any]
    history: "Sequence[dict[str, Any]]"  # the context's items, before this request's input
    shape: Any  # responses.ResponseShape
    to_chat: Callable[..., Any]  # responses.to_chat_request
    stream: bool
    servers: list[HostedServer]  # the request's, checked before anything was answered (mcp_tools.responses_servers)

    async def run(self, emit: Emit) -> dict[str, Any]:
        """The final response (completed or incomplete); its events went to ``emit`` as they came. A failure is
        raised (the caller answers it: a status, a stream's error event, a failed background response)."""
        config = self.state.mcp.config
        try:
            with trio.fail_after(config.response_time_max_s):
                return await self._loop(emit)
        except trio.TooSlowError:
            raise UpstreamTimeout(f"the response's tool loop took longer than {config.response_time_max_s:g} s "
                                  "(--mcp-response-time-limit-secs)", code="response_timeout") from None

    async def _loop(self, emit: Emit) -> dict[str, Any]:
        shape, body = self.shape, self.body
        calls_max = positive_int(body, "max_tool_calls", self.state.mcp.config.tool_calls_max)
        tokens_max = positive_int(body, "max_output_tokens")
        hosted = shape.hosted = HostedTools(self.servers)
        function_names = {t.get("name") for t in body.get("tools") or () if isinstance(t, dict)
                          and t.get("type") == "function"}
        await self._tools_of(hosted, function_names, emit)
        calls_run = await self._approved(hosted, emit)
        usage, tools_off = Usage(), False
        while True:
            chat = self.to_chat(body, self.history, list(shape.output), hosted.function_tools(), tools_off)
            if tokens_max is not None:
                chat.sampling.max_tokens = tokens_max - usage.completion_tokens
            write = (lambda deltas: emit(shape.delta_events(deltas, False))) if self.stream else None
            step = await generate_step(self.state, self.request, chat, "Responses API", write)
            if self.stream:
                await emit(shape.close())
            else:
                shape.add_answer(step.answer)
            usage.add(step.answer)
            pending, shape.pending = shape.pending, []
            if tools_off or not pending or step.answer.result.finish_reason == "length":
                break
            if any(item["type"] == "mcp_approval_request" for item, _ in pending) or \
                    len(step.calls) > len(pending):  # the user's to approve, or the client's own calls: theirs now
                await self._run_calls([(i, c) for i, c in pending if i["type"] == "mcp_call"], hosted, emit)
                break
            budget = calls_max - calls_run
            await self._run_calls(pending[:budget], hosted, emit)
            calls_run += min(len(pending), budget)
            for item, _ in pending[budget:]:
                await emit(shape.call_done(item, None, _not_run(calls_max)))
            tools_off = calls_run >= calls_max  # spent: the next step answers without tools
            if tokens_max is not None and usage.completion_tokens >= tokens_max:
                break
        result = usage.result()
        final = shape.response("completed", result, usage.reasoning_tokens)
        if tokens_max is not None and usage.completion_tokens >= tokens_max and final["status"] == "completed":
            final["status"], final["incomplete_details"] = "incomplete", {"reason": "max_output_tokens"}
            final["completed_at"] = None
        shape.final = final
        return final

    async def _tools_of(self, hosted: HostedTools, function_names: "set[str]", emit: Emit) -> None:
        """Each server's tools: the chain's list when it has one, else listed now (its item and events)."""
        to_list: list[HostedServer] = []
        for server in hosted.servers:
            cached = _listed_before(self.history, server.label)
            if cached is None:
                to_list.append(server)
            else:
                hosted.add(server, cached, function_names)
        if not to_list:
            return
        for server in to_list:
            await emit(self.shape.listing_started(server.label))
        for server, tools, error in await list_servers(self.state, hosted, to_list, function_names):
            shown = [tool.listed() for tool in tools if server.offers(tool)] if tools is not None else None
            await emit(self.shape.listing_done(server.label, shown, error))

    async def _approved(self, hosted: HostedTools, emit: Emit) -> int:
        """Run the calls the input approves; how many ran."""
        answers = [item for item in _input_list(self.body) if isinstance(item, dict)
                   and item.get("type") == "mcp_approval_response" and item.get("approve") is True]
        # Only requests the gateway issued and stored, in this tenant's chain: an input that carried its own
        # mcp_approval_request (a call no model proposed, with any arguments) and its approval ran the tool past
        # require_approval "always" (issue 59).
        asked = {item.get("id"): item for item in self.history if item.get("type") == "mcp_approval_request"}
        ran = 0
        for answer in answers:
            request = asked.get(answer["approval_request_id"])
            if request is None:
                raise BadRequest(f"no approval was asked with id {answer['approval_request_id']!r} in this response's "
                                 "stored chain: an approval answers a request this gateway made and stored (continue "
                                 "with previous_response_id or the conversation)", param="input",
                                 code="unknown_approval_request")
            server = hosted.server_labelled(request["server_label"])
            if server is None or hosted.server_of(request["name"]) is not server:
                raise BadRequest(f"the approved call is to {request['name']!r} of the MCP server "
                                 f"{request['server_label']!r}, which this request's tools do not offer",
                                 param="tools", code="invalid_value")
            item = {"type": "mcp_call", "id": new_id("mcp"), "server_label": server.label, "name": request["name"],
                    "arguments": request["arguments"], "output": None, "error": None, "status": "in_progress",
                    "approval_request_id": request["id"]}
            await emit(self.shape.call_added(item))
            await self._run_call(item, hosted, emit)
            ran += 1
        return ran

    async def _run_calls(self, pending: "list[tuple[dict[str, Any], Any]]", hosted: HostedTools, emit: Emit) -> None:
        """Run a step's calls at once (each bounded by its own timeout); their events in the order they were made."""
        if not pending:
            return
        for item, _ in pending:
            await emit(self.shape.call_running(item))
        outcomes: list[Any] = [None] * len(pending)

        async def one(index: int, item: dict[str, Any]) -> None:
            outcomes[index] = await self._outcome(item, hosted)

        async with trio.open_nursery() as nursery:
            for index, (item, _) in enumerate(pending):
                nursery.start_soon(one, index, item)
        for (item, _), outcome in zip(pending, outcomes):
            await emit(self.shape.call_done(item, outcome.output, outcome.error))

    async def _run_call(self, item: dict[str, Any], hosted: HostedTools, emit: Emit) -> None:
        await emit(self.shape.call_running(item))
        outcome = await self._outcome(item, hosted)
        await emit(self.shape.call_done(item, outcome.output, outcome.error))

    async def _outcome(self, item: dict[str, Any], hosted: HostedTools) -> CallOutcome:
        return await call_hosted(self.state, hosted, item["name"], item["arguments"])


def _not_run(calls_max: int) -> dict[str, Any]:
    return {"type": "mcp_tool_execution_error",
            "content": [{"type": "text", "text": f"not run: the response reached max_tool_calls ({calls_max})"}]}


def _input_list(body: dict[str, Any]) -> list[Any]:
    raw = body.get("input")
    return raw if isinstance(raw, list) else []


def _listed_before(items: "Sequence[dict[str, Any]]", label: str) -> "list[ToolInfo] | None":
    """The tools the chain's last good ``mcp_list_tools`` of ``label`` listed; None when it has none."""
    for item in reversed(items):
        if item.get("type") == "mcp_list_tools" and item.get("server_label") == label and not item.get("error"):
            tools = [ToolInfo.from_listed(entry) for entry in item.get("tools") or ()]
            return [tool for tool in tools if tool is not None]
    return None

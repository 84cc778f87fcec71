"""The Responses API's endpoints: POST /v1/responses (``create``), GET and DELETE /v1/responses/{id}
(``retrieve``, ``delete``), POST /v1/responses/{id}/cancel (``cancel``), GET /v1/responses/{id}/input_items
(``list_input_items``). A request continues its context (``chain.py``), is translated (``translate.py``),
answered by the pipeline in ``ResponseShape`` (``shape.py``), with the tool loop when the node runs its tools
(``tools.py``), or in the background (``background.py``); stored by the keeper before the client hears of it."""

from __future__ import annotations

import contextlib
import dataclasses
import time
from typing import Any

import orjson

from ...base.ids import new_id
from ...history import StoredResponse
from ..background import BackgroundRequest, BackgroundRun
from ..chat_output import ChatOutput
from ..errors import BadRequest, NotFound, shown, to_api_error
from ..http import SSE_HEADERS, Request
from ..items import input_items, list_page, list_query, metadata_of, with_ids
from ..mcp_tools import responses_servers
from ..pipeline import (answer_chat, chat_prompt, logprob_shape, plan_generation, rate_limited_generation,
                        ready_model_entry)
from ..protocol import field, parse_json_body
from ..ratelimits import counted_write
from ..routed import answer_provider, answer_routed, route_of
from ..state import GatewayState
from .background import (ProviderInBackground, background_answer, background_loop, failed_response,
                         start_in_background)
from .chain import NO_CONTEXT, Context, context_of, conversation_id_of, history_store, keeper
from .shape import ResponseShape
from .stream_log import StreamLog, follow_log, follow_store, starting_after, stored_events_bytes_max
from .tools import ToolLoop, no_emit
from .translate import INCLUDE_LOGPROBS, has_hosted_tools, included, to_chat_request


def _stream_log(state: GatewayState) -> StreamLog:
    """A background stream's log: its events kept for a resume, within what one stored record may carry."""
    return StreamLog(stored_events_bytes_max(state.config.history.record_bytes_max))


async def create(state: GatewayState, request: Request) -> None:
    body = parse_json_body(await request.body())
    store = body.get("store", True)
    if not isinstance(store, bool):
        raise BadRequest(f"'store' must be a boolean, got {shown(store)}", param="store", code="invalid_type")
    background = body.get("background", False)
    if not isinstance(background, bool):
        raise BadRequest(f"'background' must be a boolean, got {shown(background)}", param="background",
                         code="invalid_type")
    if background:
        history_store(state, "background")
        if not store:
            raise BadRequest("a background response is stored: 'store' cannot be false", param="store",
                             code="invalid_value")
    # Most requests set neither, and continue nothing: no store to read, no coroutine to make.
    metadata = metadata_of(body) if "metadata" in body else {}
    conversation_id = conversation_id_of(body) if "conversation" in body else None
    context = await context_of(state, body, request.owner, conversation_id) if conversation_id is not None or \
        body.get("previous_response_id") is not None else NO_CONTEXT
    # The conversation's items get ids of their own (no clash with older ones).
    inputs = input_items(body.get("input"))
    items = with_ids(inputs, fresh=conversation_id is not None)
    if has_hosted_tools(body, inputs):  # tools the node runs: the tool loop (tools.py)
        await _create_with_tools(state, request, body, context, items, metadata, conversation_id, store, background)
        return
    chat = to_chat_request(body, context.items, inputs=inputs)
    route = route_of(state, chat.model, request)
    if route is None:  # most requests: no object of the route's made for them
        await _create_on_pool(state, request, body, context, items, metadata, conversation_id, store, background,
                              chat)
        return
    if background:
        await _create_routed_in_background(state, request, body, context, items, metadata, conversation_id, chat,
                                           route)
        return
    answer = _Answer(state, request, body, context, items, metadata, conversation_id, store, background)
    await answer_routed(state, request, route, lambda model: answer.on_pool(dataclasses.replace(chat, model=model)),
                        lambda target: answer.on_provider(chat, target, route.name), len(orjson.dumps(chat.messages)))


@dataclasses.dataclass(slots=True)
class _Answer:
    """A create request's answer by whichever target a route gives it (the fleet's pool, or a hosted provider):
    the same response shape, keeper and store for both, so a conversation moves between them mid-chain."""

    state: GatewayState
    request: Request
    body: dict[str, Any]
    context: Context
    items: "list[dict[str, Any]]"
    metadata: dict[str, str]
    conversation_id: str | None
    store: bool
    background: bool

    async def on_provider(self, chat: Any, target: Any, model: str) -> None:
        body = self.body
        _refuse_provider_logprobs(body, target, model)
        shape = ResponseShape(new_id("resp"), target.model, body, self.metadata, body.get("previous_response_id"),
                              self.store, self.conversation_id, False, None, chat.stream, None)
        keep = keeper(self.state, self.request, shape, self.items, self.context, self.conversation_id, self.store, None)

        async def finish() -> bytes:
            return shape.terminal_event(await keep(shape.final))

        await answer_provider(self.state, self.request, chat, target, model, shape, keep=keep, finish=finish)

    async def on_pool(self, chat: Any) -> None:
        await _create_on_pool(self.state, self.request, self.body, self.context, self.items, self.metadata,
                              self.conversation_id, self.store, self.background, chat)


def _refuse_provider_logprobs(body: dict[str, Any], target: Any, model: str) -> None:
    if INCLUDE_LOGPROBS in included(body):
        raise BadRequest(f"the model '{model}' (target {target.name}) does not give logprobs here",
                         param="include", code="unsupported_feature")


def _background_expiry_s(state: GatewayState) -> float:
    """When a background response must be over by (queue wait, then the generation's own timeout; a minute more
    for the last write): past it, readers know the node running it stopped."""
    admission = state.config.admission
    return time.time() + admission.queue_timeout_s + (admission.request_timeout_s or 86_400.0) + 60.0


async def _create_routed_in_background(state: GatewayState, request: Request, body: dict[str, Any],
                                       context: Context, items: "list[dict[str, Any]]", metadata: dict[str, str],
                                       conversation_id: str | None, chat: Any, route: Any) -> None:
    """A background response of a routed model: queued and stored at once, like any; its target chosen when it
    runs (the route's order, cooldowns, quotas and overflow as they are then), with fallbacks as for a client's
    request until its answer begins. It names the route until a target answers, then the target's model."""
    shape = ResponseShape(new_id("resp"), route.name, body, metadata, body.get("previous_response_id"), True,
                          conversation_id, True, None, chat.stream, _stream_log(state) if chat.stream else None)
    keep = keeper(state, request, shape, items, context, conversation_id, True, _background_expiry_s(state))

    async def answer(run: BackgroundRun) -> dict[str, Any]:
        out = BackgroundRequest(request)
        finals: list[dict[str, Any]] = []

        async def on_pool(model: str) -> None:
            pooled = dataclasses.replace(chat, model=model)
            plan, tokenizer, output = await _pool_plan(state, out, pooled)
            shape.base["model"] = plan.model
            shape.logprobs = logprob_shape(plan, tokenizer, chat=True)
            async with rate_limited_generation(state, out, plan):
                finals.append(await background_answer(state, out, plan, tokenizer, shape, output, keep, run))

        async def on_provider(target: Any) -> None:
            _refuse_provider_logprobs(body, target, route.name)
            rendered = ProviderInBackground(shape, keep, run)
            await rendered.begin(target.model)
            await answer_provider(state, out, chat, target, route.name, rendered, keep=rendered.keep_whole,
                                  finish=rendered.terminal)
            finals.append(rendered.result())

        try:
            await answer_routed(state, out, route, on_pool, on_provider, len(orjson.dumps(chat.messages)))
        except Exception as e:  # every target failed, or the request was refused: the response failed
            return failed_response(shape, e)
        return finals[-1]

    await start_in_background(state, request, shape, keep, chat.stream, contextlib.AsyncExitStack(), answer)


async def _pool_plan(state: GatewayState, request: Any, chat: Any) -> "tuple[Any, Any, ChatOutput | None]":
    """The generation that answers ``chat`` on the fleet's workers serving its model: the plan, the model's
    tokenizer and the output's parsers (None: plain text)."""
    prompt = await chat_prompt(state, request, chat, "Responses API")
    entry, tokenizer = prompt.entry, prompt.tokenizer
    plan = plan_generation(state, request, entry, prompt.ids, chat.sampling, chat.stream, "input", prompt.media,
                           prompt.routing_ids)
    plan.answer_bytes_max = state.config.answer_bytes_max  # streamed too: the whole response is kept to be stored
    output = ChatOutput.for_request(entry, chat)
    if output is not None:
        plan.kept_special = output.kept_special
    return plan, tokenizer, output


async def _create_on_pool(state: GatewayState, request: Request, body: dict[str, Any], context: Context,
                          items: "list[dict[str, Any]]", metadata: dict[str, str], conversation_id: str | None,
                          store: bool, background: bool, chat: Any) -> None:
    """A create request answered by the fleet's workers serving ``chat.model``."""
    plan, tokenizer, output = await _pool_plan(state, request, chat)
    shape = ResponseShape(new_id("resp"), plan.model, body, metadata, body.get("previous_response_id"), store,
                          conversation_id, background, logprob_shape(plan, tokenizer, chat=True), chat.stream,
                          _stream_log(state) if background and chat.stream else None)
    keep = keeper(state, request, shape, items, context, conversation_id, store,
                  _background_expiry_s(state) if background else None)
    if background:
        limits = contextlib.AsyncExitStack()
        await limits.enter_async_context(rate_limited_generation(state, request, plan))
        await start_in_background(state, request, shape, keep, chat.stream, limits, lambda run: background_answer(
            state, request, plan, tokenizer, shape, output, keep, run))
        return

    async def finish() -> bytes:
        return shape.terminal_event(await keep(shape.final))

    await answer_chat(state, request, plan, tokenizer, output, shape, keep=keep, finish=finish)


async def _create_with_tools(state: GatewayState, request: Request, body: dict[str, Any], context: Context,
                             items: "list[dict[str, Any]]", metadata: dict[str, str], conversation_id: str | None,
                             store: bool, background: bool) -> None:
    """A response whose tools the node runs (MCP): the request checked before anything is answered (its model, its
    servers: a 4xx), then the loop, streamed, whole or in the background."""
    stream = field(body, "stream", bool, False)
    if INCLUDE_LOGPROBS in included(body):
        raise BadRequest("logprobs are not given with MCP tools", param="include", code="unsupported_parameter")
    entry = await ready_model_entry(state, field(body, "model", str), request.principal)
    servers = await responses_servers(state, request, body.get("tools") or [])
    shape = ResponseShape(new_id("resp"), entry.name, body, metadata, body.get("previous_response_id"), store,
                          conversation_id, background, streamed=stream,
                          log=_stream_log(state) if background and stream else None)
    loop = ToolLoop(state, request, body, context.items, shape, to_chat_request, stream, servers)
    mcp = state.mcp.config
    keep = keeper(state, request, shape, items, context, conversation_id, store,
                   time.time() + mcp.response_time_max_s + 60.0 if background else None)
    if background:
        async def answer(run: BackgroundRun) -> dict[str, Any]:
            return await background_loop(state, loop, shape, keep, run)
        await start_in_background(state, request, shape, keep, stream, contextlib.AsyncExitStack(), answer)
        return
    async with request.cancel_on_disconnect():
        if not stream:
            final = await loop.run(no_emit)
            await keep(final)
            await request.send_json(200, final)
            return
        await request.start_stream(200, SSE_HEADERS)
        await request.send_chunk(shape.opening())
        try:
            final = await loop.run(request.send_chunk)  # shape.final
            end = shape.terminal_event(await keep(final))
        except Exception as e:
            error = to_api_error(e)
            if error is None:
                raise
            end = shape.error_event(error)
        await request.end_stream(end)


async def cancel(state: GatewayState, request: Request) -> None:
    entry = await _stored(state, request)
    response = entry.response
    if not response.get("background"):
        raise BadRequest("only a background response can be cancelled", param="response_id", code="invalid_value")
    if response["status"] in ("queued", "in_progress"):
        response = {**response, "status": "cancelled"}
        async with counted_write(state, request):
            await state.history.put_response(dataclasses.replace(entry, response=response))
        await state.background.cancel(entry.id, request.owner)  # stopped where it runs, on any node
    elif response["status"] != "cancelled":
        raise BadRequest(f"the response is {response['status']}: it cannot be cancelled", param="response_id",
                         code="invalid_value")
    await request.send_json(200, response)


async def _stored(state: GatewayState, request: Request) -> StoredResponse:
    response_id = request.path_params["response_id"]
    store = state.history
    entry = await store.get_response(response_id, request.owner) if store is not None else None
    if entry is None:
        raise NotFound(f"Response with id '{response_id}' not found.", param="response_id", code="not_found")
    return _abandoned(entry)


def _abandoned(entry: StoredResponse) -> StoredResponse:
    """The record as readers see it: a background response unfinished past its bound (the node generating
    it stopped) is shown failed; anything else as it is."""
    response = entry.response
    if entry.unfinished_until_s is None or response.get("status") not in ("queued", "in_progress") \
            or time.time() <= entry.unfinished_until_s:
        return entry
    failed = {**response, "status": "failed", "error": {
        "code": "server_error", "message": "the node generating this background response stopped before it finished"}}
    return dataclasses.replace(entry, response=failed)


async def retrieve(state: GatewayState, request: Request) -> None:
    query = request.query()
    stream = query.get("stream", "false").lower()
    if stream not in ("true", "false"):
        raise BadRequest(f"Invalid value for 'stream': {shown(query['stream'])}; expected true or false",
                         param="stream", code="invalid_value")
    entry = await _stored(state, request)
    if stream == "false":
        await request.send_json(200, entry.response)
        return
    after = starting_after(query)
    if entry.events is None:
        raise BadRequest("only a response created with background and stream set can be streamed again",
                         param="stream", code="invalid_value")
    live = state.background.live_log(entry.id)
    if live is not None:  # generating here: its events as they come
        await follow_log(request, live, after)
        return
    owner, store = request.owner, state.history

    async def read() -> StoredResponse | None:
        record = await store.get_response(entry.id, owner)
        return _abandoned(record) if record is not None else record

    await follow_store(request, read, entry, after)


async def delete(state: GatewayState, request: Request) -> None:
    response_id = request.path_params["response_id"]
    store = state.history
    async with counted_write(state, request):
        deleted = store is not None and await store.delete_response(response_id, request.owner)
    if not deleted:
        raise NotFound(f"Response with id '{response_id}' not found.", param="response_id", code="not_found")
    await state.background.cancel(response_id, request.owner)  # a deleted response generates no more
    await request.send_json(200, {"id": response_id, "object": "response", "deleted": True})


async def list_input_items(state: GatewayState, request: Request) -> None:
    after, limit, descending = list_query(request)
    items = list((await _stored(state, request)).input_items)
    if descending:
        items.reverse()
    ids = [item.get("id") for item in items]
    start = ids.index(after) + 1 if after in ids else 0
    await request.send_json(200, list_page(items[start:start + limit], start + limit < len(items)))

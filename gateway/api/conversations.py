"""OpenAI's Conversations API: a conversation's object and its ordered items, kept by the history backend.

    POST   /v1/conversations                      {items?, metadata?} -> the conversation
    GET    /v1/conversations/{id}                 the conversation
    POST   /v1/conversations/{id}                 {metadata} -> the conversation, updated
    DELETE /v1/conversations/{id}                 {id, object: conversation.deleted, deleted}
    GET    /v1/conversations/{id}/items           ?after, limit (1-100, 20), order (asc|desc, desc)
    POST   /v1/conversations/{id}/items           {items} -> the list of added items
    GET    /v1/conversations/{id}/items/{item}    the item
    DELETE /v1/conversations/{id}/items/{item}    the conversation

Items are the Responses API's input items (messages, function calls and their outputs, reasoning),
checked the same way, with ids given here. A response created with ``conversation`` reads the items
as its history and adds its input and output to them (``responses.py``; the items' checks: ``items.py``). Everything is scoped to
the creator: another tenant or key gets 404, as for an id that never existed.
"""

from __future__ import annotations

import time
from typing import Any

from ..history import ITEMS_PER_ADD_MAX, HistoryStore
from ..base.ids import new_id
from .errors import BadRequest, NotFound
from .http import Request
from .protocol import parse_json_body
from .ratelimits import counted_write
from .items import input_items, list_page, list_query, metadata_of, stored_item
from .state import GatewayState


def _store(state: GatewayState) -> HistoryStore:
    if state.history is None:
        raise BadRequest("this node stores nothing (--history-backend none): conversations are not available",
                         code="storage_disabled")
    return state.history


def _new_items(raw: Any, param: str) -> list[dict[str, Any]]:
    """The items to add, checked as the Responses API's input items, each with a new id."""
    if raw is None or raw == []:
        return []
    if not isinstance(raw, list) or len(raw) > ITEMS_PER_ADD_MAX:
        raise BadRequest(f"'{param}' must be a list of at most {ITEMS_PER_ADD_MAX} items", param=param,
                         code="invalid_value")
    return [stored_item(item, new_id("item")) for item in input_items(raw)]


def _missing(conversation_id: str) -> NotFound:
    return NotFound(f"Conversation with id '{conversation_id}' not found.", param="conversation_id",
                    code="not_found")


def _conversation_id(request: Request) -> str:
    return request.path_params["conversation_id"]


async def create(state: GatewayState, request: Request) -> None:
    store = _store(state)
    body = parse_json_body(await request.body())
    conversation = {"id": new_id("conv"), "object": "conversation", "created_at": int(time.time()),
                    "metadata": metadata_of(body)}
    items = _new_items(body.get("items"), "items")
    async with counted_write(state, request):
        await store.create_conversation(conversation, request.owner, items)
    await request.send_json(200, conversation)


async def retrieve(state: GatewayState, request: Request) -> None:
    conversation_id = _conversation_id(request)
    conversation = await _store(state).get_conversation(conversation_id, request.owner)
    if conversation is None:
        raise _missing(conversation_id)
    await request.send_json(200, conversation)


async def update(state: GatewayState, request: Request) -> None:
    conversation_id = _conversation_id(request)
    store = _store(state)
    body = parse_json_body(await request.body())
    if "metadata" not in body:
        raise BadRequest("'metadata' is required", param="metadata", code="missing_required_parameter")
    metadata = metadata_of(body)
    async with counted_write(state, request):
        conversation = await store.update_conversation(conversation_id, request.owner, metadata)
    if conversation is None:
        raise _missing(conversation_id)
    await request.send_json(200, conversation)


async def delete(state: GatewayState, request: Request) -> None:
    conversation_id = _conversation_id(request)
    async with counted_write(state, request):
        deleted = await _store(state).delete_conversation(conversation_id, request.owner)
    if not deleted:
        raise _missing(conversation_id)
    await request.send_json(200, {"id": conversation_id, "object": "conversation.deleted", "deleted": True})


async def list_items(state: GatewayState, request: Request) -> None:
    conversation_id = _conversation_id(request)
    after, limit, descending = list_query(request)
    page = await _store(state).list_items(conversation_id, request.owner, after, limit, descending)
    if page is None:
        raise _missing(conversation_id)
    await request.send_json(200, list_page(page.items, page.has_more))


async def add_items(state: GatewayState, request: Request) -> None:
    conversation_id = _conversation_id(request)
    store = _store(state)
    body = parse_json_body(await request.body())
    items = _new_items(body.get("items"), "items")
    if not items:
        raise BadRequest("'items' must hold at least one item", param="items", code="invalid_value")
    async with counted_write(state, request):
        added = await store.add_items(conversation_id, request.owner, items)
    if not added:
        raise _missing(conversation_id)
    await request.send_json(200, list_page(items, False))


async def retrieve_item(state: GatewayState, request: Request) -> None:
    conversation_id, item_id = _conversation_id(request), request.path_params["item_id"]
    found, item = await _store(state).get_item(conversation_id, request.owner, item_id)
    if not found:
        raise _missing(conversation_id)
    if item is None:
        raise NotFound(f"Item with id '{item_id}' not found.", param="item_id", code="not_found")
    await request.send_json(200, item)


async def delete_item(state: GatewayState, request: Request) -> None:
    conversation_id, item_id = _conversation_id(request), request.path_params["item_id"]
    async with counted_write(state, request):
        conversation, deleted = await _store(state).delete_item(conversation_id, request.owner, item_id)
    if conversation is None:
        raise _missing(conversation_id)
    if not deleted:
        raise NotFound(f"Item with id '{item_id}' not found.", param="item_id", code="not_found")
    await request.send_json(200, conversation)

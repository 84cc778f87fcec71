"""What a response continues and what it stores: the previous response's chain or the conversation's items
before its input (``Context``), read from the history store scoped to the caller; and the keeper that stores each
state of a response before the client hears of it (``keeper``)."""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import orjson
import trio

from ...history import CHAIN_LENGTH_MAX, ID_CHARS_MAX, HistoryStore, StoredResponse
from ..errors import BadRequest, NotFound, shown
from ..http import Request
from ..state import GatewayState
from .shape import ResponseShape


def history_store(state: GatewayState, param: str) -> HistoryStore:
    if state.history is None:
        raise BadRequest(f"this node stores nothing (--history-backend none): '{param}' cannot be used",
                         param=param, code="storage_disabled")
    return state.history


def conversation_id_of(body: dict[str, Any]) -> str | None:
    raw = body.get("conversation")
    if raw is None:
        return None
    conversation_id = raw.get("id") if isinstance(raw, dict) else raw
    if not isinstance(conversation_id, str) or not conversation_id:
        raise BadRequest(f"'conversation' must be a conversation id or {{\"id\": ...}}, got {shown(raw)}",
                         param="conversation", code="invalid_type")
    if body.get("previous_response_id") is not None:
        raise BadRequest("'conversation' and 'previous_response_id' cannot be used together",
                         param="conversation", code="invalid_value")
    return conversation_id


@dataclasses.dataclass(slots=True)  # not frozen: made for every request (see gateway/serving/generation.py)
class Context:
    """What the model sees before this request's input, and what the new response stores to give it on."""

    items: "Sequence[dict[str, Any]]"
    chain: tuple[str, ...] = ()  # the new response's ancestors (previous_response_id's chain and itself)


NO_CONTEXT = Context(())  # a request that continues nothing (most): immutable, so one serves them all


# Ancestors of a chain read at once: a long chain is read in a few round trips, not one per turn.
CHAIN_READS_AT_ONCE = 16


async def context_of(state: GatewayState, body: dict[str, Any], owner: str, conversation_id: str | None) -> Context:
    """The previous response's chain as its model saw it, plus its last turn; or the conversation's items."""
    previous_id = body.get("previous_response_id")
    if previous_id is not None:
        store = history_store(state, "previous_response_id")
        previous = await store.get_response(previous_id, owner) if isinstance(previous_id, str) and \
            len(previous_id) <= ID_CHARS_MAX else None
        if previous is None:  # OpenAI's answer: a bad parameter (400), not a missing resource (404)
            raise BadRequest(f"Previous response with id {shown(previous_id)} not found.",
                             param="previous_response_id", code="previous_response_not_found")
        chain = (*(previous.chain or ()), previous.id)
        if len(chain) > CHAIN_LENGTH_MAX:
            raise BadRequest(f"the chain of previous responses is {CHAIN_LENGTH_MAX} long already: start a new "
                             "one, or use a conversation", param="previous_response_id", code="chain_too_long")
        return Context(await _chain_items(store, previous, owner), chain)
    if conversation_id is not None:
        store = history_store(state, "conversation")
        items = await store.all_items(conversation_id, owner) if len(conversation_id) <= ID_CHARS_MAX else None
        if items is None:
            raise NotFound(f"Conversation with id '{conversation_id}' not found.", param="conversation",
                           code="conversation_not_found")
        return Context(items)
    return NO_CONTEXT


async def _chain_items(store: HistoryStore, last: StoredResponse, owner: str) -> list[dict[str, Any]]:
    """Every turn of ``last``'s chain, oldest first, each response read once. An ancestor that is gone (deleted,
    expired) cuts the chain there: the context starts after it, as coherent turns. The chain's first response,
    when made in a conversation, brings the conversation's items that came before it."""
    ancestors: list[StoredResponse | None] = [None] * len(last.chain or ())
    limiter = trio.CapacityLimiter(CHAIN_READS_AT_ONCE)

    async def read(index: int, response_id: str) -> None:
        async with limiter:
            ancestors[index] = await store.get_response(response_id, owner)

    async with trio.open_nursery() as nursery:
        for index, response_id in enumerate(last.chain or ()):
            nursery.start_soon(read, index, response_id)
    present: list[StoredResponse] = [last]
    for record in reversed(ancestors):
        if record is None:
            break
        present.append(record)
    present.reverse()
    root = present[0]
    items = await _conversation_before(store, root, owner) if len(present) > len(ancestors) else []
    for record in present:
        items += record.turn()
    return items


async def _conversation_before(store: HistoryStore, root: StoredResponse, owner: str) -> list[dict[str, Any]]:
    """The items a response made in a conversation saw before its input: the conversation's, up to its first
    input item (they were added together). Read now: items deleted from the conversation since are gone."""
    conversation = root.response.get("conversation")
    if root.chain is None or not isinstance(conversation, dict) or not root.input_items:
        return []
    items = await store.all_items(conversation.get("id", ""), owner)
    first = root.input_items[0].get("id")
    ids = [item.get("id") for item in items or ()]
    return items[:ids.index(first)] if first in ids else []


def keeper(state: GatewayState, request: Request, shape: ResponseShape, items: "list[dict[str, Any]]",
            context: Context, conversation_id: str | None, store: bool, unfinished_until_s: float | None
            ) -> Callable[..., Awaitable[None]]:
    owner = request.owner

    async def keep(response: dict[str, Any], final: bool = True) -> bytes | None:
        """Stored before the client hears of it: a follow-up sent at once, to any node, finds it. A final
        answer's items join its conversation; a background response's earlier states are stored alone.
        ``store: false`` keeps nothing, not even in the conversation (OpenAI's rule): the model saw the
        conversation, the conversation does not see this turn. Returns the response as the JSON stored, for
        a caller sending it (encoded once), or None when nothing was stored."""
        if state.history is None or not store:
            return None
        # This turn and the chain's ids: what came before is stored once, in the ancestors.
        response_json = orjson.dumps(response)
        record = StoredResponse(shape.id, owner, response, tuple(items), (), unfinished_until_s, context.chain,
                                shape.log.stored_events() if shape.log is not None else None, response_json)
        joins_conversation = final and conversation_id is not None
        if not joins_conversation and state.history.put_response_at_once(record):
            return response_json
        with trio.CancelScope(shield=True):  # bounded by the store's own timeouts; a half-kept turn helps nobody
            if joins_conversation and not await state.history.add_items(conversation_id, owner,
                                                                         [*items, *shape.output]):
                raise NotFound(f"Conversation with id '{conversation_id}' not found.", param="conversation",
                               code="conversation_not_found")
            await state.history.put_response(record)
        return response_json

    return keep

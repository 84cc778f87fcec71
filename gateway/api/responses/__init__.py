"""OpenAI's Responses API on the serving pipeline: POST /v1/responses, GET and DELETE /v1/responses/{id},
POST /v1/responses/{id}/cancel, GET /v1/responses/{id}/input_items.

    endpoints.py    the handlers, in the order a request takes them
    translate.py    the request as the chat request it means (``to_chat_request``), items as chat messages
    chain.py        what it continues (previous_response_id's chain, a conversation's items) and the keeper that
                    stores each state before the client hears of it
    shape.py        the response object, its items and its stream's events (``ResponseShape``, the renderer)
    events.py       the one place an event is made (``EventStream.emit``: numbered, logged, in the grammar's order)
    tools.py        the tool loop of tools the node runs (MCP): lists, approvals, calls, steps
    background.py   ``background: true``: queued, run by the pipeline with no client, stored as it goes
    stream_log.py   a background stream's events, kept for a client that follows it or resumes it on any node

A request is translated into the chat request it means, with the chat path's field checks, so the template,
tools, constraints, parsers and bounds are the chat path's:

    input (a string, or items)          messages; function_call -> an assistant message's tool_calls;
                                        function_call_output -> a tool message; reasoning -> the next
                                        assistant message's reasoning_content; developer -> system
    instructions                        a system message first (not carried to a follow-up)
    previous_response_id                the stored conversation (input and output) before this input
    tools [{type: function, name, ..}]  function tools; tool_choice, parallel_tool_calls
    reasoning.effort                    the reasoning effort (the chat template's switches)
    text.format                         the engine's constraint (json_schema's fields flat, as the API has them)
    max_output_tokens, temperature, top_p, metadata, store (default true), stream

Stored responses are scoped to their creator and kept by the history backend (``gateway/history``): with the
default memory backend, on three nodes of the cluster, so a follow-up works on any node. ``conversation`` (an id
from /v1/conversations) gives the model the conversation's items before the input, and adds the input and output
items to it (``store: false`` stores nothing: neither the response nor the conversation's new items).
``background: true`` answers at once with the response queued and generates on this node, storing each state;
POST /v1/responses/{id}/cancel works from any node. With ``stream: true`` too, the client follows the stream
(response.created and response.queued, both queued, then response.in_progress ...), and a client that dropped
resumes it on any node with GET /v1/responses/{id}?stream=true&starting_after=N. An unknown
``previous_response_id`` is a 400 (OpenAI's), a completed response has its ``completed_at``.
"""

from .endpoints import cancel, create, delete, list_input_items, retrieve
from .shape import ResponseShape
from .translate import chat_messages, to_chat_request

__all__ = ["ResponseShape", "cancel", "chat_messages", "create", "delete", "list_input_items", "retrieve",
           "to_chat_request"]

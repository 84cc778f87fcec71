"""The Responses API's items as clients send and list them: shared by the Responses and Conversations APIs.

An input item is a ``message`` (role user, assistant, system or developer; content a string or text
parts), a ``function_call`` (call_id, name, arguments), a ``function_call_output`` (call_id, output), a
``reasoning`` item, an ``mcp_approval_response``, or an MCP output item sent back; each is checked here with a
400 naming it. Stored and listed, a message's text is
parts with a status (OpenAI's shape), and every item has an id. Lists are pages (``after``, ``limit``,
``order``) in OpenAI's list shape. ``metadata`` is OpenAI's: at most 16 keys of 64 characters, string
values of 512.
"""

from __future__ import annotations

from typing import Any

from ..history import ID_CHARS_MAX, LIST_LIMIT_MAX
from ..base.ids import new_id
from .errors import BadRequest, shown, type_name
from .http import Request
from .protocol import IMAGE_DETAILS, ImageRef, image_part, template_content, text_part

METADATA_KEYS_MAX = 16  # OpenAI's bounds for metadata
METADATA_KEY_CHARS_MAX = 64
METADATA_VALUE_CHARS_MAX = 512
LIST_PAGE_DEFAULT = 20  # items per page of a list endpoint, as OpenAI's
INPUT_ROLES = ("user", "assistant", "system", "developer")


def content_text(content: Any, where: str) -> str:
    """A message's content as text: a string, or text parts joined (an image part is refused here)."""
    content = message_content(content, where, None)
    if not isinstance(content, str):
        raise BadRequest(f"{where}: only text parts are supported here", param=where, code="unsupported_content")
    return content


def message_content(content: Any, where: str, images: "list[ImageRef] | None"
                    ) -> "str | list[dict[str, Any]]":
    """A message's content for the chat template: a string, text parts joined, or (with ``input_image`` parts)
    the parts in order, each image a ``{"type": "image"}`` part and the image itself into ``images``
    (``images`` None: checked only, as input items are when they are stored)."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise BadRequest(f"{where} must be a string or a list of parts, got {type_name(content)}", param=where,
                         code="invalid_type")
    parts: list[dict[str, Any]] = []
    for i, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in ("input_text", "output_text", "text") and isinstance(part.get("text"), str):
            parts.append(text_part(part["text"]))
        elif kind == "input_image":
            parts.append(image_part(_input_image(part, f"{where}[{i}]"), f"{where}[{i}]",
                                    images if images is not None else []))
        else:
            raise BadRequest(f"{where}[{i}]: only text and input_image parts are supported, got {kind!r}",
                             param=where, code="unsupported_content")
    return template_content(parts)


def _input_image(part: dict[str, Any], where: str) -> "tuple[str, str]":
    if part.get("file_id") is not None:
        raise BadRequest(f"{where}: images by file_id are not supported here (there is no Files API): send the "
                         "image_url, a URL or a data:image/...;base64 URI", param=where, code="unsupported_value")
    url = part.get("image_url")
    if not isinstance(url, str) or not url:
        raise BadRequest(f"{where}: an input_image needs an image_url", param=where, code="invalid_value")
    detail = part.get("detail", "auto")
    if detail not in IMAGE_DETAILS:
        raise BadRequest(f"{where}: detail must be one of {', '.join(IMAGE_DETAILS)}", param=where,
                         code="invalid_value")
    return url, detail


def input_items(raw: Any) -> list[dict[str, Any]]:
    """The request's input as items (a string is one user message), each checked and given its ``type`` (a
    message may leave it out)."""
    if isinstance(raw, str):
        return [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": raw}]}]
    if not isinstance(raw, list) or not raw:
        raise BadRequest(f"'input' must be a string or a non-empty list of items, got {type_name(raw)}"
                         f"{' (empty)' if raw == [] else ''}", param="input", code="invalid_type")
    items = []
    for i, item in enumerate(raw):
        if not isinstance(item, dict):
            raise BadRequest(f"input[{i}] must be an object, got {type_name(item)}", param=f"input[{i}]",
                             code="invalid_type")
        kind = item.get("type", "message")
        if kind == "message":
            if item.get("role") not in INPUT_ROLES:
                raise BadRequest(f"Invalid value for input[{i}].role: {shown(item.get('role'))}. Supported values are: "
                                 f"{', '.join(map(repr, INPUT_ROLES))}.", param=f"input[{i}].role",
                                 code="invalid_value")
            content = item.get("content")
            if not isinstance(content, str):  # a string needs no check (the usual message: no path made for it)
                message_content(content, f"input[{i}].content", None)
            if "type" not in item:
                item["type"] = kind  # in place: the request's own parsed JSON, read by nothing else as sent
            items.append(item)
            continue
        where = f"input[{i}]"
        if kind == "function_call":
            if not all(isinstance(item.get(k), str) for k in ("call_id", "name", "arguments")):
                raise BadRequest(f"{where}: a function_call needs call_id, name and arguments", param=where,
                                 code="invalid_value")
        elif kind == "function_call_output":
            if not isinstance(item.get("call_id"), str) or not isinstance(item.get("output"), str):
                raise BadRequest(f"{where}: a function_call_output needs call_id and output", param=where,
                                 code="invalid_value")
        elif kind in MCP_ITEMS:
            _check_mcp_item(item, kind, where)
        elif kind != "reasoning":
            raise BadRequest(f"{where}: items of type {shown(kind)} are not supported", param=where,
                             code="unsupported_content")
        if "type" not in item:
            item["type"] = kind
        items.append(item)
    return items


# MCP items (api/responses/tools.py): an approval a client answers, and the output items a client without stored
# responses sends back as they came (the call with its output, the list, the approval asked).
MCP_ITEMS = ("mcp_approval_response", "mcp_call", "mcp_list_tools", "mcp_approval_request")


def _check_mcp_item(item: dict[str, Any], kind: str, where: str) -> None:
    if kind == "mcp_approval_response":
        ok = isinstance(item.get("approval_request_id"), str) and isinstance(item.get("approve"), bool) and \
            (item.get("reason") is None or isinstance(item.get("reason"), str))
        needs = "approval_request_id and approve (a boolean)"
    elif kind == "mcp_list_tools":
        ok = isinstance(item.get("server_label"), str) and isinstance(item.get("tools"), list)
        needs = "server_label and tools"
    else:
        ok = all(isinstance(item.get(k), str) for k in ("id", "server_label", "name", "arguments")) and \
            (kind != "mcp_call" or item.get("output") is None or isinstance(item.get("output"), str))
        needs = "id, server_label, name and arguments"
    if not ok:
        raise BadRequest(f"{where}: an {kind} item needs {needs}", param=where, code="invalid_value")


def stored_item(item: dict[str, Any], item_id: str) -> dict[str, Any]:
    """An input item as it is stored and listed, under ``item_id``: a message's text as parts, with a status
    (OpenAI's shape)."""
    if item["type"] == "message":
        content = item["content"]
        if isinstance(content, str):
            content = [{"type": "output_text" if item["role"] == "assistant" else "input_text", "text": content}]
        return {"id": item_id, "type": "message", "status": item.get("status", "completed"), "role": item["role"],
                "content": content}
    return item if item.get("id") == item_id else {**item, "id": item_id}


def with_ids(items: "list[dict[str, Any]]", fresh: bool = False) -> list[dict[str, Any]]:
    """Items as stored, each with an id: its own unless ``fresh`` (a new one for every item) or it has none."""
    stored = []
    for item in items:  # a loop, not a comprehension: most inputs are an item or two, and a comprehension is a call
        stored.append(stored_item(item, item["id"] if not fresh and "id" in item else new_id("item")))
    return stored


def metadata_of(body: dict[str, Any]) -> dict[str, str]:
    metadata = body.get("metadata")
    if metadata is None:
        return {}
    if not isinstance(metadata, dict) or len(metadata) > METADATA_KEYS_MAX or not all(
            isinstance(k, str) and len(k) <= METADATA_KEY_CHARS_MAX and isinstance(v, str)
            and len(v) <= METADATA_VALUE_CHARS_MAX for k, v in metadata.items()):
        raise BadRequest(f"'metadata' must map at most {METADATA_KEYS_MAX} keys ({METADATA_KEY_CHARS_MAX} chars) to "
                         f"strings ({METADATA_VALUE_CHARS_MAX} chars)", param="metadata", code="invalid_value")
    return metadata


def list_query(request: Request) -> tuple[str | None, int, bool]:
    """A list endpoint's ``after``, ``limit`` (1-100, 20) and ``order`` (asc or desc, desc: OpenAI's)."""
    query = request.query()
    after = query.get("after") or None
    if after is not None and len(after) > ID_CHARS_MAX:
        raise BadRequest("'after' is not an item id", param="after", code="invalid_value")
    try:
        limit = int(query.get("limit", LIST_PAGE_DEFAULT))
    except ValueError:
        limit = 0
    if not 1 <= limit <= LIST_LIMIT_MAX:
        raise BadRequest(f"'limit' must be an integer from 1 to {LIST_LIMIT_MAX}", param="limit",
                         code="invalid_value")
    order = query.get("order", "desc")
    if order not in ("asc", "desc"):
        raise BadRequest("'order' must be asc or desc", param="order", code="invalid_value")
    return after, limit, order == "desc"


def list_page(items: "list[dict[str, Any]]", has_more: bool) -> dict[str, Any]:
    return {"object": "list", "data": items, "first_id": items[0]["id"] if items else None,
            "last_id": items[-1]["id"] if items else None, "has_more": has_more}

"""What Hugging Face ``transformers`` gives chat templates besides the conversation.

Real templates call these (``raise_exception`` to refuse a conversation, ``tojson`` for
tool schemas, ``strftime_now`` for today's date), so both renderers install the same ones.
"""

from __future__ import annotations

import datetime
import json
from typing import Any


class TemplateError(Exception):
    """The template failed on these messages (it raised, or it is broken)."""


def raise_exception(message: str) -> None:
    raise TemplateError(message)


def tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None,
           separators: Any = None, sort_keys: bool = False) -> str:
    # Unlike Jinja2's own tojson: no HTML escaping, non-ASCII kept (as transformers does).
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def strftime_now(fmt: str) -> str:
    return datetime.datetime.now().strftime(fmt)

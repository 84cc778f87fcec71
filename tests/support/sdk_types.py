"""A provider's request held to its own SDK's request types: every key known, every required key there, every value
of the declared type (literals, unions, lists, nested TypedDicts), so a field the gateway misspells, misplaces or
types wrongly fails the test that sent it.

The openai and anthropic SDKs declare their request bodies as TypedDicts (``openai.types.chat
.completion_create_params.CompletionCreateParamsStreaming``, ``anthropic.types.message_create_params
.MessageCreateParamsNonStreaming``); pydantic validates those lazily (an ``Iterable`` is checked only when
consumed) and ignores unknown keys, so this walks the annotations itself. ``problems(value, typ)`` lists what is
wrong, by path; empty when the value is one the SDK would send.
"""

from __future__ import annotations

import collections.abc
import types
import typing
from typing import Any

try:  # the SDKs' own "not given" markers and their Required/NotRequired wrappers
    from typing import NotRequired, Required
except ImportError:  # pragma: no cover
    from typing_extensions import NotRequired, Required  # type: ignore[assignment]

_ANY = (typing.Any, object)


def _is_typeddict(typ: Any) -> bool:
    return isinstance(typ, type) and issubclass(typ, dict) and hasattr(typ, "__annotations__") and \
        hasattr(typ, "__total__")


def _hints(typ: Any) -> dict[str, Any]:
    return typing.get_type_hints(typ, include_extras=True)


def _unwrap(typ: Any) -> Any:
    origin = typing.get_origin(typ)
    while origin in (Required, NotRequired, typing.Annotated):
        typ = typing.get_args(typ)[0]
        origin = typing.get_origin(typ)
    return typ


def problems(value: Any, typ: Any, path: str = "body") -> list[str]:
    typ = _unwrap(typ)
    if typ in _ANY:
        return []
    if typ is None or typ is type(None):
        return [] if value is None else [f"{path}: expected null, got {value!r}"]
    origin = typing.get_origin(typ)
    if origin is typing.Literal:
        allowed = typing.get_args(typ)
        return [] if value in allowed and type(value) in {type(a) for a in allowed} else \
            [f"{path}: {value!r} is not one of {allowed}"]
    if origin in (typing.Union, types.UnionType):
        branches = typing.get_args(typ)
        found = [problems(value, branch, path) for branch in branches]
        if any(not f for f in found):
            return []
        best = min(found, key=len)
        return best if len(found) == 1 else [f"{path}: matches none of {len(branches)} types; nearest: "
                                            f"{'; '.join(best[:3])}"]
    if _is_typeddict(typ):
        if not isinstance(value, dict):
            return [f"{path}: expected an object ({typ.__name__}), got {type(value).__name__}"]
        hints = _hints(typ)
        out = [f"{path}.{key}: not a field of {typ.__name__}" for key in value if key not in hints]
        for key in getattr(typ, "__required_keys__", ()):
            if key not in value:
                out.append(f"{path}.{key}: required by {typ.__name__}")
        for key, item in value.items():
            if key in hints:
                out += problems(item, hints[key], f"{path}.{key}")
        return out
    if origin in (list, collections.abc.Iterable, collections.abc.Sequence, typing.List, tuple) or typ in (list, tuple):
        if not isinstance(value, list):
            return [f"{path}: expected a list, got {type(value).__name__}"]
        args = typing.get_args(typ)
        item_type = args[0] if args else typing.Any
        return [p for i, item in enumerate(value) for p in problems(item, item_type, f"{path}[{i}]")]
    if origin in (dict, collections.abc.Mapping, typing.Dict) or typ is dict:
        if not isinstance(value, dict):
            return [f"{path}: expected an object, got {type(value).__name__}"]
        args = typing.get_args(typ)
        if len(args) == 2:
            return [p for k, v in value.items() for p in problems(v, args[1], f"{path}.{k}")]
        return []
    if typ is bool:
        return [] if isinstance(value, bool) else [f"{path}: expected a boolean, got {value!r}"]
    if typ is int:
        return [] if isinstance(value, int) and not isinstance(value, bool) else [f"{path}: expected an integer, got {value!r}"]
    if typ is float:
        return [] if isinstance(value, (int, float)) and not isinstance(value, bool) else \
            [f"{path}: expected a number, got {value!r}"]
    if typ is str:
        return [] if isinstance(value, str) else [f"{path}: expected a string, got {value!r}"]
    if isinstance(typ, type):
        if typ.__module__.startswith(("openai", "anthropic")) and typ.__name__ in ("NotGiven", "Omit"):
            return [f"{path}: the SDK's 'not given' marker was sent"]
        if hasattr(typ, "model_validate"):  # a pydantic model inside a TypedDict (rare in request types)
            try:
                typ.model_validate(value)
                return []
            except Exception as e:
                return [f"{path}: {e}"]
        if typ in (bytes,):
            return [] if isinstance(value, str) else [f"{path}: expected base64 text, got {type(value).__name__}"]
        return [] if isinstance(value, typ) else [f"{path}: expected {typ.__name__}, got {type(value).__name__}"]
    return []  # a form this walker does not know (a TypeVar): not held against the request

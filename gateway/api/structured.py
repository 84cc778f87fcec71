"""Structured output: what a request asks the engine's constrained decoding to hold its answer to.

One constraint per request, from exactly one of:

    response_format       {"type": "json_object"}, {"type": "json_schema", "json_schema": {"name", "schema",
                          "strict"}}, {"type": "structural_tag", ...} (SGLang's and vLLM's extension)
    regex, guided_regex   a regular expression the whole answer matches
    ebnf, grammar, guided_grammar
                          an EBNF grammar (the engine's dialect: SGLang's and vLLM's xgrammar)
    structural_tag        a structural tag, as an object or its JSON text
    choice, guided_choice one of these strings
    guided_json, json_schema
                          a JSON schema, as an object or its JSON text (``json_schema``: SGLang's native
                          sampling_params)
    tool_choice           "required" (a JSON array of calls to the offered functions) or a named function
                          (its arguments object), see ``tool_call_schema``

Two of them in one request are a 400 that names both: engines take one constraint, and silently
keeping one would answer in a shape the client did not ask for. Sizes are bounded before anything
is sent (a schema's JSON text, its nesting, the number and length of choices). The schema itself is
the engine's to compile: it refuses what it cannot honour, and that refusal is the client's 400.
"""

from __future__ import annotations

import re
from typing import Any

import orjson

from ..engine.grpc_engine import Constraint
from .errors import BadRequest

SPEC_CHARS_MAX = 64 * 1024  # a schema, regex, grammar or structural tag as text
SCHEMA_DEPTH_MAX = 32  # nested objects and arrays in a schema
CHOICES_MAX = 256
CHOICE_CHARS_MAX = 1024
_SCHEMA_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")  # OpenAI's rule for json_schema.name

# Request fields that are a constraint on their own, and what they mean.
_TEXT_FIELDS = {"regex": "regex", "guided_regex": "regex", "ebnf": "grammar", "grammar": "grammar",
                "guided_grammar": "grammar"}
_CHOICE_FIELDS = ("choice", "guided_choice")
_SCHEMA_FIELDS = ("guided_json", "json_schema")
_FIELDS = ("response_format", *_TEXT_FIELDS, "structural_tag", *_CHOICE_FIELDS, *_SCHEMA_FIELDS)


def parse_constraint(body: dict[str, Any]) -> tuple[Constraint | None, str | None]:
    """The request's constraint and the field it came from; (None, None) without one."""
    given = [name for name in _FIELDS if body.get(name) is not None and body.get(name) != {"type": "text"}]
    if not given:
        return None, None
    if len(given) > 1:
        raise BadRequest(f"'{given[0]}' and '{given[1]}' both constrain the output; give only one",
                         param=given[1], code="conflicting_constraints")
    name = given[0]
    value = body[name]
    if name == "response_format":
        return response_format_constraint(value), name
    if name in _TEXT_FIELDS:
        return Constraint(_TEXT_FIELDS[name], _text(value, name)), name
    if name == "structural_tag":
        return Constraint("structural_tag", _json_text(value, name)), name
    if name in _SCHEMA_FIELDS:
        return Constraint("json_schema", _schema_text(value, name)), name
    return Constraint("choice", _choices(value, name)), name


def response_format_constraint(value: Any, param: str = "response_format") -> Constraint | None:
    """OpenAI's ``response_format`` (the Responses API's ``text.format``, flat, arrives in this shape too):
    None for ``text``."""
    if isinstance(value, dict) and value.get("type") == "text":
        return None
    if not isinstance(value, dict) or not isinstance(value.get("type"), str):
        raise BadRequest(f"'{param}' must be an object with a 'type'", param=param, code="invalid_type")
    kind = value["type"]
    if kind == "json_object":
        return Constraint("json_object")
    if kind == "json_schema":
        spec = value.get("json_schema")
        if not isinstance(spec, dict):
            raise BadRequest(f"{param} 'json_schema' needs a 'json_schema' object", param=param,
                             code="invalid_value")
        name = spec.get("name")
        if not isinstance(name, str) or not _SCHEMA_NAME.match(name):
            raise BadRequest(f"{param}.json_schema.name must be 1-64 letters, digits, '_' or '-'",
                             param=f"{param}.json_schema.name", code="invalid_value")
        if "strict" in spec and spec["strict"] is not None and not isinstance(spec["strict"], bool):
            raise BadRequest(f"{param}.json_schema.strict must be a boolean",
                             param=f"{param}.json_schema.strict", code="invalid_type")
        schema = spec.get("schema")
        if schema is None:  # OpenAI: the schema is optional; without one any JSON object will do
            return Constraint("json_object")
        return Constraint("json_schema", _schema_text(schema, f"{param}.json_schema.schema"), name, spec.get("strict"))
    if kind == "structural_tag":
        return Constraint("structural_tag", _json_text(value, param))
    raise BadRequest(f"{param} type must be 'text', 'json_object', 'json_schema' or 'structural_tag', "
                     f"not {kind!r}", param=f"{param}.type", code="invalid_value")


def _text(value: Any, param: str) -> str:
    if not isinstance(value, str) or not value:
        raise BadRequest(f"'{param}' must be a non-empty string", param=param, code="invalid_type")
    if len(value) > SPEC_CHARS_MAX:
        raise BadRequest(f"'{param}' is longer than {SPEC_CHARS_MAX} characters", param=param, code="invalid_value")
    return value


def _json_text(value: Any, param: str) -> str:
    """An object, or its JSON text, as JSON text within the size bound."""
    if isinstance(value, str):
        try:
            value = orjson.loads(value)
        except orjson.JSONDecodeError:
            raise BadRequest(f"'{param}' is not valid JSON", param=param, code="invalid_value") from None
    if not isinstance(value, dict):
        raise BadRequest(f"'{param}' must be a JSON object", param=param, code="invalid_type")
    _check_depth(value, param)
    text = orjson.dumps(value).decode()
    if len(text) > SPEC_CHARS_MAX:
        raise BadRequest(f"'{param}' is larger than {SPEC_CHARS_MAX} characters of JSON", param=param,
                         code="invalid_value")
    return text


def _schema_text(value: Any, param: str) -> str:
    if value is True or value == {}:
        value = {}
    return _json_text(value, param)


def _check_depth(value: Any, param: str) -> None:
    """Refuse nesting deeper than SCHEMA_DEPTH_MAX (iteratively: the check itself must not recurse that far)."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if depth > SCHEMA_DEPTH_MAX:
            raise BadRequest(f"'{param}' nests deeper than {SCHEMA_DEPTH_MAX} levels", param=param,
                             code="invalid_value")
        if isinstance(item, dict):
            stack.extend((v, depth + 1) for v in item.values() if isinstance(v, (dict, list)))
        elif isinstance(item, list):
            stack.extend((v, depth + 1) for v in item if isinstance(v, (dict, list)))


def _choices(value: Any, param: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not value or not all(isinstance(c, str) for c in value):
        raise BadRequest(f"'{param}' must be a non-empty array of strings", param=param, code="invalid_type")
    if len(value) > CHOICES_MAX:
        raise BadRequest(f"'{param}' has more than {CHOICES_MAX} entries", param=param, code="invalid_value")
    if any(len(c) > CHOICE_CHARS_MAX for c in value):
        raise BadRequest(f"a '{param}' entry is longer than {CHOICE_CHARS_MAX} characters", param=param,
                         code="invalid_value")
    return tuple(value)


def tool_call_schema(tools: "list[dict[str, Any]]", name: str | None, parallel: bool) -> Constraint:
    """The constraint behind ``tool_choice`` required (``name`` None) or a named function.

    Named: the answer is that function's arguments, an object valid against its parameters.
    Required: a JSON array of ``{"name": ..., "parameters": {...}}``, one or more (exactly one when
    ``parallel_tool_calls`` is false), each naming an offered function with its parameters. The
    functions' ``$defs`` move to the array schema's root, where their ``$ref``s point.
    """
    functions = {t["function"]["name"]: t["function"] for t in tools}
    if name is not None:
        schema = functions[name].get("parameters") or {"type": "object"}
        return Constraint("json_schema", _json_text(schema, "tools"))
    defs: dict[str, Any] = {}
    variants = []
    for function_name, function in functions.items():
        parameters = dict(function.get("parameters") or {"type": "object"})
        for key, definition in parameters.pop("$defs", {}).items():
            if key in defs and defs[key] != definition:
                raise BadRequest(f"two tools define '$defs/{key}' differently; tool_choice 'required' needs "
                                 f"one definition per name", param="tools", code="invalid_value")
            defs[key] = definition
        variants.append({"type": "object", "properties": {"name": {"type": "string", "enum": [function_name]},
                                                          "parameters": parameters},
                         "required": ["name", "parameters"]})
    schema: dict[str, Any] = {"type": "array", "minItems": 1, "items": {"anyOf": variants}}
    if not parallel:
        schema["maxItems"] = 1
    if defs:
        schema["$defs"] = defs
    return Constraint("json_schema", _json_text(schema, "tools"))

"""The simulated engine's constrained answers (chaos/sim_engine/constrained.py) are valid: checked with
jsonschema and Python's re over many schemas, patterns and seeds (the seed is in each case's id)."""

from __future__ import annotations

import json
import random
import re

import jsonschema
import pytest

from chaos.sim_engine.constrained import UnsupportedConstraint, constrained_text, regex_example

SCHEMAS = [
    {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer", "minimum": 1,
                                                                           "maximum": 7}},
     "required": ["city", "days"], "additionalProperties": False},
    {"type": "array", "items": {"type": "number"}, "minItems": 2, "maxItems": 3},
    {"type": "object", "properties": {"when": {"type": "string", "format": "date"},
                                      "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "uniqueItems": True},
                                      "id": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{4}$"},
                                      "ok": {"type": "boolean"}, "none": {"type": "null"},
                                      "either": {"anyOf": [{"type": "integer"}, {"const": "x"}]}},
     "required": ["when", "tags", "id", "ok", "none", "either"]},
    {"$defs": {"unit": {"enum": ["c", "f"]}, "point": {"type": "object", "properties": {
        "x": {"type": "integer", "multipleOf": 5, "minimum": 3}, "unit": {"$ref": "#/$defs/unit"}},
        "required": ["x", "unit"]}},
     "type": "array", "minItems": 1, "items": {"$ref": "#/$defs/point"}},
    {"type": "object", "properties": {"name": {"type": "string", "minLength": 12, "maxLength": 14},
                                      "age": {"type": ["integer", "null"], "exclusiveMinimum": 17}},
     "required": ["name", "age"]},
    {"allOf": [{"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]},
               {"properties": {"b": {"type": "string"}}, "required": ["b"]}]},
    {"type": "object", "minProperties": 2, "additionalProperties": {"type": "integer"}},
    {},
]

PATTERNS = [r"[0-9]{3}-[0-9]{4}", r"(yes|no|maybe)", r"\d+\.\d{2}", r"[A-Z][a-z]{2,5} [A-Z][a-z]+",
            r"(ab)+c?\1", r"[^0-9\s]{4}", r"\w+@\w+\.(com|org)", r"^(?:x|y){2,}$", r"a.b*"]


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("index", range(len(SCHEMAS)))
def test_schema_answers_validate(index, seed):
    schema = SCHEMAS[index]
    text = constrained_text("json_schema", json.dumps(schema), seed)
    jsonschema.validate(json.loads(text), schema, format_checker=jsonschema.FormatChecker())


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("pattern", PATTERNS)
def test_regex_answers_match_whole(pattern, seed):
    assert re.fullmatch(pattern, constrained_text("regex", pattern, seed)), f"seed {seed}"


def test_choice_json_object_and_determinism():
    assert {constrained_text("choice", ("red", "green"), s) for s in range(20)} == {"red", "green"}
    assert isinstance(json.loads(constrained_text("json_object", "", 3)), dict)
    assert constrained_text("json_schema", json.dumps(SCHEMAS[0]), 9) == constrained_text(
        "json_schema", json.dumps(SCHEMAS[0]), 9)
    assert regex_example("[a-c]{3}", random.Random(1)) == regex_example("[a-c]{3}", random.Random(1))


@pytest.mark.parametrize("kind, spec", [("grammar", 'root ::= "a"'), ("structural_tag", "{}"),
                                        ("json_schema", "{nope"), ("regex", "(unclosed"),
                                        ("json_schema", json.dumps({"$ref": "#/$defs/missing"})),
                                        ("json_schema", json.dumps({"$defs": {"a": {"$ref": "#/$defs/a"}},
                                                                    "$ref": "#/$defs/a"}))])
def test_what_it_cannot_honour_is_refused(kind, spec):
    with pytest.raises(UnsupportedConstraint):
        constrained_text(kind, spec, 0)

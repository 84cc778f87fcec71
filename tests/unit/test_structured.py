"""Structured output requests (gateway/api/structured.py, protocol.parse_chat): each way of asking becomes
one engine constraint, conflicts and oversized specs are 400s naming the field, and tool_choice required
or named becomes the JSON schema the engine decodes against, which the schema itself accepts and refuses
as it should (checked with jsonschema)."""

from __future__ import annotations

import json

import jsonschema
import pytest

from gateway.api.errors import BadRequest
from gateway.api.protocol import parse_chat, parse_completion, parse_generate
from gateway.api.structured import CHOICES_MAX, SCHEMA_DEPTH_MAX, SPEC_CHARS_MAX, tool_call_schema
from gateway.engine.grpc_engine import Constraint, SamplingOptions
from gateway.engine.runtimes import ENGINE_RUNTIMES as RUNTIMES

OK = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"],
          "additionalProperties": False}
WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}, "unit": {"$ref": "#/$defs/unit"}},
    "required": ["city"], "$defs": {"unit": {"enum": ["c", "f"]}}}}}
TIME = {"type": "function", "function": {"name": "get_time"}}


@pytest.mark.parametrize("extra, constraint", [
    ({"response_format": {"type": "json_object"}}, Constraint("json_object")),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "city", "schema": SCHEMA, "strict": True}}},
     Constraint("json_schema", json.dumps(SCHEMA, separators=(",", ":")), "city", True)),  # name, strict: providers'
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "any"}}}, Constraint("json_object")),
    ({"regex": "[0-9]+"}, Constraint("regex", "[0-9]+")),
    ({"guided_regex": "a|b"}, Constraint("regex", "a|b")),
    ({"ebnf": 'root ::= "yes"'}, Constraint("grammar", 'root ::= "yes"')),
    ({"guided_grammar": 'root ::= "no"'}, Constraint("grammar", 'root ::= "no"')),
    ({"guided_choice": ["yes", "no"]}, Constraint("choice", ("yes", "no"))),
    ({"choice": ["a"]}, Constraint("choice", ("a",))),
    ({"guided_json": json.dumps(SCHEMA)}, Constraint("json_schema", json.dumps(SCHEMA, separators=(",", ":")))),
    ({"structural_tag": {"type": "structural_tag", "structures": [], "triggers": []}},
     Constraint("structural_tag", '{"type":"structural_tag","structures":[],"triggers":[]}')),
    ({"response_format": {"type": "text"}}, None),
])
def test_each_way_of_asking_is_one_constraint(extra, constraint):
    assert parse_chat({**OK, **extra}).sampling.constraint == constraint
    assert parse_completion({"model": "m", "prompt": "p", **extra}).sampling.constraint == constraint


def test_sglang_native_sampling_params_carry_their_constraint():
    gen = parse_generate({"text": "t", "sampling_params": {"json_schema": json.dumps(SCHEMA)}})
    assert gen.sampling.constraint == Constraint("json_schema", json.dumps(SCHEMA, separators=(",", ":")))


DEEP = {"type": "object", "properties": {}}
_inner = DEEP
for _ in range(SCHEMA_DEPTH_MAX):
    _inner["properties"]["x"] = {"type": "object", "properties": {}}
    _inner = _inner["properties"]["x"]


@pytest.mark.parametrize("extra, param, code", [
    ({"response_format": {"type": "json_object"}, "regex": "a"}, "regex", "conflicting_constraints"),
    ({"guided_choice": ["a"], "guided_json": SCHEMA}, "guided_json", "conflicting_constraints"),
    ({"tools": [WEATHER], "tool_choice": "required", "response_format": {"type": "json_object"}}, "response_format",
     "conflicting_constraints"),
    ({"response_format": "json"}, "response_format", "invalid_type"),
    ({"response_format": {"type": "json_schema"}}, "response_format", "invalid_value"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "has space", "schema": SCHEMA}}},
     "response_format.json_schema.name", "invalid_value"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "n", "schema": [1]}}},
     "response_format.json_schema.schema", "invalid_type"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "n", "schema": DEEP}}},
     "response_format.json_schema.schema", "invalid_value"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "n", "schema": {
        "enum": ["x" * 1000] * (SPEC_CHARS_MAX // 1000 + 1)}}}}, "response_format.json_schema.schema", "invalid_value"),
    ({"regex": ""}, "regex", "invalid_type"),
    ({"regex": "a" * (SPEC_CHARS_MAX + 1)}, "regex", "invalid_value"),
    ({"guided_choice": []}, "guided_choice", "invalid_type"),
    ({"guided_choice": ["a"] * (CHOICES_MAX + 1)}, "guided_choice", "invalid_value"),
    ({"guided_json": "{not json"}, "guided_json", "invalid_value"),
])
def test_conflicts_and_bad_specs_are_400s_naming_the_field(extra, param, code):
    with pytest.raises(BadRequest) as e:
        parse_chat({**OK, **extra})
    assert (e.value.param, e.value.code) == (param, code), e.value.message


def test_required_tool_choice_is_a_schema_for_an_array_of_offered_calls():
    chat = parse_chat({**OK, "tools": [WEATHER, TIME], "tool_choice": "required"})
    schema = json.loads(chat.sampling.constraint.spec)
    assert chat.sampling.constraint.kind == "json_schema" and chat.sampling.constraint_field == "tool_choice"
    valid = jsonschema.Draft202012Validator(schema)
    assert valid.is_valid([{"name": "get_weather", "parameters": {"city": "Oslo", "unit": "c"}},
                           {"name": "get_time", "parameters": {}}])
    assert not valid.is_valid([])  # required: at least one call
    assert not valid.is_valid([{"name": "get_weather", "parameters": {"unit": "c"}}])  # city missing
    assert not valid.is_valid([{"name": "get_weather", "parameters": {"city": "Oslo", "unit": "k"}}])  # $ref kept
    assert not valid.is_valid([{"name": "delete_all", "parameters": {}}])


def test_no_parallel_calls_means_exactly_one():
    schema = json.loads(tool_call_schema([WEATHER, TIME], None, parallel=False).spec)
    assert not jsonschema.Draft202012Validator(schema).is_valid([{"name": "get_time", "parameters": {}}] * 2)


def test_named_tool_choice_is_the_functions_parameters():
    chat = parse_chat({**OK, "tools": [WEATHER, TIME],
                       "tool_choice": {"type": "function", "function": {"name": "get_weather"}}})
    assert json.loads(chat.sampling.constraint.spec) == WEATHER["function"]["parameters"]
    assert chat.tool_name == "get_weather"
    assert json.loads(tool_call_schema([TIME], "get_time", True).spec) == {"type": "object"}


def test_tools_defining_the_same_name_differently_cannot_be_required():
    other = {"type": "function", "function": {"name": "other", "parameters": {
        "type": "object", "$defs": {"unit": {"enum": ["k"]}}}}}
    with pytest.raises(BadRequest) as e:
        parse_chat({**OK, "tools": [WEATHER, other], "tool_choice": "required"})
    assert e.value.param == "tools"


@pytest.mark.parametrize("constraint, sglang, vllm", [
    (Constraint("json_schema", "{}"), ("json_schema", "{}"), ("json_schema", "{}")),
    (Constraint("json_object"), ("json_schema", '{"type": "object"}'), ("json_object", True)),
    (Constraint("regex", "a+"), ("regex", "a+"), ("regex", "a+")),
    (Constraint("grammar", "g"), ("ebnf_grammar", "g"), ("grammar", "g")),
    (Constraint("structural_tag", "{}"), ("structural_tag", "{}"), ("structural_tag", "{}")),
    (Constraint("choice", ("a.b", "c")), ("regex", r"(a\.b|c)"), ("choice", ("a.b", "c"))),
])
def test_each_runtime_puts_the_constraint_in_its_own_field(constraint, sglang, vllm):
    sampling = SamplingOptions(max_new_tokens=8, constraint=constraint, logit_bias=((7, -100.0),))
    sp = RUNTIMES["sglang"].generate_request("r", [1], sampling, False).sampling_params
    assert sp.WhichOneof("constraint") == sglang[0] and getattr(sp, sglang[0]) == sglang[1]
    assert dict(sp.logit_bias) == {"7": -100.0}
    sp = RUNTIMES["vllm"].generate_request("r", [1], sampling, False).sampling_params
    value = tuple(sp.choice.choices) if vllm[0] == "choice" else getattr(sp, vllm[0])
    assert sp.WhichOneof("constraint") == vllm[0] and value == vllm[1]
    assert dict(sp.logit_bias) == {7: -100.0}

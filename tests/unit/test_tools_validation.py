"""tools, tool_choice, parallel_tool_calls and the legacy functions/function_call (gateway/api/tools.py):
what is accepted, and the 400 (with its field) for everything else, never a silent 200."""

from __future__ import annotations

import pytest

from gateway.api.errors import BadRequest
from gateway.api.tools import NO_TOOLS, TOOLS_MAX, parse_tools

WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "d",
                                            "parameters": {"type": "object", "properties": {}}}}


def test_no_tool_fields_is_no_tools():
    assert parse_tools({"model": "m", "messages": []}) is NO_TOOLS


def test_tools_default_to_auto_and_none_or_auto_are_accepted():
    spec = parse_tools({"tools": [WEATHER]})
    assert spec.tools == [WEATHER] and spec.choice == "auto" and spec.parallel
    assert parse_tools({"tools": [WEATHER], "tool_choice": "none"}).choice == "none"
    assert parse_tools({"tools": [WEATHER], "parallel_tool_calls": False}).parallel is False
    assert parse_tools({"tools": []}).tools is None


def test_required_and_named_choices_are_kept_for_constrained_decoding():
    spec = parse_tools({"tools": [WEATHER], "tool_choice": "required", "parallel_tool_calls": False})
    assert (spec.choice, spec.name, spec.parallel) == ("required", None, False)
    spec = parse_tools({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "get_weather"}}})
    assert (spec.choice, spec.name) == ("named", "get_weather")
    spec = parse_tools({"functions": [WEATHER["function"]], "function_call": {"name": "get_weather"}})
    assert (spec.choice, spec.name) == ("named", "get_weather")


def test_legacy_functions_map_to_tools():
    spec = parse_tools({"functions": [WEATHER["function"]], "function_call": "auto"})
    assert spec.tools == [WEATHER] and spec.choice == "auto"


@pytest.mark.parametrize("body, param, code", [
    ({"tools": {"a": 1}}, "tools", "invalid_type"),
    ({"tools": [{"type": "retrieval"}]}, "tools[0]", "invalid_value"),
    ({"tools": [{"type": "function", "function": {"name": "bad name!"}}]}, "tools[0].function.name", "invalid_value"),
    ({"tools": [WEATHER, WEATHER]}, "tools[1].function.name", "invalid_value"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": "x"}}]}, "tools[0].function.parameters",
     "invalid_type"),
    ({"tools": [WEATHER] * (TOOLS_MAX + 1)}, "tools", "invalid_value"),
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice",
     "invalid_value"),
    ({"tool_choice": "required"}, "tool_choice", "invalid_value"),
    ({"tools": [WEATHER], "tool_choice": "always"}, "tool_choice", "invalid_value"),
    ({"tools": [WEATHER], "parallel_tool_calls": "yes"}, "parallel_tool_calls", "invalid_type"),
    ({"functions": [WEATHER["function"]], "tools": [WEATHER]}, "functions", "invalid_value"),
    ({"functions": "x"}, "functions", "invalid_type"),
])
def test_what_cannot_be_honoured_is_a_400_naming_its_field(body, param, code):
    with pytest.raises(BadRequest) as e:
        parse_tools(body)
    assert e.value.param == param and e.value.code == code, e.value.message

"""POST /parse/function_call and /parse/reasoning on a real node: a parser on a text, admin only."""

from __future__ import annotations

import httpx2

TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}},
         {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}}]


def test_function_calls_are_parsed_out_of_a_text(http):
    text = 'Checking.<tool_call>{"name": "get_time", "arguments": {"tz": "UTC"}}</tool_call>'
    r = http.post("/parse/function_call", json={"text": text, "tool_call_parser": "qwen", "tools": TOOLS})
    assert r.status_code == 200, r.text
    assert r.json() == {"normal_text": "Checking.",
                        "calls": [{"tool_index": 1, "name": "get_time", "parameters": '{"tz": "UTC"}'}]}


def test_reasoning_is_separated(http):
    r = http.post("/parse/reasoning", json={"text": "<think>hmm</think>\n\nHi", "reasoning_parser": "qwen3"})
    assert r.status_code == 200 and r.json() == {"text": "Hi", "reasoning_text": "hmm"}


def test_unknown_parsers_and_bad_fields_are_400s_naming_the_field(http):
    r = http.post("/parse/reasoning", json={"text": "x", "reasoning_parser": "nope"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "reasoning_parser"
    assert "deepseek_r1" in r.json()["error"]["message"]
    r = http.post("/parse/function_call", json={"text": 5, "tool_call_parser": "qwen"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "text"
    r = http.post("/parse/function_call", json={"text": "x", "tool_call_parser": "qwen", "tools": [{"x": 1}]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "tools"


def test_without_the_admin_credential_they_are_refused(node):
    r = httpx2.post(node.url + "/parse/reasoning", json={"text": "x", "reasoning_parser": "qwen3"}, timeout=30)
    assert r.status_code in (401, 403)


def test_the_glm_text_that_blocked_every_request_for_seconds_is_parsed_at_once(http):
    """Issue 33: /parse/function_call with glm45 on 248 KB blocked the node for 9.5 s (a backtracking regex)."""
    import time
    text = "<tool_call>f" + "<arg_key>k</arg_key><arg_value>" * 8_000 + "</tool_call>"
    started = time.monotonic()
    r = http.post("/parse/function_call", json={"text": text, "tool_call_parser": "glm45_moe", "tools": TOOLS})
    assert r.status_code == 200 and r.json()["calls"] == [] and time.monotonic() - started < 2
    r = http.post("/parse/function_call", json={"text": "x" * (1024 * 1024 + 1), "tool_call_parser": "qwen"})
    assert r.status_code in (400, 413)  # over the endpoint's bound (or the body's): refused, not parsed

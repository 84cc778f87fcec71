"""A faster chat-template renderer (MiniJinja, in Rust), used only where it agrees with Jinja2.

Rendering Qwen3's template with Jinja2's sandbox costs ~40-50 us for a one-message chat and
~80-100 us for a four-turn conversation under a long system prompt; MiniJinja (the engine
SMG itself renders templates with) does the same in ~9-11 and ~21-28 us
(tests/bench/render_bench.py; BENCHMARKS.md, sixth pass). MiniJinja is compatible with
Jinja2 by design, not at all costs, so ``FastTemplate.build`` accepts a template only after
rendering a battery of conversations with both engines: plain chats, multi-turn, reasoning,
tool calls and tool results, with and without tools, with and without the generation
prompt, and with ``enable_thinking`` off. Every case must give the same text, or make both
engines fail. Otherwise it raises ``NotEquivalent`` with the first disagreement, and the
template stays on Jinja2.

At request time a MiniJinja success is the answer; any failure is handed back to Jinja2,
whose result or error is the one the client gets (so error messages are Jinja2's, and a
request the battery did not foresee still gets the reference's verdict), except running out
of fuel, below.

What the engine can reach. Templates come from a model's files or ``--chat-template``,
which an operator may not have read. MiniJinja refuses every underscore attribute
(``__class__``, ``__globals__``...), strings and numbers are its own values, and the
context holds only the request's messages, tools and template arguments (JSON values
parsed for this request alone) and the helpers of template_globals.py. Unlike Jinja2's
immutable sandbox it lets a template call public methods of those dicts and lists (``pop``,
``append``): that can change only the request's own copy, which nothing reads after
rendering but Jinja2 when MiniJinja then fails, and a template that does so on any battery
case is refused (Jinja2 raises there). Every render runs on a fuel budget (MiniJinja counts
instructions), so a template cannot hold the event loop with an endless loop; Jinja2 has no
such bound, so running out of fuel is the request's error rather than a reason to try
Jinja2.

What the battery does not prove: that no conversation outside it takes a branch where the
engines differ and both succeed (``none is iterable`` is true in MiniJinja, so a template
testing a field that a request sets to null could print something Jinja2 would not). On
llama.cpp's corpus of ~70 real templates, random conversations the battery never saw render
identically on every template it accepts (tests/unit/test_fast_template.py); weakening the
battery to one case lets that test catch two templates that differ.
"""

from __future__ import annotations

import copy
from typing import Any

from .template_globals import raise_exception, strftime_now, tojson

try:
    import minijinja
except ImportError:  # optional: without it every template renders with Jinja2
    minijinja = None


# Instructions one render may run (TokenizerConfig.chat_template_fuel, --chat-template-fuel).
# Qwen3's template uses ~67 per message. Templates that rescan the conversation for every message
# grow quadratically (in llama.cpp's corpus Solar, Cohere2, Gemma 4, gpt-oss: ~500 per message at
# 100 messages, ~3,000-4,600 at 1,000, ~9,000-13,600 at 3,000), so the default renders ~1,500
# messages on those and the 10,000 the API accepts on Qwen3. An instruction costs ~50-120 ns here:
# a render out of fuel has held the loop for ~0.5-1 s.
FUEL = 10_000_000


class NotEquivalent(Exception):
    """MiniJinja renders the template differently from Jinja2: the reason says where."""


class OutOfFuel(Exception):
    """The template ran more instructions than one render may."""


_TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Current weather of a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "City name"},
                                                    "days": {"type": "integer", "default": 1}},
                   "required": ["city"]}}}]
_TOOL_CALL_DICT = {"id": "call_1", "type": "function",
                   "function": {"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}}
_TOOL_CALL_TEXT = {"id": "call_2", "type": "function",
                   "function": {"name": "get_weather", "arguments": "{\"city\": \"Zürich\"}"}}

# Conversations as the API hands them over (parse_chat: content is always a string,
# "developer" already became "system").
BATTERY: dict[str, list[dict[str, Any]]] = {
    "user": [{"role": "user", "content": "What is 2+2?"}],
    "system": [{"role": "system", "content": "You are terse."},
               {"role": "user", "content": "Héllo ✓ 漢字 \"quotes\" 'single' {{ braces }} and\nnew  lines\n"}],
    "multi-turn": [{"role": "system", "content": "S"}, {"role": "user", "content": "a"},
                   {"role": "assistant", "content": "b"}, {"role": "user", "content": "c"}],
    "reasoning": [{"role": "user", "content": "a"},
                  {"role": "assistant", "content": "<think>\nlet me see\n</think>\n\nb"},
                  {"role": "user", "content": "c"}],
    "tool-calls": [{"role": "system", "content": "Use tools."},
                   {"role": "user", "content": "Weather in Paris and Zürich?"},
                   {"role": "assistant", "content": "", "tool_calls": [_TOOL_CALL_DICT, _TOOL_CALL_TEXT]},
                   {"role": "tool", "tool_call_id": "call_1", "name": "get_weather", "content": "{\"temp\": 21.5}"},
                   {"role": "tool", "tool_call_id": "call_2", "name": "get_weather", "content": "sunny"},
                   {"role": "assistant", "content": "Warm in both."}, {"role": "user", "content": "thanks"}],
    "empty": [{"role": "user", "content": ""}],
    "ends-with-assistant": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "partial"}],
}
# (tools, add_generation_prompt, template arguments) each conversation is rendered with.
VARIANTS: tuple[tuple[Any, bool, dict[str, Any]], ...] = (
    (None, True, {}), (None, False, {}), (_TOOLS, True, {}), (None, True, {"enable_thinking": False}),
)


class FastTemplate:
    """One chat template compiled by MiniJinja, with Jinja2's options and helpers."""

    def __init__(self, source: str, special_tokens: dict[str, str | None], fuel: int | None = None) -> None:
        if minijinja is None:
            raise NotEquivalent("minijinja is not installed")
        # Jinja2 as Hugging Face configures it: trim_blocks, lstrip_blocks, no trailing newline kept;
        # no autoescaping (the template's name has no .html); debug off (it keeps sources for errors).
        env = minijinja.Environment(trim_blocks=True, lstrip_blocks=True, debug=False, pycompat=True,
                                    fuel=FUEL if fuel is None else fuel)
        env.add_filter("tojson", tojson)
        env.add_function("raise_exception", raise_exception)
        env.add_function("strftime_now", strftime_now)
        try:
            env.add_template("chat", source)
        except minijinja.TemplateError as e:
            raise NotEquivalent(f"MiniJinja cannot compile it: {str(e).splitlines()[0]}") from None
        self._env = env
        self._special = special_tokens

    @classmethod
    def build(cls, source: str, special_tokens: dict[str, str | None], reference,
              fuel: int | None = None) -> "FastTemplate":
        """A FastTemplate that renders every battery case as ``reference`` does, or NotEquivalent.

        ``reference(messages, add_generation_prompt=..., tools=..., **kwargs)`` is the Jinja2
        rendering (ChatTemplate's own); each engine renders its own deep copy of each case (a
        template may change what it is given). MiniJinja goes first: a template that runs out of
        fuel on a battery case would hold the loop for as long as it likes under Jinja2, so it is
        kept on MiniJinja (and its requests fail) without asking Jinja2.
        """
        fast = cls(source, special_tokens, fuel)
        for name, messages in BATTERY.items():
            for tools, add_generation_prompt, kwargs in VARIANTS:
                case_args = (add_generation_prompt, kwargs)
                got = _outcome(fast.render, copy.deepcopy(messages), copy.deepcopy(tools), *case_args)
                if got[0] == "out of fuel":
                    return fast
                expected = _outcome(reference, copy.deepcopy(messages), copy.deepcopy(tools), *case_args)
                if expected != got:
                    case = f"{name}, tools={'yes' if tools else 'no'}, add_generation_prompt={add_generation_prompt}"
                    case += f", {kwargs}" if kwargs else ""
                    raise NotEquivalent(f"renders differently from Jinja2 ({case}): {_difference(expected, got)}")
        return fast

    def render(self, messages: "list[dict[str, Any]]", *, add_generation_prompt: bool = True,
               tools: "list[dict[str, Any]] | None" = None, **kwargs: Any) -> str:
        """The prompt; OutOfFuel past the budget; any other exception means "ask Jinja2"."""
        try:
            return self._env.render_template("chat", messages=messages, tools=tools,
                                             add_generation_prompt=add_generation_prompt,
                                             **self._special, **kwargs)
        except minijinja.TemplateError as e:
            if e.kind == "OutOfFuel":
                raise OutOfFuel(f"the chat template ran more than {self._env.fuel:,} instructions") from None
            raise


def _outcome(render, messages, tools, add_generation_prompt: bool, kwargs: dict[str, Any]) -> tuple[str, str]:
    """("ok", text), ("out of fuel", "") or ("error", "") (which error does not matter: Jinja2's is
    always the one the client gets)."""
    try:
        return "ok", render(messages, add_generation_prompt=add_generation_prompt, tools=tools, **kwargs)
    except OutOfFuel:
        return "out of fuel", ""
    except Exception:  # noqa: BLE001 - a failure is an outcome here
        return "error", ""


def _difference(expected: tuple[str, str], got: tuple[str, str]) -> str:
    if expected[0] != got[0]:
        verb = {"ok": "renders"}
        return f"Jinja2 {verb.get(expected[0], 'fails')}, MiniJinja {verb.get(got[0], 'fails')}"
    a, b = expected[1], got[1]
    at = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    return f"at character {at}: Jinja2 {a[at:at + 40]!r}, MiniJinja {b[at:at + 40]!r}"

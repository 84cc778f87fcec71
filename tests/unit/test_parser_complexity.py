"""Parsers are linear (issue 33: the GLM-4.5 parser blocked every request for 9.5 s on a 248 KB text; a 25k-token
answer blocked the node for 0.88 s). Each parser gets adversarial texts built from its own markers (markers
repeated, openings never closed, bodies with every inner marker many times), whole and in small pieces.

Not a timed benchmark: the bound is ~50x what a linear parser takes on the slowest machine we run, and a
quadratic one (what these texts made of the parsers before) takes 20x to 400x more than the bound."""

from __future__ import annotations

import itertools
import time

import pytest

from gateway.parsers import is_harmony
from gateway.parsers.reasoning import REASONING_PARSERS, reasoning_parser
from gateway.parsers.tool_calls import TOOL_CALL_PARSERS, tool_call_parser
from tests.harmony_vocab import harmony_vocabulary

SIZE = 200_000
BOUND_S = 1.5
NAMES = sorted(TOOL_CALL_PARSERS, key=lambda n: (getattr(TOOL_CALL_PARSERS[n], "__name__", n), n))
ONE_PER_FORMAT = [next(group) for _, group in itertools.groupby(
    NAMES, key=lambda n: getattr(TOOL_CALL_PARSERS[n], "__name__", n))]
REASONING_NAMES = sorted(name for name in REASONING_PARSERS if not is_harmony(name)) + ["gpt_oss"]


@pytest.fixture(scope="module", autouse=True)
def harmony_vocab():
    with harmony_vocabulary():
        yield


def _texts(spellings: tuple[str, ...]) -> dict[str, str]:
    start = spellings[0] if spellings else "<tool_call>"
    inner = spellings[2:] or ("{", "```", "<arg_key>", "</arg_key>", "<arg_value>")
    texts = {"plain": "word " * (SIZE // 5), "lt": "<" * SIZE, "braces": "{[" * (SIZE // 2),
             # Bare call lists (pythonic): openings that may become one, openings that are one and never close.
             "brackets": "[" * SIZE, "spaced brackets": ("[" + " " * 200) * (SIZE // 201),
             "named brackets": "[name " * (SIZE // 6), "calls opened": "[f(" * (SIZE // 3),
             "strings opened": "[f(a='])" * (SIZE // 8)}
    for marker in spellings:
        texts[f"repeat {marker!r}"] = marker * (SIZE // len(marker))
    for marker in inner:
        unit = marker + "x"
        texts[f"open then {marker!r}"] = start + "f" + unit * (SIZE // len(unit))
    texts["open then every inner"] = start + "f" + "".join(inner + ("```", "\n", '"')) * (SIZE // 60)
    unclosed = "".join(inner[:-1]) + "x"  # every inner marker but the one that would close the last
    texts["open then every inner but the last"] = start + "f" + unclosed * (SIZE // len(unclosed))
    for first, second in zip(inner, inner[1:]):
        pair = first + "k" + second
        texts[f"open then {first!r}{second!r}"] = start + "f" + pair * (SIZE // len(pair))
    texts["fences"] = start + "\n```json\n" + "```" * (SIZE // 3)
    texts["open body"] = start + "f" + "x" * SIZE  # streamed in small pieces: a body re-scanned per piece
    return texts


def _pieces(label: str) -> int:
    return 4 if label == "open body" else 64


def _timed(run) -> float:
    started = time.perf_counter()
    run()
    return time.perf_counter() - started


def _in_pieces(parser, text: str, label: str) -> None:
    step = _pieces(label)
    for at in range(0, len(text), step):
        parser.feed(text[at:at + step])
    parser.finish()


@pytest.mark.parametrize("name", ONE_PER_FORMAT)
def test_tool_call_parsers_are_linear(name):
    spellings = tool_call_parser(name).spellings
    for label, text in _texts(spellings).items():
        whole = _timed(lambda: tool_call_parser(name).parse(text))
        parser = tool_call_parser(name)
        pieces = _timed(lambda: _in_pieces(parser, text, label))
        assert whole < BOUND_S and pieces < BOUND_S, f"{name} on {label}: whole {whole:.2f} s, in pieces {pieces:.2f} s"


@pytest.mark.parametrize("name", REASONING_NAMES)
def test_reasoning_parsers_are_linear(name):
    parser = reasoning_parser(name)
    for label, text in {**_texts(parser.spellings), "whitespace": " " * SIZE}.items():
        fresh = reasoning_parser(name)
        took = _timed(lambda: _in_pieces(fresh, text, label))
        assert took < BOUND_S, f"{name} on {label}: {took:.2f} s"

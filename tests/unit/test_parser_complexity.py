"""Parsers are linear (issue 33: the GLM-4.5 parser blocked every request for 9.5 s on a 248 KB text; a 25k-token
answer blocked the node for 0.88 s). Each parser gets adversarial texts built from its own markers (markers
repeated, openings never closed, bodies with every inner marker many times), whole and in small pieces.

Not a timed benchmark, and no seconds asserted (an absolute bound failed twice on a loaded machine): linear time is a
ratio. Each text is parsed at a quarter of its size and at its size, alternately, three times each, timed by this
thread's CPU time (a busy machine's waits are not in it); the least time of each size is kept (what noise adds, it
adds to a run, not to the least of three), and the larger must take less than
GROWTH_MAX times the smaller: a linear parser takes ~4x, a quadratic one ~16x (what these texts made of the parsers
before took 20x to 400x more than a linear one at the full size)."""

from __future__ import annotations

import gc
import itertools
import time

import pytest

from gateway.parsers import is_harmony
from gateway.parsers.reasoning import REASONING_PARSERS, reasoning_parser
from gateway.parsers.tool_calls import TOOL_CALL_PARSERS, tool_call_parser
from tests.support.harmony_vocab import harmony_vocabulary

pytestmark = pytest.mark.corpus  # adversarial texts of 200,000 characters, each parser three times at two sizes

SIZE = 200_000
GROWTH_MAX = 8.0  # t(SIZE) / t(SIZE / 4): 4 when linear, 16 when quadratic
# A quarter-size run faster than this is measured as this: timer noise on a few milliseconds must not look like
# growth (a parser that quick at 50,000 characters and quadratic would take seconds at 200,000, and fail anyway).
FLOOR_S = 0.005
NAMES = sorted(TOOL_CALL_PARSERS, key=lambda n: (getattr(TOOL_CALL_PARSERS[n], "__name__", n), n))
ONE_PER_FORMAT = [next(group) for _, group in itertools.groupby(
    NAMES, key=lambda n: getattr(TOOL_CALL_PARSERS[n], "__name__", n))]
REASONING_NAMES = sorted(name for name in REASONING_PARSERS if not is_harmony(name)) + ["gpt_oss"]


@pytest.fixture(scope="module", autouse=True)
def harmony_vocab():
    with harmony_vocabulary():
        yield


def _texts(spellings: tuple[str, ...], size: int = SIZE) -> dict[str, str]:
    start = spellings[0] if spellings else "<tool_call>"
    inner = spellings[2:] or ("{", "```", "<arg_key>", "</arg_key>", "<arg_value>")
    texts = {"plain": "word " * (size // 5), "lt": "<" * size, "braces": "{[" * (size // 2),
             # Bare call lists (pythonic): openings that may become one, openings that are one and never close.
             "brackets": "[" * size, "spaced brackets": ("[" + " " * 200) * (size // 201),
             "named brackets": "[name " * (size // 6), "calls opened": "[f(" * (size // 3),
             "strings opened": "[f(a='])" * (size // 8)}
    for marker in spellings:
        texts[f"repeat {marker!r}"] = marker * (size // len(marker))
    for marker in inner:
        unit = marker + "x"
        texts[f"open then {marker!r}"] = start + "f" + unit * (size // len(unit))
    texts["open then every inner"] = start + "f" + "".join(inner + ("```", "\n", '"')) * (size // 60)
    unclosed = "".join(inner[:-1]) + "x"  # every inner marker but the one that would close the last
    texts["open then every inner but the last"] = start + "f" + unclosed * (size // len(unclosed))
    for first, second in zip(inner, inner[1:]):
        pair = first + "k" + second
        texts[f"open then {first!r}{second!r}"] = start + "f" + pair * (size // len(pair))
    texts["fences"] = start + "\n```json\n" + "```" * (size // 3)
    texts["open body"] = start + "f" + "x" * size  # streamed in small pieces: a body re-scanned per piece
    return texts


def _pieces(label: str) -> int:
    return 4 if label == "open body" else 64


def _timed(run) -> float:
    """The CPU time of this thread running ``run``: what other processes take of the machine is not in it, nor the
    collector's passes (a full one walks every object the whole test session made: it fell on the larger run, 16x
    of a linear parser's time, once in a full suite). The collector is off while it runs, not run before it: a
    full collection per timed run, 240 a parser, took most of an hour in a full suite's heap."""
    gc.disable()
    try:
        started = time.thread_time()
        run()
        return time.thread_time() - started
    finally:
        gc.enable()


def _in_pieces(parser, text: str, label: str) -> None:
    step = _pieces(label)
    for at in range(0, len(text), step):
        parser.feed(text[at:at + step])
    parser.finish()


def _growth(run, small: str, large: str) -> float:
    """How much longer ``run`` takes on ``large`` (4x ``small``'s size) than on ``small``: the least of three
    alternate runs of each."""
    small_s, large_s = [], []
    for _ in range(3):
        small_s.append(_timed(lambda: run(small)))
        large_s.append(_timed(lambda: run(large)))
    return min(large_s) / max(min(small_s), FLOOR_S)


@pytest.mark.parametrize("name", ONE_PER_FORMAT)
def test_tool_call_parsers_are_linear(name):
    spellings = tool_call_parser(name).spellings
    smalls = _texts(spellings, SIZE // 4)
    for label, text in _texts(spellings).items():
        whole = _growth(lambda t: tool_call_parser(name).parse(t), smalls[label], text)
        pieces = _growth(lambda t: _in_pieces(tool_call_parser(name), t, label), smalls[label], text)
        assert whole < GROWTH_MAX and pieces < GROWTH_MAX, \
            f"{name} on {label}: 4x the text took {whole:.1f}x the time whole, {pieces:.1f}x in pieces"


@pytest.mark.parametrize("name", REASONING_NAMES)
def test_reasoning_parsers_are_linear(name):
    spellings = reasoning_parser(name).spellings
    smalls = {**_texts(spellings, SIZE // 4), "whitespace": " " * (SIZE // 4)}
    for label, text in {**_texts(spellings), "whitespace": " " * SIZE}.items():
        growth = _growth(lambda t: _in_pieces(reasoning_parser(name), t, label), smalls[label], text)
        assert growth < GROWTH_MAX, f"{name} on {label}: 4x the text took {growth:.1f}x the time"

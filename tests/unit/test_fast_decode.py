"""The byte-table detokenizer gives DecodeStream's pieces exactly; tokenizers it cannot reproduce are refused."""

from __future__ import annotations

import json
import random

import pytest
import tokenizers
from tokenizers.decoders import DecodeStream

from gateway.tokenizer.bundled import default_tokenizer_dir
from gateway.tokenizer.fast_bpe import NotEquivalent
from gateway.tokenizer.fast_decode import ByteLevelDecoder, _check_every_token
from gateway.tokenizer.service import IncrementalDecoder, TokenizerConfig, TokenizerService
from tests.support.config import parse
from tests.support.tokenizers import CORPUS_SEED, llama3_tokenizer_json, random_text

pytestmark = pytest.mark.corpus  # random corpora decoded against tokenizers' DecodeStream


def _streams_agree(raw: str, seed: int, ids_count: int) -> None:
    """Random ids (text, every special and added token, lone bytes, ids past the vocabulary) stepped
    one to four at a time through both decoders, with and without special tokens: the same pieces."""
    reference = tokenizers.Tokenizer.from_str(raw)
    fast = ByteLevelDecoder.build(raw, reference)
    rng = random.Random(seed)
    vocab_size = reference.get_vocab_size(with_added_tokens=True)
    text_ids = reference.encode(random_text(rng, ids_count * 2), add_special_tokens=False).ids
    added_ids = list(reference.get_added_tokens_decoder())
    ids: list[int] = []
    while len(ids) < ids_count:
        roll = rng.random()
        if roll < 0.55:
            ids.append(rng.choice(text_ids))
        elif roll < 0.75:
            ids.append(rng.randrange(vocab_size))  # anything, lone bytes of UTF-8 sequences among them
        elif roll < 0.9:
            ids.append(rng.choice(added_ids))
        elif roll < 0.97:
            ids.append(rng.randrange(256))  # the byte tokens and short pieces: invalid UTF-8 often
        else:
            ids.append(vocab_size + rng.randrange(1000))  # not in the vocabulary: dropped by both
    for skip in (False, True):
        ours, theirs = fast.new_stream(skip), DecodeStream(skip_special_tokens=skip)
        at = 0
        while at < len(ids):
            step = ids[at:at + rng.randint(1, 4)]
            # A step of several ids is those ids stepped one at a time (DecodeStream given them at once holds all
            # of them back when the last ends inside a character).
            expected = "".join([theirs.step(reference, [i]) or "" for i in step])
            assert ours.step(step) == expected, (f"seed {seed}, skip_special_tokens={skip}, ids {at}..: "
                                                 f"{step} -> {expected!r}")
            at += len(step)


def test_qwen3_streams_give_decode_streams_pieces():
    seed = random.randrange(2**32)
    _streams_agree((default_tokenizer_dir() / "tokenizer.json").read_text(encoding="utf-8"), seed, 60_000)


def test_llama3_streams_give_decode_streams_pieces():
    seed = random.randrange(2**32)
    _streams_agree(llama3_tokenizer_json(), seed, 30_000)


def test_a_token_whose_bytes_are_wrong_is_caught_by_the_build_check():
    raw = (default_tokenizer_dir() / "tokenizer.json").read_text(encoding="utf-8")
    reference = tokenizers.Tokenizer.from_str(raw)
    fast = ByteLevelDecoder.build(raw, reference)
    table = list(fast._with_special)
    _check_every_token(table, reference)  # as built: passes
    think = reference.token_to_id("<think>")
    table[think] = b"<think >"
    with pytest.raises(NotEquivalent, match=f"token {think}"):
        _check_every_token(table, reference)


def test_other_decoders_are_refused_and_keep_decode_stream(tmp_path):
    raw = json.loads((default_tokenizer_dir() / "tokenizer.json").read_text(encoding="utf-8"))
    raw["decoder"] = {"type": "Sequence", "decoders": [raw["decoder"], {"type": "Strip", "content": " ",
                                                                          "start": 1, "stop": 0}]}
    text = json.dumps(raw)
    with pytest.raises(NotEquivalent, match="not ByteLevel"):
        ByteLevelDecoder.build(text, tokenizers.Tokenizer.from_str(text))
    (tmp_path / "tokenizer.json").write_text(text, encoding="utf-8")
    service = TokenizerService.from_directory(tmp_path)
    assert service.fast_decoder is None and "not ByteLevel" in service.fast_decode_refusal
    assert isinstance(service.new_decode_stream(), IncrementalDecoder)


def test_the_flag_keeps_decode_stream():
    assert parse(["--disable-fast-detokenizer"]).tokenizer.fast_decode is False
    service = TokenizerService.from_directory(default_tokenizer_dir(), TokenizerConfig(fast_decode=False))
    assert service.fast_decoder is None and "--disable-fast-detokenizer" in service.fast_decode_refusal
    assert isinstance(service.new_decode_stream(), IncrementalDecoder)


def test_the_bundled_tokenizer_detokenizes_through_the_table():
    service = TokenizerService.from_directory(default_tokenizer_dir())
    assert service.fast_decoder is not None, service.fast_decode_refusal
    ids = service.encode_uncached(random_text(random.Random(CORPUS_SEED), 2000))
    stream = service.new_decode_stream(skip_special_tokens=True)
    assert "".join(stream.step([i]) for i in ids) == service.decode(ids, skip_special_tokens=True)

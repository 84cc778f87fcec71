"""Logprobs in OpenAI's shapes (gateway/api/logprobs.py): bytes exactly as the tokens write them, a token
holding part of a UTF-8 character spelled as OpenAI does, special tokens left out with the text, and the
entries of a stream split across chunks adding up to the whole."""

from __future__ import annotations

import pytest

from gateway.api.logprobs import LogprobShape
from gateway.serving.generation import LogprobRecord
from gateway.tokenizer.bundled import default_tokenizer_dir
from gateway.tokenizer.service import TokenizerService


@pytest.fixture(scope="module")
def qwen():
    return TokenizerService.from_directory(default_tokenizer_dir())


def _record(ids, prompt=None):
    record = LogprobRecord()
    record.tokens = [(i, -0.5, ((i, -0.5), (0, -2.0))) for i in ids]
    record.prompt = prompt
    return record


def test_a_character_split_over_tokens_gives_its_bytes(qwen):
    text = "llama 🦙!"
    ids = qwen.tokenizer.encode(text, add_special_tokens=False).ids
    content = LogprobShape(_record(ids), qwen, True, 2).whole()["content"]
    assert b"".join(bytes(t["bytes"]) for t in content) == text.encode("utf-8")
    partial = [t for t in content if t["token"].startswith("bytes:")]
    assert partial, "the emoji spans several byte-level tokens"
    for t in partial:
        assert t["token"] == "bytes:" + "".join(f"\\x{b:02x}" for b in t["bytes"])
    assert all(len(t["top_logprobs"]) == 2 for t in content)


def test_special_tokens_have_their_entries_though_the_text_leaves_them_out(qwen):
    # As vLLM's server lists them: the end of sequence that stopped the answer has its entry.
    ids = qwen.tokenizer.encode("hi<|im_end|>", add_special_tokens=False).ids
    assert [t["token"] for t in LogprobShape(_record(ids), qwen, True, 0).whole()["content"]] == ["hi", "<|im_end|>"]
    completion = LogprobShape(_record(ids), qwen, False, 0).whole()
    assert completion["tokens"] == ["hi", "<|im_end|>"] and completion["text_offset"] == [0, 2]


def test_stream_chunks_add_up_and_completions_offsets(qwen):
    ids = qwen.tokenizer.encode("one two three four", add_special_tokens=False).ids
    record = _record([])
    shape = LogprobShape(record, qwen, False, 1)
    pieces = []
    for i in ids:
        record.tokens.append((i, -0.25, ((i, -0.25),)))
        pieces.append(shape.unsent())
    assert sum((p["tokens"] for p in pieces), []) == ["one", " two", " three", " four"]
    assert sum((p["text_offset"] for p in pieces), []) == [0, 3, 7, 13]
    assert shape.unsent()["tokens"] == []  # nothing new


def test_a_streamed_record_lets_go_of_what_it_sent():
    from gateway.serving.generation import LogprobRecord
    kept, streamed = LogprobRecord(keep=True), LogprobRecord(keep=False)
    for record in (kept, streamed):
        record.tokens.extend([(1, -0.1, ()), (2, -0.2, ())])
        assert record.unsent() == [(1, -0.1, ()), (2, -0.2, ())]
        record.tokens.append((3, -0.3, ()))
        assert record.unsent() == [(3, -0.3, ())]
    assert len(kept.tokens) == 3 and streamed.tokens == []  # a whole answer still needs them; a stream does not


def test_the_answer_estimate_is_the_json_an_answer_becomes():
    from gateway.serving.generation import LOGPROB_ENTRY_BYTES, answer_bytes_estimate
    assert answer_bytes_estimate(1, 100, None) == 800
    # The request: 16 answers x 16,000 tokens x (1 + 20) entries; the body it made was 447 MB.
    assert 400e6 < answer_bytes_estimate(16, 16000, 20) < 500e6 and LOGPROB_ENTRY_BYTES == 80

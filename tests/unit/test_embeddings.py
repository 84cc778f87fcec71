"""Embeddings without an engine (gateway/serving/embeddings.py, gateway/api/embeddings.py): the matryoshka cut, the
base64 encoding, which dimensions a model takes, and the request's inputs in OpenAI's four forms."""

from __future__ import annotations

import base64
import math
import struct

import pytest

from gateway.api.embeddings import _inputs
from gateway.api.errors import BadRequest
from gateway.serving.embeddings import cut, dimensions_problem, encoded


def test_a_cut_is_the_head_made_unit_length_again():
    vector = [0.6, 0.8, 0.0, 0.0]
    assert cut(vector, None) is vector and cut(vector, 4) is vector and cut(vector, 9) is vector
    head = cut([3.0, 4.0, 12.0], 2)
    assert head == pytest.approx([0.6, 0.8]) and math.isclose(math.hypot(*head), 1.0)
    assert cut([0.0, 0.0, 1.0], 2) == [0.0, 0.0]  # nothing to normalize: no division by zero


def test_base64_is_float32_little_endian():
    vector = [0.1, -2.5, 3.0]
    raw = base64.b64decode(encoded(vector, "base64"))
    assert struct.unpack("<3f", raw) == pytest.approx(vector) and len(raw) == 12
    assert encoded(vector, "float") == vector


def test_dimensions_only_for_matryoshka_models_and_their_sizes():
    assert dimensions_problem("m", None, 64) is not None  # config.json says nothing: not a matryoshka model
    assert dimensions_problem("m", (), 17) is None  # is_matryoshka: any size
    assert dimensions_problem("m", (64, 128), 128) is None
    assert "64, 128" in dimensions_problem("m", (64, 128), 100)
    # Longer than the model's vectors: refused as vLLM refuses it (a 200 with a shorter vector before).
    assert "[1, 384]" in dimensions_problem("m", (), 1024, embedding_size=384)
    assert dimensions_problem("m", (), 384, embedding_size=384) is None


@pytest.mark.parametrize("raw, expected", [
    ("hello", [("input", "hello")]),
    (["a", "b"], [("input[0]", "a"), ("input[1]", "b")]),
    ([1, 2, 3], [("input", (1, 2, 3))]),
    ([[1], [2, 3]], [("input[0]", (1,)), ("input[1]", (2, 3))]),
    ([[1], "x"], [("input[0]", (1,)), ("input[1]", "x")]),
])
def test_the_four_forms_of_input(raw, expected):
    assert _inputs(raw, 10) == expected


@pytest.mark.parametrize("raw, param", [
    ("", "input"), ([], "input"), (None, "input"), (5, "input"), ([""], "input[0]"), ([[]], "input[0]"),
    ([[1, -1]], "input[0]"), ([[True]], "input[0]"), ([["1"]], "input[0]"), ([{"text": "x"}], "input[0]"),
    ([[2 ** 33]], "input[0]"), (["x"] * 11, "input"),
])
def test_bad_inputs_name_themselves(raw, param):
    with pytest.raises(BadRequest) as e:
        _inputs(raw, 10)
    assert e.value.param == param


def test_the_answer_is_its_pieces_and_their_size_is_exact():
    from gateway.serving.embeddings import EncodedAnswer
    import orjson
    answer = EncodedAnswer(10_000, None, "float", 3)
    for index in (2, 0, 1):  # as the engines answer: in any order
        answer.keep(index, [0.5 * index, -0.25])
    pieces, size = answer.body({"model": "m", "usage": {"prompt_tokens": 3, "total_tokens": 3}})
    whole = b"".join(pieces)
    assert len(whole) == size
    assert orjson.loads(whole) == {"object": "list", "data": [
        {"object": "embedding", "index": i, "embedding": [0.5 * i, -0.25]} for i in range(3)],
        "model": "m", "usage": {"prompt_tokens": 3, "total_tokens": 3}}


def test_an_answer_past_its_bound_is_refused_before_and_while_it_arrives():
    from gateway.serving.embeddings import EmbeddingsTooLarge, EncodedAnswer, answer_bytes_floor
    assert answer_bytes_floor(2048, 4096, "float") > 128 * 2 ** 20  # the 188 MB answer
    assert answer_bytes_floor(2048, 4096, "base64") == int(2048 * (4096 * 16 / 3 + 48))
    answer = EncodedAnswer(32 * 2 ** 20, None, "float", 2048)
    with pytest.raises(EmbeddingsTooLarge, match=r"at least \d+ bytes \(2048 vectors of 4096 values as float\).*"
                                                 r"--max-answer-bytes.*base64"):
        answer.check_floor(4096)
    answer.check_floor(256)  # 2048 x 256 fits
    answer = EncodedAnswer(1000, None, "base64", 8)
    answer.keep(0, [0.1] * 64)
    with pytest.raises(EmbeddingsTooLarge, match="grew past the bound"):
        for index in range(1, 8):
            answer.keep(index, [0.1] * 64)
    assert answer.size > 1000


def test_prompt_ids_are_out_of_vocabulary_only_past_the_tokenizer_and_the_models_rows():
    """vLLM's server's rule (renderers/base.py validate_token_ids): an id is refused only past both the tokenizer's
    last id and the model's embedding rows, which differ both ways (Qwen's rows past its tokenizer, some vision
    models' placeholders past their rows)."""
    import types

    from gateway.api.pipeline import check_prompt_ids
    from gateway.serving.models import ModelEntry

    tokenizer = types.SimpleNamespace(vocab_size=100)
    entry = ModelEntry("m", tokenizer, 64, 0)
    check_prompt_ids([0, 99], entry)
    with pytest.raises(BadRequest, match="token id 100"):
        check_prompt_ids([100], entry)
    entry.model_vocab_size = 128  # the engine's GetModelInfo: 128 rows
    check_prompt_ids([100, 127], entry)
    with pytest.raises(BadRequest, match="size 128"):
        check_prompt_ids([128], entry)
    entry.model_vocab_size = 50  # fewer rows than the tokenizer's ids: the tokenizer's bound holds
    check_prompt_ids([99], entry)

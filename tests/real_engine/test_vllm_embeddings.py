"""Embeddings on a real engine (issue 37), compared with vLLM's own OpenAI server on the same model and flags:
a tiny random Qwen3 served as a pooling model (``--runner pooling --convert embed``; its config says matryoshka
with sizes 32, 64 and 128): our ``/v1/embeddings`` over the gRPC ``Embed`` against vLLM's ``/v1/embeddings``,
cosine > 0.9999 per input, the same token counts, ``dimensions`` cut alike.

Needs ``tests/real_engine/setup_vllm.sh`` and SMG_VLLM_PYTHON, SMG_VLLM_EMBED_MODEL (the script prints them).
The module starts its two engines (~3 minutes) and stops them at its end.
"""

from __future__ import annotations

import base64
import math
import os
import struct

import openai
import pytest

from .conftest import engine_pair
from .media_engines import clients, configured, node_on

pytestmark = pytest.mark.real_engine



@pytest.fixture(scope="module")
def embedders():
    configured("SMG_VLLM_EMBED_MODEL")
    with engine_pair("vllm-embed", os.environ["SMG_VLLM_EMBED_MODEL"], 18053, 18063,
                     ["--runner", "pooling", "--convert", "embed"]) as (grpc_url, http_url):
        node = node_on(grpc_url, "node-vllm-embed")
        try:
            ours, theirs = clients(node, http_url)
            yield ours, theirs, ours.models.list().data[0].id
        finally:
            node.stop()


def _cosine(a, b) -> float:
    return math.fsum(x * y for x, y in zip(a, b)) / math.sqrt(math.fsum(x * x for x in a) * math.fsum(y * y for y in b))


INPUTS = ["Hello, world.", "A gateway tokenizes text so that the engine only sees token ids.", "x" * 300]


def test_embeddings_equal_vllms_own_server(embedders):
    ours, theirs, model = embedders
    mine = ours.embeddings.create(model=model, input=INPUTS)
    reference = theirs.embeddings.create(model=model, input=INPUTS)
    assert [d.index for d in mine.data] == [0, 1, 2]
    for a, b in zip(mine.data, reference.data):
        assert len(a.embedding) == len(b.embedding) == 128
        assert _cosine(a.embedding, b.embedding) > 0.9999
    assert mine.usage.prompt_tokens == reference.usage.prompt_tokens == mine.usage.total_tokens
    # Token ids in, and base64 out: the same vectors.
    ids = ours.post("/tokenize", body={"model": model, "prompt": INPUTS[1]}, cast_to=object)["tokens"]
    by_ids = ours.embeddings.create(model=model, input=[ids], encoding_format="base64")
    raw = base64.b64decode(by_ids.data[0].embedding)
    vector = struct.unpack(f"<{len(raw) // 4}f", raw)
    assert _cosine(vector, reference.data[1].embedding) > 0.9999


def test_dimensions_cut_as_vllm_cuts_them(embedders):
    ours, theirs, model = embedders
    mine = ours.embeddings.create(model=model, input=INPUTS[:2], dimensions=64)
    reference = theirs.embeddings.create(model=model, input=INPUTS[:2], dimensions=64)
    for a, b in zip(mine.data, reference.data):
        assert len(a.embedding) == len(b.embedding) == 64
        assert _cosine(a.embedding, b.embedding) > 0.9999
    for client in (ours, theirs):  # a size the model's config does not list: refused by both
        with pytest.raises(openai.BadRequestError):
            client.embeddings.create(model=model, input="x", dimensions=48)


def test_the_model_list_says_it_embeds_and_long_inputs_are_refused(embedders):
    ours, _, model = embedders
    listed = ours.get("/models", cast_to=object)["data"][0]
    assert "embed" in listed["tasks"] and "generate" not in listed["tasks"]
    with pytest.raises(openai.BadRequestError) as refused:
        ours.embeddings.create(model=model, input=["word " * 3000])
    assert "context" in refused.value.message
    with pytest.raises(openai.BadRequestError):  # a chat on an embedding model
        ours.chat.completions.create(model=model, messages=[{"role": "user", "content": "Hi"}], max_tokens=2)


def test_an_input_of_exactly_the_context_is_embedded_and_sizes_past_the_vector_are_refused_as_vllm_does(embedders):
    ours, theirs, model = embedders
    context = ours.get("/models", cast_to=object)["data"][0]["max_model_len"]
    full = [[7] * context]
    mine, reference = (client.embeddings.create(model=model, input=full) for client in (ours, theirs))
    assert _cosine(mine.data[0].embedding, reference.data[0].embedding) > 0.9999
    assert mine.usage.prompt_tokens == reference.usage.prompt_tokens == context
    for client in (ours, theirs):  # one token past it: both refuse
        with pytest.raises(openai.BadRequestError):
            client.embeddings.create(model=model, input=[[7] * (context + 1)])
        with pytest.raises(openai.BadRequestError):  # longer than the model's vectors: both refuse (not cut short)
            client.embeddings.create(model=model, input="x", dimensions=100_000)


QUERY = "Where does a gateway tokenize?"
DOCUMENTS = ["A gateway tokenizes text so that the engine only sees token ids.", "Bananas are yellow.",
             "Hello, world.", "x" * 120]


def test_scores_and_reranks_equal_vllms_own_server(embedders):
    """/v1/score and /v1/rerank over the embedding model (vLLM's bi-encoder scoring: each text embedded, each
    pair's cosine): the same scores within float32's rounding, the same order, the same token counts."""
    ours, theirs, model = embedders
    for body in ({"queries": QUERY, "documents": DOCUMENTS}, {"text_1": DOCUMENTS[:2], "text_2": DOCUMENTS[2:]}):
        mine = ours.post("/score", body={"model": model, **body}, cast_to=object)
        reference = theirs.post("/score", body={"model": model, **body}, cast_to=object)
        assert [d["index"] for d in mine["data"]] == [d["index"] for d in reference["data"]]
        for a, b in zip(mine["data"], reference["data"]):
            assert abs(a["score"] - b["score"]) < 1e-5, (a, b)
        assert mine["usage"]["prompt_tokens"] == reference["usage"]["prompt_tokens"]
    body = {"model": model, "query": QUERY, "documents": DOCUMENTS, "top_n": 3}
    mine, reference = ours.post("/rerank", body=body, cast_to=object), theirs.post("/rerank", body=body,
                                                                                  cast_to=object)
    assert [r["index"] for r in mine["results"]] == [r["index"] for r in reference["results"]]
    assert [r["document"] for r in mine["results"]] == [{"text": r["document"]["text"]} for r in reference["results"]]
    for a, b in zip(mine["results"], reference["results"]):
        assert abs(a["relevance_score"] - b["relevance_score"]) < 1e-5
    assert mine["usage"] == reference["usage"]

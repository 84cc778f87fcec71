"""POST /v1/embeddings end to end (issue 37): the openai SDK against a node, simulated engines that embed
(Embed over gRPC, deterministic unit vectors: chaos/sim_engine/embedding.py), both engine services.

The vectors are checked against the engine's own function on the ids the reference tokenizer makes, so a
wrong tokenization, a wrong order or a wrong encoding fails; dimensions on a matryoshka model and not
otherwise; the bounds; usage; rate limits by tokens; a generation model refused; an engine dying mid-batch."""

from __future__ import annotations

import base64
import math
import struct

import httpx2
import openai
import pytest
from tokenizers import Tokenizer

from chaos.processes import EngineProcess, NodeProcess
from chaos.sim_engine.embedding import embedding_of

from gateway.tokenizer.bundled import default_tokenizer_dir

EMBED = "qwen3-embed-sim"
PLAIN = "qwen3-embed-plain"  # an embedding model that is not matryoshka
CHAT = "qwen3-sim"
DIM = 256
CONTEXT = 64


@pytest.fixture(scope="module")
def tokenizer():
    return Tokenizer.from_file(str(default_tokenizer_dir() / "tokenizer.json"))


def ids_of(tokenizer, text: str) -> list[int]:
    return tokenizer.encode(text, add_special_tokens=True).ids


def close(a, b, tolerance=1e-6) -> bool:
    return len(a) == len(b) and all(abs(x - y) <= tolerance for x, y in zip(a, b))


def cut(vector, n):
    head = vector[:n]
    norm = math.sqrt(sum(v * v for v in head))
    return [v / norm for v in head]


@pytest.fixture(scope="module")
def engines(log_dir):
    started = [EngineProcess(["--task", "embed", "--model-name", EMBED, "--embedding-dim", str(DIM),
                              "--matryoshka-dimensions", "64", "128", "--max-context-tokens", str(CONTEXT),
                              "--services", "vllm"], log_dir, "embed-vllm"),
               EngineProcess(["--task", "embed", "--model-name", EMBED, "--embedding-dim", str(DIM),
                              "--matryoshka-dimensions", "64", "128", "--max-context-tokens", str(CONTEXT),
                              "--services", "sglang"], log_dir, "embed-sglang"),
               EngineProcess(["--task", "embed", "--model-name", PLAIN, "--embedding-dim", "32"], log_dir,
                             "embed-plain"),
               EngineProcess(["--model-name", CHAT, "--zero-cost"], log_dir, "embed-chat")]
    yield started
    for e in started:
        e.stop()


@pytest.fixture(scope="module")
def node(engines, log_dir, tmp_path_factory):
    limits = tmp_path_factory.mktemp("limits") / "limits.toml"
    limits.write_text('[[limits]]\nname = "embed-tokens"\nscope = "model"\nunit = "tokens"\nlimit = 400\n'
                      'window_s = 3600\nmatch = "%s"\n' % PLAIN)
    n = NodeProcess(["--worker-urls", *(e.url for e in engines), "--policy", "round_robin",
                     "--max-embedding-inputs", "6", "--max-embedding-tokens", "200", "--rate-limits", str(limits)],
                    log_dir, "embed-node")
    yield n
    n.stop()


@pytest.fixture(scope="module")
def client(node):
    return openai.OpenAI(base_url=node.url + "/v1", api_key="x", max_retries=0)


def test_the_sdk_gets_the_engines_vectors_for_the_gateways_tokens(client, tokenizer):
    # Left to itself the SDK asks for base64 and decodes it; then floats, asked for explicitly.
    texts = ["Embeddings turn text into vectors.", "A second, different input.", "é 東京 🎉"]
    for encoding_format in (openai.NOT_GIVEN, "float"):
        reply = client.embeddings.create(model=EMBED, input=texts, encoding_format=encoding_format)
        assert [d.index for d in reply.data] == [0, 1, 2] and reply.model == EMBED
        for text, item in zip(texts, reply.data):
            assert close(item.embedding, embedding_of(ids_of(tokenizer, text), DIM)), text
        tokens = sum(len(ids_of(tokenizer, t)) for t in texts)
        assert (reply.usage.prompt_tokens, reply.usage.total_tokens) == (tokens, tokens)
    one = client.embeddings.create(model=EMBED, input="just one")
    assert len(one.data) == 1 and close(one.data[0].embedding, embedding_of(ids_of(tokenizer, "just one"), DIM))


def test_token_id_inputs_and_the_raw_base64_encoding(node, tokenizer):
    for body_input, expected_ids in (([1, 2, 3], [[1, 2, 3]]), ([[5, 6], [7]], [[5, 6], [7]])):
        r = httpx2.post(node.url + "/v1/embeddings", json={"model": EMBED, "input": body_input,
                                                           "encoding_format": "base64"})
        assert r.status_code == 200, r.text
        for ids, item in zip(expected_ids, r.json()["data"]):
            raw = base64.b64decode(item["embedding"])
            vector = struct.unpack(f"<{len(raw) // 4}f", raw)
            assert close(vector, embedding_of(ids, DIM))


def test_dimensions_cut_a_matryoshka_models_vectors_and_are_refused_otherwise(client, tokenizer):
    reply = client.embeddings.create(model=EMBED, input="cut me", dimensions=64)
    vector = reply.data[0].embedding
    assert len(vector) == 64 and abs(math.sqrt(sum(v * v for v in vector)) - 1) < 1e-5
    assert close(vector, cut(embedding_of(ids_of(tokenizer, "cut me"), DIM), 64), 1e-5)
    with pytest.raises(openai.BadRequestError) as e:  # not one of the sizes the model was trained for
        client.embeddings.create(model=EMBED, input="x", dimensions=100)
    assert e.value.body["param"] == "dimensions" and "64, 128" in e.value.body["message"]
    with pytest.raises(openai.BadRequestError) as e:  # not a matryoshka model at all
        client.embeddings.create(model=PLAIN, input="x", dimensions=16)
    assert e.value.body["code"] == "unsupported_dimensions"


@pytest.mark.parametrize("body, param", [
    ({"input": ""}, "input"),
    ({"input": ["fine", ""]}, "input[1]"),
    ({"input": []}, "input"),
    ({"input": [[1, 2], "text"]}, None),  # mixed forms are each checked: this one is valid
    ({"input": [["a"]]}, "input[0]"),
    ({"input": ["x"] * 7}, "input"),  # --max-embedding-inputs 6
    ({"input": ["word " * 40] * 5}, "input"),  # 5 x 41 tokens > --max-embedding-tokens 200
    ({"input": ["short", "word " * 80]}, "input[1]"),  # longer than the 64-token context
    ({"input": [[5] * 64]}, None),  # exactly the context: a pooling prompt needs no room for an output token
    ({"input": [[5] * 65]}, "input[0]"),
    ({"input": [[999_999_999]]}, "input[0]"),  # outside the vocabulary
    ({"input": "x", "encoding_format": "int8"}, "encoding_format"),
    ({"input": "x", "dimensions": 0}, "dimensions"),
])
def test_bad_requests_are_400s_naming_the_input(node, body, param):
    r = httpx2.post(node.url + "/v1/embeddings", json={"model": EMBED, **body})
    if param is None:
        assert r.status_code == 200, r.text[:300]
        return
    assert r.status_code == 400, r.text[:300]
    assert r.json()["error"]["param"] == param, r.text


def test_models_say_which_embed_and_each_kind_refuses_the_others_api(client, node):
    tasks = {m.id: m.model_extra["tasks"] for m in client.models.list().data}
    assert tasks == {EMBED: ["embed", "score"], PLAIN: ["embed", "score"], CHAT: ["generate"]}
    with pytest.raises(openai.BadRequestError) as e:
        client.embeddings.create(model=CHAT, input="x")
    assert e.value.body["code"] == "model_not_embedding"
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=EMBED, messages=[{"role": "user", "content": "hi"}], max_tokens=2)
    assert e.value.body["code"] == "model_not_generative"


def test_token_rate_limits_count_the_inputs_tokens(node, tokenizer):
    text = "word " * 40  # 41 tokens
    spent = 0
    while True:
        r = httpx2.post(node.url + "/v1/embeddings", json={"model": PLAIN, "input": [text] * 2})
        if r.status_code != 200:
            break
        spent += r.json()["usage"]["total_tokens"]
        assert spent <= 400
    assert r.status_code == 429 and r.json()["error"]["code"] == "rate_limit_exceeded", r.text
    assert r.headers["x-ratelimit-limit-tokens"] == "400"
    assert spent > 400 - 2 * len(ids_of(tokenizer, text)) - 1  # the limit, not sooner


def test_an_engine_that_dies_mid_batch_costs_retries_not_the_request(log_dir, tokenizer):
    engines = [EngineProcess(["--task", "embed", "--model-name", EMBED, "--embedding-dim", "16"], log_dir,
                             f"embed-dying-{i}") for i in range(2)]
    n = NodeProcess(["--worker-urls", *(e.url for e in engines), "--policy", "round_robin"], log_dir,
                    "embed-dying-node")
    try:
        c = openai.OpenAI(base_url=n.url + "/v1", api_key="x", max_retries=0)
        texts = [f"input number {i}" for i in range(6)]
        assert len(c.embeddings.create(model=EMBED, input=texts).data) == 6
        engines[0].kill()
        reply = c.embeddings.create(model=EMBED, input=texts)
        for text, item in zip(texts, reply.data):
            assert close(item.embedding, embedding_of(ids_of(tokenizer, text), 16))
    finally:
        n.stop()
        for e in engines:
            e.stop()


def _cosine(a, b) -> float:
    return math.fsum(x * y for x, y in zip(a, b)) / math.sqrt(math.fsum(x * x for x in a) * math.fsum(y * y for y in b))


def test_scores_and_reranks_are_the_cosines_of_the_engines_vectors(node, tokenizer):
    """/v1/score and /v1/rerank as vLLM's server answers them for an embedding model: each text embedded once (with
    its special tokens), each pair's cosine, a rerank sorted from the most relevant, usage counting each text once."""
    query, docs = "where do gateways run", ["gateways run beside engines", "bananas are yellow", "a node serves"]
    vectors = {text: embedding_of(ids_of(tokenizer, text), DIM) for text in [query, *docs]}
    expected = [_cosine(vectors[query], vectors[d]) for d in docs]
    tokens = sum(len(ids_of(tokenizer, t)) for t in [query, *docs])
    for path in ("/v1/score", "/score"):
        r = httpx2.post(node.url + path, json={"model": EMBED, "queries": query, "documents": docs}, timeout=30)
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["object"] == "list" and body["model"] == EMBED and body["id"].startswith("score")
        assert [d["index"] for d in body["data"]] == [0, 1, 2] and all(d["object"] == "score" for d in body["data"])
        assert all(abs(d["score"] - e) < 1e-6 for d, e in zip(body["data"], expected))
        assert body["usage"] == {"prompt_tokens": tokens, "total_tokens": tokens, "completion_tokens": 0}
    pairwise = httpx2.post(node.url + "/v1/score", json={"model": EMBED, "text_1": [docs[0], docs[1]],
                                                         "text_2": [docs[2], query]}, timeout=30).json()
    assert abs(pairwise["data"][1]["score"] - _cosine(vectors[docs[1]], vectors[query])) < 1e-6
    order = sorted(range(3), key=lambda i: expected[i], reverse=True)
    for path in ("/v1/rerank", "/rerank", "/v2/rerank"):
        r = httpx2.post(node.url + path, json={"model": EMBED, "query": query, "documents": [
            docs[0], {"text": docs[1]}, docs[2]], "top_n": 2}, timeout=30)
        assert r.status_code == 200, r.text
        body = r.json()
        assert [x["index"] for x in body["results"]] == order[:2]
        assert [x["document"]["text"] for x in body["results"]] == [docs[i] for i in order[:2]]
        assert all(abs(x["relevance_score"] - expected[x["index"]]) < 1e-6 for x in body["results"])
        assert body["usage"] == {"prompt_tokens": tokens, "total_tokens": tokens}
    bare = httpx2.post(node.url + "/v1/rerank", json={"model": EMBED, "query": query, "documents": docs,
                                                      "return_documents": False}, timeout=30).json()
    assert len(bare["results"]) == 3 and "document" not in bare["results"][0]


@pytest.mark.parametrize("path, body, param", [
    ("/v1/score", {"model": CHAT, "queries": "a", "documents": ["b"]}, "model"),  # a generation model
    ("/v1/score", {"model": EMBED, "queries": ["a", "b"], "documents": ["c", "d", "e"]}, "documents"),  # 2:3
    ("/v1/score", {"model": EMBED, "queries": "a"}, "queries"),
    ("/v1/score", {"model": EMBED, "queries": "a", "documents": [""]}, "documents[0]"),
    ("/v1/rerank", {"model": EMBED, "query": "a", "documents": [3]}, "documents[0]"),
    ("/v1/rerank", {"model": EMBED, "query": "a", "documents": ["b"] * 6}, "documents"),  # past the inputs bound
    ("/v1/rerank", {"model": EMBED, "query": "a", "documents": ["b"], "top_n": -1}, "top_n"),
    ("/v1/rerank", {"model": EMBED, "query": "a", "documents": ["b"], "truncate_prompt_tokens": 3},
     "truncate_prompt_tokens"),
    ("/v1/rerank", {"model": EMBED, "query": "word " * 80, "documents": ["b"]}, "query[0]"),  # past the context
])
def test_bad_score_and_rerank_requests_are_400s_naming_the_field(node, path, body, param):
    r = httpx2.post(node.url + path, json=body, timeout=30)
    assert r.status_code == 400, r.text[:300]
    assert r.json()["error"]["param"] == param, r.text

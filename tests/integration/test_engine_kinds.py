"""TensorRT-LLM, MLX and TokenSpeed engines behind one node, each a simulated engine serving only its own kind's
service (chaos/sim_engine/*_service.py), driven with the openai SDK: detected by kind, answering as SGLang and vLLM
engines do, and a 400 naming what a kind cannot do. A gateway that spoke one kind's messages to another would get
UNIMPLEMENTED (another service's path) and every answer here would fail.
"""

from __future__ import annotations

import httpx2
import openai
import pytest

from chaos.processes import EngineProcess, NodeProcess
from tests.support.nodes import ENGINE_ARGS

KINDS = {"trtllm": "trt-sim", "mlx": "mlx-sim", "tokenspeed": "ts-sim"}
EOS_AFTER_TOKENS = 6  # the TensorRT-LLM engine's answers end there, if the gateway named the model's end


@pytest.fixture(scope="module")
def engines(log_dir):
    started = {kind: EngineProcess([*ENGINE_ARGS, "--services", kind, "--model-name", model,
                                    *(["--eos-after-tokens", str(EOS_AFTER_TOKENS)] if kind == "trtllm" else [])],
                                   log_dir, f"kind-{kind}")
               for kind, model in KINDS.items()}
    started["trtllm-embed"] = EngineProcess([*ENGINE_ARGS, "--services", "trtllm", "--model-name", "trt-embed",
                                             "--task", "embed", "--embedding-dim", "16"], log_dir, "kind-trtllm-embed")
    for kind in ("tokenspeed", "sglang", "trtllm"):  # the same vision model behind three kinds' services
        started[f"{kind}-vision"] = EngineProcess([*ENGINE_ARGS, "--services", kind, "--vision", "--model-name",
                                                   f"{kind}-vision"], log_dir, f"kind-{kind}-vision")
    yield started
    for e in started.values():
        e.stop()


@pytest.fixture(scope="module")
def node(engines, log_dir):
    n = NodeProcess(["--worker-urls", *[e.url for e in engines.values()], "--health-check-interval-secs", "1"],
                    log_dir, "kinds-node")
    yield n
    n.stop()


@pytest.fixture(scope="module")
def client(node):
    return openai.OpenAI(base_url=node.url + "/v1", api_key="unused", max_retries=0, timeout=30)


def _prompt_ids(node, model: str, messages) -> list[int]:
    r = httpx2.post(node.url + "/v1/tokenize", json={"model": model, "messages": messages})
    assert r.status_code == 200, r.text
    return r.json()["tokens"]


def test_each_engine_is_detected_as_its_kind(node, engines):
    workers = httpx2.get(node.url + "/workers", headers=node.admin_headers).json()["workers"]
    kinds = {w["url"]: w["runtime"] for w in workers}
    assert kinds == {engines[k].url: k for k in KINDS} | {engines["trtllm-embed"].url: "trtllm"} | {
        engines[f"{k}-vision"].url: k for k in ("tokenspeed", "sglang", "trtllm")}
    assert all(w["healthy"] for w in workers)  # TensorRT-LLM's health is its status text


@pytest.mark.parametrize("kind", list(KINDS))
def test_each_kind_answers_whole_and_streamed_as_the_engine_generates(kind, node, client, predict):
    model = KINDS[kind]
    messages = [{"role": "user", "content": f"hello from {kind}"}]
    expected = predict(_prompt_ids(node, model, messages), 4, seed=11)
    answer = client.chat.completions.create(model=model, messages=messages, max_tokens=4, seed=11)
    assert answer.choices[0].message.content == expected and answer.usage.completion_tokens == 4
    assert answer.choices[0].finish_reason == "length"
    chunks = list(client.chat.completions.create(model=model, messages=messages, max_tokens=4, seed=11, stream=True,
                                                 stream_options={"include_usage": True}))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == expected
    assert chunks[-1].usage.completion_tokens == 4
    completion = client.completions.create(model=model, prompt="plain text", max_tokens=3)
    assert completion.usage.completion_tokens == 3 and completion.choices[0].text


def test_trtllm_answers_end_at_the_models_end_of_sequence(client):
    """Its gRPC path stops at the model's end only when the request names it: a gateway that did not would get an
    answer of max_tokens ending in "length"."""
    answer = client.chat.completions.create(model=KINDS["trtllm"], messages=[{"role": "user", "content": "stop"}],
                                            max_tokens=40)
    assert answer.choices[0].finish_reason == "stop"
    assert answer.usage.completion_tokens == EOS_AFTER_TOKENS + 1  # the end token counted, as engines count it


def test_trtllm_logprobs_structured_output_logit_bias_and_n(node, client):
    model = KINDS["trtllm"]
    messages = [{"role": "user", "content": "structured"}]
    answer = client.chat.completions.create(model=model, messages=messages, max_tokens=3, logprobs=True,
                                            top_logprobs=2, n=2, logit_bias={"15": 3}, seed=1)
    assert len(answer.choices) == 2
    for choice in answer.choices:
        assert len(choice.logprobs.content) == 3 and all(len(t.top_logprobs) == 2 for t in choice.logprobs.content)
    echoed = httpx2.post(node.url + "/v1/completions", json={"model": model, "prompt": "echo me", "max_tokens": 2,
                                                             "logprobs": 1, "echo": True}, timeout=30)
    assert echoed.status_code == 200, echoed.text
    assert echoed.json()["choices"][0]["logprobs"]["token_logprobs"][0] is None  # the prompt's first token
    shaped = client.chat.completions.create(model=model, messages=messages, max_tokens=60, response_format={
        "type": "json_schema", "json_schema": {"name": "x", "schema": {
            "type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}}})
    assert shaped.choices[0].message.content.lstrip().startswith("{")


def test_tokenspeed_n_and_choice_and_what_it_lacks(node, client):
    model = KINDS["tokenspeed"]
    messages = [{"role": "user", "content": "pick"}]
    answer = client.chat.completions.create(model=model, messages=messages, max_tokens=3, n=2, logprobs=True,
                                            top_logprobs=1)
    assert len(answer.choices) == 2 and len(answer.choices[1].logprobs.content) == 3
    choice = httpx2.post(node.url + "/v1/chat/completions", json={
        "model": model, "messages": messages, "max_tokens": 8, "guided_choice": ["left", "right"]}, timeout=30)
    assert choice.status_code == 200, choice.text
    assert choice.json()["choices"][0]["message"]["content"] in ("left", "right")
    with pytest.raises(openai.BadRequestError) as refused:
        client.completions.create(model=model, prompt="echo me", max_tokens=2, logprobs=1, echo=True)
    assert refused.value.code == "unsupported_by_engine" and "tokenspeed" in refused.value.message


@pytest.mark.parametrize("fields, param", [
    ({"n": 2}, "n"),
    ({"response_format": {"type": "json_object"}}, "response_format"),
    ({"min_tokens": 1}, "min_tokens"),
])
def test_mlx_refuses_what_its_proto_cannot_carry(client, fields, param):
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model=KINDS["mlx"], messages=[{"role": "user", "content": "x"}], max_tokens=2,
                                       **({"extra_body": fields} if "min_tokens" in fields else fields))
    assert refused.value.code == "unsupported_by_engine" and refused.value.param == param
    # ...and what it has still works: logprobs, a seed
    answer = client.chat.completions.create(model=KINDS["mlx"], messages=[{"role": "user", "content": "x"}],
                                            max_tokens=2, logprobs=True, top_logprobs=1, seed=-7)
    assert len(answer.choices[0].logprobs.content) == 2


def test_trtllm_embeds_and_the_others_say_they_do_not(client):
    vector = client.embeddings.create(model="trt-embed", input="a sentence").data[0].embedding
    assert len(vector) == 16
    with pytest.raises(openai.BadRequestError):
        client.embeddings.create(model=KINDS["mlx"], input="a sentence")


def test_kinds_without_prefill_decode_legs_are_refused_as_such(node, engines):
    r = httpx2.post(node.url + "/workers", headers=node.admin_headers, json={
        "url": engines["mlx"].url.replace("127.0.0.1", "localhost"), "worker_type": "prefill", "bootstrap_port": 9},
        timeout=30)
    assert r.status_code == 400 and "no prefill/decode legs" in r.text, r.text


def _png(color: "tuple[int, int, int]") -> str:
    import base64
    import io

    from PIL import Image
    buffer = io.BytesIO()
    Image.new("RGB", (64, 48), color).save(buffer, "PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


def test_tokenspeed_takes_images_as_items_and_answers_as_sglang_does(client):
    """Each image one item (its pixels, its grid, its range, its hash): the simulated engine folds what it received
    into its answer, so the same image through TokenSpeed's items and SGLang's one batch answers alike, and another
    image otherwise."""
    def ask(model: str, *colors) -> str:
        parts = [{"type": "image_url", "image_url": {"url": _png(c)}} for c in colors]
        return client.chat.completions.create(model=model, max_tokens=6, messages=[{"role": "user", "content": [
            *parts, {"type": "text", "text": "what is it?"}]}]).choices[0].message.content

    red, blue = (255, 0, 0), (0, 0, 255)
    assert ask("tokenspeed-vision", red, blue) == ask("sglang-vision", red, blue)
    assert ask("tokenspeed-vision", red) != ask("tokenspeed-vision", blue)


def test_trtllm_takes_each_images_own_bytes_beside_the_expanded_prompt(client):
    """TensorRT-LLM's engines decode and process images themselves: the simulated one counts each image's tokens with
    its own processor against the prompt's runs of the image token (a gateway that expanded otherwise, or sent other
    bytes, is refused) and folds the bytes into its answer. Videos are a 400 (its proto carries images only)."""
    def ask(model: str, *colors, **kwargs):
        parts = [{"type": "image_url", "image_url": {"url": _png(c)}} for c in colors]
        return client.chat.completions.create(model=model, max_tokens=6, messages=[{"role": "user", "content": [
            *parts, {"type": "text", "text": "what is it?"}]}], **kwargs)

    red, blue = (255, 0, 0), (0, 0, 255)
    both = ask("trtllm-vision", red, blue)
    assert both.usage.prompt_tokens == ask("sglang-vision", red, blue).usage.prompt_tokens  # expanded alike
    assert both.usage.prompt_tokens > ask("trtllm-vision").usage.prompt_tokens
    answers = {ask("trtllm-vision", *colors).choices[0].message.content for colors in ((red,), (blue,), (red, blue))}
    assert len(answers) == 3 and ask("trtllm-vision", red).choices[0].message.content in answers
    streamed = ask("trtllm-vision", red, blue, stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in streamed if c.choices) == both.choices[0].message.content
    video = "data:video/jpeg;base64," + _png(red).partition(",")[2]
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model="trtllm-vision", max_tokens=4, messages=[{"role": "user", "content": [
            {"type": "video_url", "video_url": {"url": video}}, {"type": "text", "text": "?"}]}])
    assert refused.value.body["code"] == "videos_not_supported" and "trtllm" in refused.value.body["message"]

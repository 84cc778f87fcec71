"""TokenSpeed's encode workers (EPD, gateway/engine/encode_workers.py) behind a node, driven with the openai SDK:
simulated encode engines (``--role encode --services tokenspeed-encoder``) take each image's pixels and hand the
embedding over on their bootstrap port; the simulated TokenSpeed prefill fetches each one by its room and folds it
into its answer (chaos/sim_engine/encode_stage.py). It refuses an item with pixels beside bootstrap info, and fails a
request whose room never fills: a node that sent the pixels to the prefill, paired items and rooms wrongly or skipped
an Encode would fail here."""

from __future__ import annotations

import base64
import io

import httpx2
import openai
import pytest

from chaos.processes import EngineProcess, NodeProcess
from tests.support.nodes import ENGINE_ARGS

MODEL = "ts-epd"


def _png(color: "tuple[int, int, int]", size: "tuple[int, int]" = (64, 48)) -> str:
    from PIL import Image
    buffer = io.BytesIO()
    Image.new("RGB", size, color).save(buffer, "PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


@pytest.fixture(scope="module")
def engines(log_dir):
    prefill = EngineProcess([*ENGINE_ARGS, "--services", "tokenspeed", "--vision", "--model-name", MODEL,
                             "--handover-timeout-s", "3"], log_dir, "epd-prefill")
    # The same model's encode workers: two, so that a request's images spread over them.
    encoders = [EngineProcess([*ENGINE_ARGS, "--services", "tokenspeed-encoder", "--role", "encode", "--vision",
                               "--model-name", MODEL, "--bootstrap-port", "0", "--handover-timeout-s", "3"],
                              log_dir, f"epd-encoder-{k}") for k in range(2)]
    yield prefill, encoders
    for engine in (prefill, *encoders):
        engine.stop()


@pytest.fixture(scope="module")
def node(engines, log_dir):
    prefill, encoders = engines
    flags = [flag for e in encoders for flag in ("--encode", e.url, str(e.bootstrap_port))]
    n = NodeProcess(["--worker-urls", prefill.url, *flags, "--health-check-interval-secs", "1"],
                    log_dir, "epd-node")
    yield n
    n.stop()


@pytest.fixture(scope="module")
def client(node):
    return openai.OpenAI(base_url=node.url + "/v1", api_key="unused", max_retries=0, timeout=30)


def _ask(client, model: str, *images: str) -> "openai.types.chat.ChatCompletion":
    parts = [{"type": "image_url", "image_url": {"url": url}} for url in images]
    return client.chat.completions.create(model=model, max_tokens=6, seed=5, messages=[{"role": "user", "content": [
        *parts, {"type": "text", "text": "what is it?"}]}])


def _encoded(node, outcome: str = "accepted") -> int:
    text = httpx2.get(node.url + "/metrics").text
    return sum(int(float(line.rsplit(" ", 1)[1])) for line in text.splitlines()
               if line.startswith(f'smg_epd_images_encoded_total{{outcome="{outcome}"}}'))


def test_each_image_is_encoded_on_an_encode_worker_and_reaches_the_prefill(client, node):
    red, blue, green = _png((255, 0, 0)), _png((0, 0, 255)), _png((0, 255, 0), (96, 64))
    before = _encoded(node)
    one, other = _ask(client, MODEL, red), _ask(client, MODEL, blue)
    # Each image's embedding came from an encode worker (the prefill had no pixels): different images, different
    # answers; the same image, the same answer.
    assert one.choices[0].message.content != other.choices[0].message.content
    assert _ask(client, MODEL, red).choices[0].message.content == one.choices[0].message.content
    three = _ask(client, MODEL, red, blue, green)  # three items, three rooms, spread over both workers
    assert three.choices[0].message.content not in (one.choices[0].message.content,
                                                    other.choices[0].message.content)
    streamed = client.chat.completions.create(model=MODEL, max_tokens=6, seed=5, stream=True, messages=[
        {"role": "user", "content": [{"type": "image_url", "image_url": {"url": red}},
                                     {"type": "text", "text": "what is it?"}]}])
    assert "".join(c.choices[0].delta.content or "" for c in streamed if c.choices) == \
        one.choices[0].message.content
    assert _encoded(node) - before == 7
    # Text alone needs no encode worker.
    assert client.chat.completions.create(model=MODEL, max_tokens=3, messages=[
        {"role": "user", "content": "hello"}]).choices[0].message.content


def test_an_encode_worker_that_is_gone_fails_the_request_with_a_503_and_the_node_goes_on(engines, log_dir):
    prefill, _ = engines
    # An encode worker that does not answer: the request fails before its prefill is sent (which would wait for a
    # room that never fills), and the prefill's circuit is not charged with it.
    n = NodeProcess(["--worker-urls", prefill.url, "--encode", "grpc://127.0.0.1:9", "--encode-timeout-secs", "2",
                     "--health-check-interval-secs", "1"], log_dir, "epd-node-gone")
    try:
        gone = openai.OpenAI(base_url=n.url + "/v1", api_key="unused", max_retries=0, timeout=30)
        for _ in range(6):  # past the circuit's failure threshold, were it charged
            with pytest.raises(openai.APIStatusError) as failed:
                _ask(gone, MODEL, _png((255, 0, 0)))
            assert failed.value.status_code == 503, failed.value.body
        assert _encoded(n, "failed") >= 6 and _encoded(n, "accepted") == 0
        circuits = [line for line in httpx2.get(n.url + "/metrics").text.splitlines()
                    if line.startswith("smg_circuit_breaker_state{")]
        assert len(circuits) == 1 and circuits[0].endswith(" 0.0"), circuits  # closed
        assert gone.chat.completions.create(model=MODEL, max_tokens=3, messages=[
            {"role": "user", "content": "hello"}]).choices[0].message.content
    finally:
        n.stop()


def _epd_request(room: int, encoder_port: int, pixels: bool = False):
    """A Generate of one 2 x 2-patch image (one image token) as the simulated prefill takes it under EPD, and the
    Encode of that image."""
    import numpy as np
    from smg_grpc_proto.generated import common_pb2
    from smg_grpc_proto.generated import tokenspeed_encoder_pb2 as te
    from smg_grpc_proto.generated import tokenspeed_scheduler_pb2 as ts

    from chaos.sim_engine.vision import IMAGE_TOKEN_ID, PATCH_VALUES
    from gateway.engine.runtimes.base import tensor

    def item(mm, with_pixels: bool):
        it = mm.items.add(modality=common_pb2.IMAGE, content_hash=b"\x01" * 32, placeholder_token_id=IMAGE_TOKEN_ID)
        tensor(it.model_specific_tensors["image_grid_thw"], np.array([[1, 2, 2]], dtype=np.int64), inline=True)
        it.placeholders.add(offset=1, length=1)
        if with_pixels:
            tensor(it.encoder_input, np.full((4, PATCH_VALUES), 0.25, dtype=np.float32), inline=True)

    generate = ts.GenerateRequest(request_id="epd-by-hand", stream=False)
    generate.sampling_params.max_new_tokens = 2
    generate.tokenized.input_ids.extend([9, IMAGE_TOKEN_ID, 10])
    item(generate.mm_inputs, pixels)
    generate.encode_bootstrap_info.items.add(item_index=0, bootstrap_host="127.0.0.1", bootstrap_port=encoder_port,
                                             bootstrap_room=room)
    encode = te.EncodeRequest(request_id="epd-by-hand-image")
    item(encode.mm_inputs, True)
    encode.items.add(bootstrap_room=room)
    return generate, encode


def test_the_simulated_prefill_refuses_what_real_engines_could_not_use(engines):
    # What the simulated engines hold a gateway to: the embedding fetched from the encode worker's room (one never
    # encoded fails the request, ABORTED after the hand-over timeout), no pixels beside bootstrap info.
    import grpc
    from smg_grpc_proto.generated import tokenspeed_encoder_pb2_grpc as te_grpc
    from smg_grpc_proto.generated import tokenspeed_scheduler_pb2_grpc as ts_grpc
    prefill, encoders = engines
    with grpc.insecure_channel(prefill.target) as to_prefill, grpc.insecure_channel(encoders[0].target) as to_encoder:
        scheduler, encoder = ts_grpc.TokenSpeedSchedulerStub(to_prefill), te_grpc.TokenSpeedEncoderStub(to_encoder)
        generate, encode = _epd_request(424242, encoders[0].bootstrap_port)
        assert encoder.Encode(encode, timeout=10).accepted
        answers = list(scheduler.Generate(generate, timeout=10))
        assert answers[-1].WhichOneof("response") == "complete"  # by hand, as the node does it
        never_encoded, _ = _epd_request(515151, encoders[0].bootstrap_port)
        with pytest.raises(grpc.RpcError) as lost:
            list(scheduler.Generate(never_encoded, timeout=10))
        assert lost.value.code() == grpc.StatusCode.ABORTED and "did not arrive" in lost.value.details()
        with_pixels, _ = _epd_request(616161, encoders[0].bootstrap_port, pixels=True)
        with pytest.raises(grpc.RpcError) as refused:
            list(scheduler.Generate(with_pixels, timeout=10))
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "no pixels" in refused.value.details()
        _, first = _epd_request(717171, encoders[0].bootstrap_port)
        assert encoder.Encode(first, timeout=10).accepted
        with pytest.raises(grpc.RpcError) as taken:  # a room whose embedding waits for its prefill is not reused
            encoder.Encode(first, timeout=10)
        assert taken.value.code() == grpc.StatusCode.ALREADY_EXISTS

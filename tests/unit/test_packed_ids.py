"""A long prompt's ids written into the request by gateway/engine/packed_ids.py: the engine must parse the message
upb would have made, for every engine kind, every id width, and with the request's other fields around them."""

from __future__ import annotations

import random

import pytest
from smg_grpc_proto.generated import vllm_engine_pb2 as vl

from gateway.engine import packed_ids
from gateway.engine.messages import Handover, SamplingOptions
from gateway.engine.packed_ids import PACKED_IDS_MIN, WithPromptIds, packed_varints, varint, with_prompt_ids
from gateway.engine.runtimes import ENGINE_RUNTIMES

# Each varint width's edges: one to four bytes.
EDGES = [0, 1, 127, 128, 129, 16383, 16384, 2 ** 21 - 1, 2 ** 21, 2 ** 28 - 1]
SEED = 20261201


def test_varints_are_upbs_at_every_width_edge_and_for_seeded_prompts():
    rng = random.Random(SEED)
    prompts = [EDGES, EDGES[::-1] * 300, [rng.choice(EDGES) for _ in range(5000)],
               [rng.randrange(0, 262_144) for _ in range(9000)]]  # Gemma's vocabulary: three bytes and more
    for ids in prompts:
        message = vl.GenerateRequest()
        message.tokenized.input_ids.extend(ids)
        expected = message.tokenized.SerializeToString()
        payload = packed_varints(ids)
        key = varint(message.tokenized.DESCRIPTOR.fields_by_name["input_ids"].number << 3 | 2)
        assert payload is not None and expected == key + varint(len(payload)) + payload, f"seed {SEED}"


def test_varint():
    for value in EDGES + [2 ** 32 - 1, 2 ** 35]:
        message = vl.SamplingParams(max_tokens=value) if value < 2 ** 32 else None
        if message is not None:
            assert message.SerializeToString().endswith(varint(value))
    assert varint(0) == b"\x00" and varint(300) == b"\xac\x02"


@pytest.mark.parametrize("ids", [[2 ** 28], [2 ** 32 - 1], [-1], [2 ** 32], [1.5]], ids=str)
def test_ids_outside_four_bytes_take_upbs_path(ids):
    assert packed_varints(ids * PACKED_IDS_MIN) is None
    prompt = [5] * PACKED_IDS_MIN + ids
    if ids[0] in (2 ** 28, 2 ** 32 - 1):  # a uint32 still: upb writes it (five bytes)
        made = with_prompt_ids(vl.GenerateRequest(), "tokenized", "input_ids", prompt)
        assert not isinstance(made, WithPromptIds) and list(made.tokenized.input_ids) == prompt
    else:  # not a uint32: upb says so, as before
        with pytest.raises((ValueError, TypeError)):
            with_prompt_ids(vl.GenerateRequest(), "tokenized", "input_ids", prompt)


def _both_ways(monkeypatch, build):
    """The request ``build()`` makes with packed ids, and the one upb's path makes (the threshold out of reach)."""
    made = build()
    monkeypatch.setattr(packed_ids, "PACKED_IDS_MIN", 1 << 40)
    reference = build()
    monkeypatch.undo()
    return made, reference


SAMPLING = SamplingOptions(max_new_tokens=7, temperature=0.5, top_k=3, stop_token_ids=(9,), seed=11, logprobs=2)


@pytest.mark.parametrize("kind", ["sglang", "vllm", "tokenspeed", "mlx", "trtllm"])
@pytest.mark.parametrize("length", [PACKED_IDS_MIN - 1, PACKED_IDS_MIN, 7_800])
def test_each_kinds_generate_request_parses_to_the_message_upb_makes(monkeypatch, kind, length):
    runtime = ENGINE_RUNTIMES.get(kind)
    if kind == "trtllm":
        runtime = runtime.bind(frozenset({2}), 151_936)
    rng = random.Random(SEED + length)
    ids = [rng.randrange(0, 151_936) for _ in range(length)]
    made, reference = _both_ways(monkeypatch, lambda: runtime.generate_request("req-9", ids, SAMPLING, True))
    assert isinstance(made, WithPromptIds) == (length >= PACKED_IDS_MIN)
    assert not isinstance(reference, WithPromptIds)
    parsed = type(reference).FromString(made.SerializeToString())
    assert parsed == reference, f"seed {SEED + length}"
    ids_field = "input_token_ids" if kind == "trtllm" else "input_ids"
    assert list(getattr(parsed.tokenized, ids_field)) == ids


def test_the_ids_merge_with_the_requests_fields_written_after_them(monkeypatch):
    """vLLM's decode leg: the prefill's transfer parameters set after the prompt; SGLang's bootstrap room."""
    ids = list(range(3000))
    vllm, sglang = ENGINE_RUNTIMES.get("vllm"), ENGINE_RUNTIMES.get("sglang")
    handover = Handover(kv_transfer_params_json='{"remote_host": "h"}')
    made, reference = _both_ways(monkeypatch, lambda: vllm.generate_request("r", ids, SAMPLING, False, handover))
    assert vl.GenerateRequest.FromString(made.SerializeToString()) == reference
    assert reference.kv_transfer_params_json == '{"remote_host": "h"}'
    room = Handover(bootstrap_host="10.0.0.1", bootstrap_port=8998, bootstrap_room=42)
    made, reference = _both_ways(monkeypatch, lambda: sglang.generate_request("r", ids, SAMPLING, False, room))
    parsed = type(reference).FromString(made.SerializeToString())
    assert parsed == reference and parsed.disaggregated_params.bootstrap_room == 42


@pytest.mark.parametrize("kind", ["sglang", "vllm", "trtllm"])
def test_embed_requests(monkeypatch, kind):
    runtime = ENGINE_RUNTIMES.get(kind)
    ids = [7] * 2500 + [200_000] * 10
    made, reference = _both_ways(monkeypatch, lambda: runtime.embed_request("e", ids))
    assert isinstance(made, WithPromptIds)
    assert type(reference).FromString(made.SerializeToString()) == reference


def test_a_short_or_empty_prompt_is_upbs_message_with_its_holder_present():
    for ids in ([], [1, 2, 3]):
        made = with_prompt_ids(vl.GenerateRequest(request_id="x"), "tokenized", "input_ids", ids)
        assert isinstance(made, vl.GenerateRequest) and made.HasField("tokenized")
        assert list(made.tokenized.input_ids) == ids


def test_the_holders_other_fields_are_written_once_with_the_ids():
    ids = list(range(PACKED_IDS_MIN))
    message = vl.GenerateRequest(request_id="r")
    message.tokenized.original_text = "the prompt"
    made = with_prompt_ids(message, "tokenized", "input_ids", ids)
    serialized = made.SerializeToString()
    assert serialized.count(b"the prompt") == 1
    parsed = vl.GenerateRequest.FromString(serialized)
    assert parsed.tokenized.original_text == "the prompt" and list(parsed.tokenized.input_ids) == ids

"""Which parsers a model gets (gateway/parsers/choice.py): the operator's, else by the model id (longest
pattern wins), else by the architecture its engine reports; none/passthrough turn a kind off."""

from __future__ import annotations

import pytest

from gateway.parsers.choice import choose


@pytest.mark.parametrize("model, architectures, expected", [
    ("Qwen/Qwen3-8B", (), ("qwen", "qwen3")),
    ("Qwen/Qwen3-Coder-30B-A3B-Instruct", (), ("qwen_coder", "qwen3")),  # a <think> it opens is reasoning
    ("deepseek-ai/DeepSeek-V3.1", (), ("deepseek31", "deepseek_v31")),
    ("deepseek-ai/DeepSeek-R1", (), ("deepseek", "deepseek_r1")),
    ("openai/gpt-oss-20b", (), ("gpt_oss", "gpt_oss")),
    ("MiniMaxAI/MiniMax-M2", (), ("minimax_m2", "minimax")),
    ("meta-llama/Llama-3.2-1B-Instruct", ("LlamaForCausalLM",), ("llama", None)),
    ("my-served-model", ("Qwen3ForCausalLM",), ("qwen", "qwen3")),  # the id says nothing: the architecture
    ("my-served-model", ("GptOssForCausalLM",), ("gpt_oss", "gpt_oss")),
    ("my-served-model", ("SomethingElse",), (None, None)),
    ("Qwen/Qwen3-Coder-30B", ("Qwen3MoeForCausalLM",), ("qwen_coder", "qwen3")),  # an id match wins
])
def test_by_id_then_architecture(model, architectures, expected):
    assert choose(model, architectures=architectures) == expected


def test_the_operator_decides_and_can_turn_a_kind_off():
    assert choose("Qwen/Qwen3-8B", "hermes", None) == ("hermes", "qwen3")
    assert choose("Qwen/Qwen3-8B", "none", "passthrough") == (None, None)
    assert choose("my-model", "none", None, architectures=("Qwen3ForCausalLM",)) == (None, "qwen3")

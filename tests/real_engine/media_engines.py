"""What the embedding and vision tests on real engines share: skip unless configured, a node before an engine,
our client and vLLM's own."""

from __future__ import annotations

import os

import openai
import pytest

from chaos.processes import NodeProcess, default_log_dir


def configured(*names: str) -> None:
    missing = [n for n in ("SMG_VLLM_PYTHON", *names) if not os.environ.get(n)]
    if missing:
        pytest.skip(f"set {', '.join(missing)} (tests/real_engine/setup_vllm.sh prints them)")


def node_on(engine_url: str, name: str, *flags: str) -> NodeProcess:
    return NodeProcess(["--worker-urls", engine_url, "--health-check-interval-secs", "2", *flags],
                       default_log_dir(), name)


def clients(node: NodeProcess, reference_url: str) -> "tuple[openai.OpenAI, openai.OpenAI]":
    return (openai.OpenAI(base_url=node.url + "/v1", api_key="x", max_retries=0, timeout=300),
            openai.OpenAI(base_url=reference_url + "/v1", api_key="x", max_retries=0, timeout=300))



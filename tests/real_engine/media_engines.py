"""What the embedding and vision tests on real engines share: skip unless configured, a node before an engine,
our client and vLLM's own."""

from __future__ import annotations

import contextlib
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




@contextlib.contextmanager
def vision_pair(model_variable: str, name: str, grpc_port: int, http_port: int,
                limits: str = '{"image": 3}', server_flags: "tuple[str, ...]" = (),
                node_flags: "tuple[str, ...]" = ()):
    """A vision model (its directory in ``model_variable``) served by a gRPC engine behind a node and by vLLM's own
    server, on the vision engines' PYTHONPATH (torchvision), each taking ``limits`` (vLLM's --limit-mm-per-prompt)
    (vLLM's server also ``server_flags``, the node ``node_flags``): yields our client, theirs and the model's name."""
    from .conftest import engine_pair  # (conftest imports this module's neighbours)
    configured(model_variable, "SMG_VLLM_VISION_PYTHONPATH")
    env = {"PYTHONPATH": os.environ["SMG_VLLM_VISION_PYTHONPATH"]}
    with engine_pair(name, os.environ[model_variable], grpc_port, http_port,
                     ["--limit-mm-per-prompt", limits], env, server_flags) as (grpc_url, http_url):
        node = node_on(grpc_url, f"node-{name}", *node_flags)
        try:
            ours, theirs = clients(node, http_url)
            yield ours, theirs, ours.models.list().data[0].id
        finally:
            node.stop()

"""Real processes on 127.0.0.1: simulated engines and smg-node, driven with the openai SDK."""

from __future__ import annotations

import httpx2
import openai
import pytest

from chaos.processes import EngineProcess, NodeProcess, default_log_dir
from chaos.sim_engine.output import derive_seed, output_token_ids, word_token_ids
from gateway.tokenizer.bundled import default_tokenizer_dir
from gateway.tokenizer.service import TokenizerService
from tests.support.nodes import ENGINE_ARGS



@pytest.fixture(scope="session")
def log_dir():
    return default_log_dir()


@pytest.fixture(scope="session")
def tokenizer():
    return TokenizerService.from_directory(default_tokenizer_dir())


@pytest.fixture(scope="session")
def predict(tokenizer):
    """The text a simulated engine generates for these prompt ids."""
    words = word_token_ids(default_tokenizer_dir() / "tokenizer.json")

    def text(prompt_ids, max_tokens, seed=None):
        return tokenizer.decode(output_token_ids(words, derive_seed(list(prompt_ids), seed), max_tokens))

    return text


@pytest.fixture(scope="session")
def engines(log_dir):
    started = [EngineProcess(ENGINE_ARGS, log_dir, f"engine{i}") for i in range(2)]
    yield started
    for e in started:
        e.stop()


@pytest.fixture(scope="session")
def node(engines, log_dir):
    n = NodeProcess(["--worker-urls", *[e.url for e in engines], "--health-check-interval-secs", "1",
                     "--max-payload-size", "2000000"], log_dir, "node")
    yield n
    n.stop()


@pytest.fixture(scope="session")
def client(node):
    return openai.OpenAI(base_url=node.url + "/v1", api_key="unused", max_retries=0, timeout=60)


@pytest.fixture(scope="session")
def http(node):
    with httpx2.Client(base_url=node.url, timeout=60, headers=node.admin_headers) as c:
        yield c



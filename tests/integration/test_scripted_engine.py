"""A simulated engine told what to answer (--script), end to end through a node with the openai SDK."""

from __future__ import annotations

import json

import openai
import pytest

from chaos.processes import EngineProcess, NodeProcess

ANSWER = "Paris is sunny, 21 degrees."


@pytest.fixture(scope="module")
def scripted_node(log_dir, tmp_path_factory):
    script = tmp_path_factory.mktemp("script") / "answers.jsonl"
    script.write_text(json.dumps({"match": "weather in Paris", "output": ANSWER}) + "\n"
                      + json.dumps({"match": "cut me", "output": "one two three four five", "finish": "length"})
                      + "\n")
    engine = EngineProcess(["--zero-cost", "--script", str(script)], log_dir, "scripted-engine")
    node = NodeProcess(["--worker-urls", engine.url], log_dir, "scripted-node")
    yield node
    node.stop()
    engine.stop()


def test_a_matching_prompt_gets_the_scripted_answer_streamed_or_not(scripted_node):
    client = openai.OpenAI(base_url=scripted_node.url + "/v1", api_key="x", max_retries=0)
    messages = [{"role": "user", "content": "What is the weather in Paris?"}]
    reply = client.chat.completions.create(model="qwen3-sim", messages=messages, max_tokens=64)
    assert reply.choices[0].message.content == ANSWER and reply.choices[0].finish_reason == "stop"
    chunks = client.chat.completions.create(model="qwen3-sim", messages=messages, max_tokens=64, stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == ANSWER
    cut = client.chat.completions.create(model="qwen3-sim", messages=[{"role": "user", "content": "cut me"}],
                                         max_tokens=64)
    assert cut.choices[0].message.content == "one two three four five" and cut.choices[0].finish_reason == "length"


def test_a_bad_script_is_refused_before_the_engine_listens(log_dir, tmp_path):
    script = tmp_path / "bad.jsonl"
    script.write_text('{"match": "(", "output": "x"}\n')
    with pytest.raises(RuntimeError):
        EngineProcess(["--script", str(script)], log_dir, "bad-script-engine")

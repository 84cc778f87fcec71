"""Scripted answers of the simulated engine (chaos/sim_engine/script.py): the file's rules, and the
engine streaming a matching rule's text as the tokenizer's ids, special tokens included."""

from __future__ import annotations

import asyncio
import json

import pytest
from tokenizers import Tokenizer

from chaos.sim_engine.config import SimEngineConfig
from chaos.sim_engine.core import GenerateParams, SimEngine
from chaos.sim_engine.script import Script, ScriptError
from gateway.tokenizer.bundled import default_tokenizer_dir

TOKENIZER = Tokenizer.from_file(str(default_tokenizer_dir() / "tokenizer.json"))
EOS = TOKENIZER.token_to_id("<|im_end|>")
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


def write(tmp_path, *rules) -> Script:
    path = tmp_path / "script.jsonl"
    path.write_text("\n".join(r if isinstance(r, str) else json.dumps(r) for r in rules) + "\n")
    return Script.load(path)


def test_the_first_matching_rule_wins(tmp_path):
    script = write(tmp_path, {"match": "weather", "output": "A"}, "", {"match": "(?s).*", "output": "B"})
    assert script.rule_for("what is the weather?").output == "A"
    assert script.rule_for("anything else").output == "B"


@pytest.mark.parametrize("line, error", [
    ("not json", "line 1"),
    ('{"match": "x"}', 'string "match" and "output"'),
    ('{"match": "(", "output": "x"}', "line 1"),
    ('{"match": "x", "output": "y", "finish": "tool_calls"}', '"finish"'),
    ('{"match": "x", "output": "y", "extra": 1}', "unknown keys extra"),
])
def test_a_bad_rule_is_refused_with_its_line(tmp_path, line, error):
    with pytest.raises(ScriptError, match=error):
        write(tmp_path, line)


def generate(engine: SimEngine, prompt: str, max_tokens: int | None = None, ignore_eos: bool = False):
    params = GenerateParams("r", TOKENIZER.encode(prompt, add_special_tokens=False).ids, max_tokens, frozenset(),
                            ignore_eos, None)

    async def run():
        return [step async for step in engine.generate(params)]

    steps = asyncio.run(run())
    return [t for s in steps for t in s.token_ids], steps[-1].finish_reason


def make_engine(tmp_path) -> SimEngine:
    script = write(tmp_path, {"match": "weather", "output": CALL},
                   {"match": "count", "output": "one two three", "finish": "length"})
    return SimEngine(SimEngineConfig.zero_cost(prefix_caching=False), (1, 2, 3), EOS, script, lambda: TOKENIZER)


def test_a_scripted_answer_streams_its_ids_special_tokens_included_then_eos(tmp_path):
    ids, finish = generate(make_engine(tmp_path), "<|im_start|>user\nweather in Paris?<|im_end|>")
    assert ids[-1] == EOS and finish == "stop"
    assert TOKENIZER.decode(ids[:-1], skip_special_tokens=False) == CALL
    assert TOKENIZER.token_to_id("<tool_call>") in ids  # one id, as the model emits it


def test_finish_length_max_tokens_and_ignore_eos(tmp_path):
    engine = make_engine(tmp_path)
    ids, finish = generate(engine, "count please")
    assert TOKENIZER.decode(ids) == "one two three" and finish == "length"
    ids, finish = generate(engine, "weather?", max_tokens=3)
    assert len(ids) == 3 and finish == "length"
    ids, finish = generate(engine, "weather?", ignore_eos=True)
    assert EOS not in ids and finish == "length"


def test_an_unmatched_prompt_gets_the_usual_words(tmp_path):
    ids, _ = generate(make_engine(tmp_path), "hello", max_tokens=4)
    assert len(ids) == 4 and set(ids) <= {1, 2, 3}

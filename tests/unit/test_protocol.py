"""Request validation: every bad input gets a 400 naming the parameter."""

import pytest

from gateway.api.errors import BadRequest
from gateway.api.protocol import parse_chat, parse_completion, parse_generate, parse_json_body

OK = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


@pytest.mark.parametrize("body, param", [
    ({"messages": OK["messages"]}, "model"),
    ({"model": "m"}, "messages"),
    ({"model": "m", "messages": []}, "messages"),
    ({"model": 3, "messages": OK["messages"]}, "model"),
    ({**OK, "messages": ["hi"]}, "messages[0]"),
    ({**OK, "messages": [{"role": "robot", "content": "x"}]}, "messages[0].role"),
    ({**OK, "messages": [{"role": "user", "content": 5}]}, "messages[0].content"),
    ({**OK, "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]},
     "messages[0].content[0]"),
    ({**OK, "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x",
                                                                                        "detail": "max"}}]}]},
     "messages[0].content[0]"),
    ({**OK, "messages": [{"role": "assistant", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
     "messages[0].content"),
    ({**OK, "messages": [{"role": "user", "content": [{"type": "input_audio", "input_audio": {}}]}]},
     "messages[0].content[0]"),
    ({**OK, "max_tokens": 0}, "max_tokens"),
    ({**OK, "max_tokens": "10"}, "max_tokens"),
    ({**OK, "max_tokens": True}, "max_tokens"),
    ({**OK, "temperature": 3}, "temperature"),
    ({**OK, "top_p": 0}, "top_p"),
    ({**OK, "top_k": 0}, "top_k"),
    ({**OK, "n": 17}, "n"),
    ({**OK, "stop": 5}, "stop"),
    ({**OK, "stop": ["a"] * 17}, "stop"),
    ({**OK, "stream": "yes"}, "stream"),
    ({**OK, "logprobs": "yes"}, "logprobs"),
    ({**OK, "logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    ({**OK, "top_logprobs": 3}, "top_logprobs"),
    ({**OK, "response_format": {"type": "xml"}}, "response_format.type"),
        ({**OK, "response_format": {"type": "json_object"}, "regex": "a+"}, "regex"),
        ({**OK, "logit_bias": {"x": 1}}, "logit_bias"),
        ({**OK, "logit_bias": {"5": 101}}, "logit_bias"),
    ({**OK, "seed": 2 ** 64}, "seed"),
])
def test_bad_chat_requests_name_the_parameter(body, param):
    with pytest.raises(BadRequest) as e:
        parse_chat(body)
    assert e.value.param == param and e.value.status == 400


def test_good_chat_request_parses():
    chat = parse_chat({**OK, "max_completion_tokens": 7, "stop": "x", "stream": True,
                       "stream_options": {"include_usage": True},
                       "messages": [{"role": "developer", "content": [{"type": "text", "text": "a"},
                                                                      {"type": "text", "text": "b"}]}]})
    assert chat.sampling.max_tokens == 7 and chat.sampling.stop == ("x",)
    assert chat.include_usage and chat.messages == [{"role": "system", "content": "ab"}]


@pytest.mark.parametrize("raw, code", [(b"{", "invalid_json"), (b"[1]", "invalid_json"),
                                       (b'{"a": "\xff"}', "invalid_encoding")])
def test_malformed_bodies(raw, code):
    with pytest.raises(BadRequest) as e:
        parse_json_body(raw)
    assert e.value.code == code


def test_image_parts_become_template_parts_and_image_references():
    chat = parse_chat({**OK, "messages": [
        {"role": "system", "content": [{"type": "text", "text": "Be "}, {"type": "text", "text": "brief."}]},
        {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "https://a/1.png", "detail": "low"}},
                                     {"type": "text", "text": "and"},
                                     {"type": "image_url", "image_url": "data:image/png;base64,AA=="}]}]})
    assert chat.messages[0]["content"] == "Be brief."  # text parts alone are one string, as before
    assert chat.messages[1]["content"] == [{"type": "image"}, {"type": "text", "text": "and"}, {"type": "image"}]
    assert [(i.url, i.where, i.detail) for i in chat.images] == [
        ("https://a/1.png", "messages[1].content[0]", "low"), ("data:image/png;base64,AA==", "messages[1].content[2]",
                                                               "auto")]


def test_completion_prompt_forms():
    assert parse_completion({"model": "m", "prompt": "x"}).prompt_text == "x"
    assert parse_completion({"model": "m", "prompt": [1, 2]}).prompt_ids == (1, 2)
    assert parse_completion({"model": "m", "prompt": [[1, 2]]}).prompt_ids == (1, 2)
    assert parse_completion({"model": "m", "prompt": "x"}).sampling.max_tokens == 16
    for bad in ("", [], ["a", "b"], [-1], 5, None):
        with pytest.raises(BadRequest):
            parse_completion({"model": "m", "prompt": bad})


def test_generate_needs_exactly_one_input():
    assert parse_generate({"text": "x", "sampling_params": {"max_new_tokens": 3}}).sampling.max_tokens == 3
    assert parse_generate({"input_ids": [1, 2]}).input_ids == (1, 2)
    for bad in ({}, {"text": "x", "input_ids": [1]}, {"text": ""}, {"input_ids": ["a"]}):
        with pytest.raises(BadRequest):
            parse_generate(bad)


def test_spliced_text_chunk_events_equal_the_rendered_ones():
    from gateway.api.http import sse_event
    from gateway.api.openai import OpenAIShape
    for chat in (True, False):
        for index in (0, 3):
            shape = OpenAIShape(chat, "chatcmpl-abc", 'model "quoted"', index=index)
            for text in ["hi", "", 'é "q" \n\u2028 \\', "\x00text\x00", "🎉" * 3]:
                assert shape.text_event(text, first=False) == sse_event(shape.chunk(text, None)), text


@pytest.mark.parametrize("extra, thinking, template_kwargs", [
    ({}, True, {}),
    ({"reasoning_effort": "none"}, False, {"reasoning_effort": "none", "enable_thinking": False, "thinking": False}),
    ({"reasoning_effort": "minimal"}, False,
     {"reasoning_effort": "minimal", "enable_thinking": False, "thinking": False}),
    # An effort asks for thinking: templates whose switch is off by default (DeepSeek V3.1) turn it on.
    ({"reasoning_effort": "high"}, True, {"reasoning_effort": "high", "enable_thinking": True, "thinking": True}),
    ({"chat_template_kwargs": {"enable_thinking": False}}, False, {"enable_thinking": False}),
    ({"chat_template_kwargs": {"thinking": False}}, False, {"thinking": False}),
    ({"reasoning_effort": "none", "chat_template_kwargs": {"enable_thinking": True}}, False,
     {"reasoning_effort": "none", "enable_thinking": True, "thinking": False}),
])
def test_reasoning_effort_and_template_switches_turn_thinking_off(extra, thinking, template_kwargs):
    chat = parse_chat({**OK, **extra})
    assert (chat.thinking, chat.template_kwargs) == (thinking, template_kwargs)


def test_a_bad_reasoning_effort_and_stream_reasoning_are_400s():
    with pytest.raises(BadRequest) as e:
        parse_chat({**OK, "reasoning_effort": "extreme"})
    assert e.value.param == "reasoning_effort"
    with pytest.raises(BadRequest) as e:
        parse_chat({**OK, "stream_reasoning": "no"})
    assert e.value.param == "stream_reasoning"
    assert parse_chat({**OK, "stream_reasoning": False}).stream_reasoning is False


@pytest.mark.parametrize("part, modality", [
    ({"type": "video", "video": "https://example.com/v.mp4"}, "video"),
    ({"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}}, "audio"),
    ({"type": "audio_url", "audio_url": {"url": "https://example.com/a.wav"}}, "audio"),
])
def test_audio_parts_and_videos_not_as_video_url_are_refused_naming_the_families_taken(part, modality):
    with pytest.raises(BadRequest) as refused:
        parse_chat({"model": "m", "messages": [{"role": "user", "content": [{"type": "text", "text": "x"}, part]}]})
    assert refused.value.code == "unsupported_modality" and refused.value.param == "messages[0].content[1]"
    assert f"{modality} inputs are not taken" in str(refused.value) and "qwen2_vl" in str(refused.value)


def test_a_video_url_part_is_a_video_in_the_template_and_the_request():
    chat = parse_chat({"model": "m", "messages": [
        {"role": "user", "content": [{"type": "video_url", "video_url": {"url": "data:video/jpeg;base64,AAAA,BBBB"}},
                                     {"type": "text", "text": "what happens?"},
                                     {"type": "image_url", "image_url": {"url": "https://example.com/i.png"}}]}]})
    assert chat.messages[0]["content"] == [{"type": "video"}, {"type": "text", "text": "what happens?"},
                                           {"type": "image"}]
    assert [(v.url, v.where, v.modality) for v in chat.videos] == [
        ("data:video/jpeg;base64,AAAA,BBBB", "messages[0].content[0]", "video")]
    assert [i.modality for i in chat.images] == ["image"]
    for bad in ({}, {"url": ""}, 7):
        with pytest.raises(BadRequest) as refused:
            parse_chat({"model": "m", "messages": [{"role": "user", "content": [{"type": "video_url",
                                                                                 "video_url": bad}]}]})
        assert refused.value.param == "messages[0].content[0]" and "video_url needs a url" in str(refused.value)

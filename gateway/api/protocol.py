"""The internal request types, the checks of client fields every API's translation uses, and OpenAI's bodies.

Every front API turns its body into the same typed request: ``ChatRequest`` (made only by
``chat_request``, which applies the rules across fields: a required or named ``tool_choice`` becomes
the engine's constraint), with its ``SamplingRequest``. OpenAI's bodies are read here (``parse_chat``,
``parse_completion``, and SGLang's ``parse_generate``); Anthropic's Messages and the Responses API read
theirs in their own modules with the same field checks (``field``, ``number``, ``positive_int``,
``stop_strings``). Everything that arrives from a client is checked, with a 400 naming the offending
parameter; handlers receive only well-typed values. Unknown fields are ignored, as OpenAI-compatible
servers do.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import orjson

from ..media.families import IMAGE_PROCESSORS
from ..media.service import ImageRef, VideoRef
from ..media.video import VIDEO_MODEL_TYPES
from ..serving.chat import ChatRequest, SamplingRequest
from .errors import BadRequest, shown, type_name
from .structured import parse_constraint, tool_call_schema
from .tools import NO_TOOLS, ToolSpec, parse_tools

STOP_STRINGS_MAX = 16
STOP_STRING_CHARS_MAX = 1024
REQUEST_ID_CHARS_MAX = 128
MESSAGES_MAX = 10_000
# Answers per request: each is a full generation on the engine (its prefill shared), so a bound well
# above what clients use (OpenAI allows 128) keeps one request from taking a whole batch.
N_MAX = 16
TOP_LOGPROBS_MAX = 20  # OpenAI's bound for chat top_logprobs; completions' logprobs gets the same (vLLM's)
# Integers go into the engines' protobuf fields, the narrowest of which (smg-grpc-proto: top_k and
# vLLM's seed are int32; max/min tokens, stop token ids are uint32) bound what we accept, so a
# client's 2^63 - 1 is a 400 here rather than a ValueError (a 500) in the engine client.
INT32_MAX = 2 ** 31 - 1
UINT32_MAX = 2 ** 32 - 1
# Keys of chat_template_kwargs the gateway itself passes to templates: a client must not replace the
# conversation, the tools, or the special tokens the template wraps turns in.
RESERVED_TEMPLATE_KWARGS = frozenset({"messages", "tools", "add_generation_prompt", "documents",
                                      "continue_final_message", "raise_exception", "strftime_now"})
_MISSING = object()


def parse_json_body(body: bytes) -> dict[str, Any]:
    try:
        value = orjson.loads(body)
    except orjson.JSONDecodeError as e:
        # orjson refuses invalid UTF-8 with the same error type; say which it was.
        try:
            body.decode("utf-8")
        except UnicodeDecodeError:
            raise BadRequest("request body is not valid UTF-8", code="invalid_encoding") from None
        raise BadRequest(f"request body is not valid JSON: {e}", code="invalid_json") from None
    if not isinstance(value, dict):
        raise BadRequest("request body must be a JSON object", code="invalid_json")
    return value


def field(body: dict[str, Any], name: str, kinds: "type | tuple[type, ...]", default: Any = _MISSING,
           *, nullable: bool = True) -> Any:
    value = body.get(name, _MISSING)
    if value is _MISSING or (value is None and nullable):
        if default is _MISSING:
            raise BadRequest(f"'{name}' is required", param=name, code="missing_required_parameter")
        return default
    # bool is an int in Python; JSON true is not a number.
    if isinstance(value, bool) and bool not in (kinds if isinstance(kinds, tuple) else (kinds,)):
        raise BadRequest(f"'{name}' must be {_kind_name(kinds)}, not a boolean", param=name, code="invalid_type")
    if not isinstance(value, kinds):
        raise BadRequest(f"'{name}' must be {_kind_name(kinds)}, got {type_name(value)} ({shown(value)})", param=name,
                         code="invalid_type")
    return value


def _kind_name(kinds: "type | tuple[type, ...]") -> str:
    names = {bool: "a boolean", int: "an integer", float: "a number", str: "a string", list: "an array",
             dict: "an object"}
    kinds = kinds if isinstance(kinds, tuple) else (kinds,)
    return " or ".join(dict.fromkeys(names.get(k, k.__name__) for k in kinds if not (k is int and float in kinds)))


def number(body: dict[str, Any], name: str, lo: float, hi: float, default: Any = None) -> float | None:
    value = field(body, name, (int, float), default)
    if value is None:
        return None
    if not lo <= value <= hi:
        raise BadRequest(f"'{name}' must be between {lo} and {hi}, got {value}", param=name, code="invalid_value")
    return float(value)


def positive_int(body: dict[str, Any], name: str, default: Any = None, minimum: int = 1,
                  maximum: int = INT32_MAX) -> int | None:
    value = field(body, name, int, default)
    if value is not None and not minimum <= value <= maximum:
        raise BadRequest(f"'{name}' must be between {minimum} and {maximum}, got {value}", param=name,
                         code="invalid_value")
    return value


def stop_strings(body: dict[str, Any], name: str = "stop") -> tuple[str, ...]:
    value = field(body, name, (str, list), None)
    if value is None:
        return ()
    stops = [value] if isinstance(value, str) else value
    if len(stops) > STOP_STRINGS_MAX:
        raise BadRequest(f"'{name}' has more than {STOP_STRINGS_MAX} entries", param=name, code="invalid_value")
    for s in stops:
        if not isinstance(s, str):
            raise BadRequest(f"'{name}' must be a string or an array of strings", param=name, code="invalid_type")
        if len(s) > STOP_STRING_CHARS_MAX:
            raise BadRequest(f"a '{name}' string is longer than {STOP_STRING_CHARS_MAX} characters", param=name,
                             code="invalid_value")
    return tuple(s for s in stops if s)


def token_ids(value: Any, name: str) -> tuple[int, ...]:
    if not isinstance(value, list) or not all(isinstance(t, int) and not isinstance(t, bool) and 0 <= t <= UINT32_MAX
                                              for t in value):
        raise BadRequest(f"'{name}' must be an array of token ids (integers from 0)", param=name,
                         code="invalid_type")
    return tuple(value)


LOGIT_BIAS_ENTRIES_MAX = 4096


def _logit_bias(body: dict[str, Any]) -> "tuple[tuple[int, float], ...]":
    """OpenAI's logit_bias: token ids (as JSON object keys, so strings) to a bias from -100 to 100."""
    value = field(body, "logit_bias", dict, None)
    if not value:
        return ()
    if len(value) > LOGIT_BIAS_ENTRIES_MAX:
        raise BadRequest(f"'logit_bias' has more than {LOGIT_BIAS_ENTRIES_MAX} entries", param="logit_bias",
                         code="invalid_value")
    biases = []
    for key, bias in value.items():
        if not (isinstance(key, str) and key.isdigit() and int(key) <= UINT32_MAX):
            raise BadRequest(f"logit_bias keys must be token ids, got {key!r}", param="logit_bias",
                             code="invalid_value")
        if isinstance(bias, bool) or not isinstance(bias, (int, float)) or not -100 <= bias <= 100:
            raise BadRequest(f"logit_bias values must be numbers from -100 to 100, got {bias!r} for {key}",
                             param="logit_bias", code="invalid_value")
        biases.append((int(key), float(bias)))
    return tuple(biases)


# Fields that constrain the output (api/structured.py): most requests carry none, and one set
# lookup against the body's keys says so.
_CONSTRAINT_FIELDS = frozenset({"response_format", "regex", "guided_regex", "ebnf", "grammar", "guided_grammar",
                                "structural_tag", "choice", "guided_choice", "guided_json", "json_schema"})


def temperature_value(body: dict[str, Any]) -> float | None:
    return number(body, "temperature", 0.0, 2.0)


def top_p_value(body: dict[str, Any]) -> float | None:
    top_p = number(body, "top_p", 0.0, 1.0)
    if top_p is not None and top_p == 0:
        raise BadRequest("'top_p' must be greater than 0", param="top_p", code="invalid_value")
    return top_p


def top_k_value(body: dict[str, Any]) -> int | None:
    top_k = field(body, "top_k", int, None)
    if top_k is not None and top_k != -1 and not 1 <= top_k <= INT32_MAX:
        raise BadRequest(f"'top_k' must be -1 (off) or between 1 and {INT32_MAX}", param="top_k",
                         code="invalid_value")
    return top_k


# Sampling fields most requests leave out: looked at one by one only when the body has one of them.
_RARELY_SET = frozenset({"top_k", "stop_token_ids", "seed", "min_p", "stop", "frequency_penalty", "presence_penalty",
                         "repetition_penalty", "min_tokens", "skip_special_tokens", "include_stop_str_in_output",
                         "logit_bias"})


def parse_sampling(body: dict[str, Any], max_tokens_names: "tuple[str, ...]") -> SamplingRequest:
    max_tokens = None
    for name in max_tokens_names:
        value = positive_int(body, name)
        if value is not None:
            max_tokens = value
            break
    n = positive_int(body, "n", 1, maximum=N_MAX) if "n" in body else 1
    top_p = top_p_value(body)
    constraint = constraint_field = None
    if not _CONSTRAINT_FIELDS.isdisjoint(body):
        constraint, constraint_field = parse_constraint(body)
    sampling = SamplingRequest(max_tokens=max_tokens, temperature=temperature_value(body), top_p=top_p,
                               ignore_eos=field(body, "ignore_eos", bool, False), constraint=constraint,
                               constraint_field=constraint_field, n=n)
    if not _RARELY_SET.isdisjoint(body):  # else each keeps SamplingRequest's default, as each check below gives
        _rarely_set(body, sampling)
    return sampling


def _rarely_set(body: dict[str, Any], sampling: SamplingRequest) -> None:
    """The ``_RARELY_SET`` fields of ``body`` into ``sampling``, checked."""
    sampling.top_k = top_k_value(body)
    if body.get("stop_token_ids"):
        sampling.stop_token_ids = token_ids(body["stop_token_ids"], "stop_token_ids")
    seed = field(body, "seed", int, None)
    if seed is not None and not -INT32_MAX - 1 <= seed <= INT32_MAX:
        raise BadRequest(f"'seed' must be a 32-bit integer (between {-INT32_MAX - 1} and {INT32_MAX})", param="seed",
                         code="invalid_value")
    sampling.seed = seed
    sampling.min_p = number(body, "min_p", 0.0, 1.0)
    sampling.stop = stop_strings(body)
    sampling.frequency_penalty = number(body, "frequency_penalty", -2.0, 2.0) or 0.0
    sampling.presence_penalty = number(body, "presence_penalty", -2.0, 2.0) or 0.0
    sampling.repetition_penalty = number(body, "repetition_penalty", 0.01, 10.0)
    sampling.min_tokens = positive_int(body, "min_tokens", 0, minimum=0)
    sampling.skip_special_tokens = field(body, "skip_special_tokens", bool, True)
    sampling.include_stop_str_in_output = field(body, "include_stop_str_in_output", bool, False)
    if "logit_bias" in body:
        sampling.logit_bias = _logit_bias(body)


def _unsupported(body: dict[str, Any], *names: str) -> None:
    for name in names:
        value = body.get(name)
        if value not in (None, False, 0, [], {}):
            raise BadRequest(f"'{name}' is not supported by this gateway yet", param=name, code="unsupported_parameter")


def _message_content(message: dict[str, Any], index: int, images: "list[ImageRef]", videos: "list[VideoRef]"
                     ) -> "str | list[dict[str, Any]]":
    """A message's content for the template: its text, or (a user message with images or videos) its parts in
    order, each image an ``{"type": "image"}`` part and each video a ``{"type": "video"}`` one (what Qwen2-VL's
    template reads), the images and videos themselves appended to ``images`` and ``videos``."""
    content = message.get("content")
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts: list[dict[str, Any]] = []
        for j, part in enumerate(content):
            kind = part.get("type") if isinstance(part, dict) else type(part).__name__
            if kind == "text" and isinstance(part.get("text"), str):
                parts.append(text_part(part["text"]))
            elif kind == "image_url" and message.get("role") == "user":
                where = f"messages[{index}].content[{j}]"
                parts.append(image_part(_image_url(part.get("image_url"), where), where, images))
            elif kind == "video_url" and message.get("role") == "user":
                where = f"messages[{index}].content[{j}]"
                videos.append(VideoRef(_media_url(part.get("video_url"), where, "video_url"), where))
                parts.append({"type": "video"})
            elif kind in MEDIA_PARTS:
                raise BadRequest(f"messages[{index}].content[{j}]: {MEDIA_PARTS[kind]} inputs are not taken here: "
                                 "images are, for the families " + ", ".join(IMAGE_PROCESSORS) + ", and videos "
                                 "(as video_url parts) for " + ", ".join(VIDEO_MODEL_TYPES),
                                 param=f"messages[{index}].content[{j}]", code="unsupported_modality")
            else:
                raise BadRequest(f"messages[{index}].content[{j}]: a part must be text (or image_url in a user "
                                 f"message), got {kind!r}", param=f"messages[{index}].content", code="unsupported_content")
        return template_content(parts)
    raise BadRequest(f"messages[{index}].content must be a string or an array of text parts",
                     param=f"messages[{index}].content", code="invalid_type")


# Chat parts of the other modalities vLLM's server takes (its audio_url, OpenAI's input_audio; a video other than as
# a user's video_url): refused by name, with the families this node preprocesses.
MEDIA_PARTS = {"video_url": "video", "audio_url": "audio", "input_audio": "audio", "video": "video"}


def _media_url(value: Any, where: str, kind: str) -> str:
    """A ``video_url`` part's URL: {"url": ...} (or the URL alone)."""
    if isinstance(value, str):
        value = {"url": value}
    if not isinstance(value, dict) or not isinstance(value.get("url"), str) or not value["url"]:
        raise BadRequest(f"{where}: {kind} needs a url (https://..., data:video/mp4;base64,... or "
                         "data:video/jpeg;base64,<frame>,<frame>,...)", param=where, code="invalid_value")
    return value["url"]


def _image_url(value: Any, where: str) -> "tuple[str, str]":
    """OpenAI's image_url: {"url", "detail"} (or the URL alone, as some clients send it)."""
    if isinstance(value, str):
        value = {"url": value}
    if not isinstance(value, dict) or not isinstance(value.get("url"), str) or not value["url"]:
        raise BadRequest(f"{where}: image_url needs a url (https://... or data:image/...;base64,...)", param=where,
                         code="invalid_value")
    detail = value.get("detail", "auto")
    if detail not in IMAGE_DETAILS:
        raise BadRequest(f"{where}: image_url.detail must be one of {', '.join(IMAGE_DETAILS)}", param=where,
                         code="invalid_value")
    return value["url"], detail


IMAGE_DETAILS = ("auto", "low", "high")


def text_part(text: str) -> dict[str, Any]:
    return {"type": "text", "text": text}


def image_part(url_and_detail: "tuple[str, str]", where: str, images: "list[ImageRef]") -> dict[str, Any]:
    """The template's part for an image (what vision models' templates read), the image itself into ``images``."""
    url, detail = url_and_detail
    images.append(ImageRef(url, where, detail))
    return {"type": "image"}


def template_content(parts: "list[dict[str, Any]]") -> "str | list[dict[str, Any]]":
    """Parts as the template takes them: text alone joined into one string (every template reads that), parts
    kept as they are when an image is among them."""
    if all(part["type"] == "text" for part in parts):
        return "".join(part["text"] for part in parts)
    return parts


_ROLES = frozenset({"system", "developer", "user", "assistant", "tool"})


def parse_chat(body: dict[str, Any]) -> ChatRequest:
    """OpenAI's chat completions body as the internal chat request."""
    model = field(body, "model", str)
    raw_messages = field(body, "messages", list)
    if not raw_messages:
        raise BadRequest("'messages' must not be empty", param="messages", code="invalid_value")
    check_message_count(len(raw_messages), "messages")
    messages: list[dict[str, Any]] = []
    images: list[ImageRef] = []
    videos: list[VideoRef] = []
    for i, m in enumerate(raw_messages):
        if not isinstance(m, dict):
            raise BadRequest(f"messages[{i}] must be an object, got {type_name(m)}", param=f"messages[{i}]",
                             code="invalid_type")
        role = m.get("role")
        if role not in _ROLES:
            raise BadRequest(f"Invalid value for messages[{i}].role: {shown(role)}. Supported values are: "
                             f"{', '.join(map(repr, sorted(_ROLES)))}.", param=f"messages[{i}].role",
                             code="invalid_value")
        message = dict(m)
        message["role"] = "system" if role == "developer" else role
        message["content"] = _message_content(m, i, images, videos)
        messages.append(message)
    _unsupported(body, "audio", "prediction")
    stream = field(body, "stream", bool, False)
    stream_options = field(body, "stream_options", dict, {})
    tools = parse_tools(body)
    template_kwargs = dict(field(body, "chat_template_kwargs", dict, {}))
    for key in template_kwargs:
        if key in RESERVED_TEMPLATE_KWARGS or key.endswith("_token") or key.startswith("_") or not key.isidentifier():
            raise BadRequest(f"chat_template_kwargs may not set {key!r}: the gateway passes it",
                             param="chat_template_kwargs", code="invalid_value")
    thinking = thinking_of(template_kwargs)
    if "reasoning_effort" in body:
        thinking = apply_reasoning_effort(field(body, "reasoning_effort", str, None), template_kwargs,
                                          "reasoning_effort") and thinking
    sampling = parse_sampling(body, ("max_completion_tokens", "max_tokens"))
    if "logprobs" in body or "top_logprobs" in body:
        top = positive_int(body, "top_logprobs", None, minimum=0, maximum=TOP_LOGPROBS_MAX)
        if field(body, "logprobs", bool, False):
            sampling.logprobs = top or 0
        elif top:
            raise BadRequest("'top_logprobs' needs 'logprobs': true", param="top_logprobs", code="invalid_value")
    return chat_request(
        model, messages, sampling, stream=stream,
        include_usage=bool(stream_options.get("include_usage")) if stream else False,
        tools=tools, template_kwargs=template_kwargs,
        separate_reasoning=field(body, "separate_reasoning", bool, True) if "separate_reasoning" in body else True,
        special_tokens_in_content=field(body, "special_tokens_in_content", bool, False)
        if "special_tokens_in_content" in body else False,
        stream_reasoning=field(body, "stream_reasoning", bool, True) if "stream_reasoning" in body else True,
        thinking=thinking, images=tuple(images), videos=tuple(videos),
        media_kwargs=field(body, "mm_processor_kwargs", dict, None) if "mm_processor_kwargs" in body else None,
        media_io_kwargs=field(body, "media_io_kwargs", dict, None) if "media_io_kwargs" in body else None)


def chat_request(model: str, messages: "list[dict[str, Any]]", sampling: SamplingRequest, *, stream: bool = False,
                 include_usage: bool = False, tools: ToolSpec = NO_TOOLS,
                 template_kwargs: "dict[str, Any] | None" = None, separate_reasoning: bool = True,
                 special_tokens_in_content: bool = False, stream_reasoning: bool = True,
                 thinking: bool = True, images: "tuple[ImageRef, ...]" = (),
                 reasoning_budget: int | None = None, videos: "tuple[VideoRef, ...]" = (),
                 media_kwargs: "dict[str, Any] | None" = None,
                 media_io_kwargs: "dict[str, Any] | None" = None) -> ChatRequest:
    """The chat request every API's translation ends in, with the rule across its fields: ``tool_choice``
    required or a named function is the engine's constraint (api/structured.py), which no other constraint
    may join. ``messages`` are the chat template's messages, checked by the caller."""
    if tools.choice == "required" or tools.choice == "named":
        if sampling.constraint is not None:
            raise BadRequest(f"tool_choice '{tools.choice if tools.name is None else tools.name}' constrains the "
                             f"output to tool calls; it cannot be combined with '{sampling.constraint_field}'",
                             param=sampling.constraint_field, code="conflicting_constraints")
        sampling.constraint = tool_call_schema(tools.tools, tools.name, tools.parallel)
        sampling.constraint_field = "tool_choice"
    return ChatRequest(
        model=model, messages=messages, sampling=sampling, stream=stream, include_usage=include_usage,
        tools=tools.tools, tool_choice=tools.choice,
        template_kwargs=template_kwargs if template_kwargs is not None else {},
        separate_reasoning=separate_reasoning, special_tokens_in_content=special_tokens_in_content,
        tool_name=tools.name, stream_reasoning=stream_reasoning, thinking=thinking, images=images,
        parallel_tool_calls=tools.parallel, reasoning_budget=reasoning_budget, videos=videos,
        media_kwargs=media_kwargs, media_io_kwargs=media_io_kwargs)


def check_message_count(count: int, param: str) -> None:
    if count > MESSAGES_MAX:
        raise BadRequest(f"'{param}' has more than {MESSAGES_MAX} entries", param=param, code="invalid_value")


def thinking_of(template_kwargs: dict[str, Any]) -> bool:
    """Whether the template's thinking stays on: not when the kwargs turn it off (Qwen3's ``enable_thinking``,
    DeepSeek V3.1's ``thinking``)."""
    return not template_kwargs or (template_kwargs.get("enable_thinking") is not False
                                   and template_kwargs.get("thinking") is not False)


REASONING_EFFORTS = ("none", "minimal", "low", "medium", "high")


def apply_reasoning_effort(effort: str | None, template_kwargs: dict[str, Any], param: str) -> bool:
    """OpenAI's reasoning effort (chat's ``reasoning_effort``, the Responses API's ``reasoning.effort``), for the
    chat template: ``none`` and ``minimal`` turn thinking off (Qwen3's ``enable_thinking``, DeepSeek V3.1's
    ``thinking``); any effort goes to templates that read it (gpt-oss). What the client set in
    chat_template_kwargs wins. Whether thinking stays on."""
    if effort is None:
        return True
    if effort not in REASONING_EFFORTS:
        raise BadRequest(f"Invalid value for '{param}': {shown(effort)}. Supported values are: "
                         f"{', '.join(map(repr, REASONING_EFFORTS))}.", param=param, code="invalid_value")
    template_kwargs.setdefault("reasoning_effort", effort)
    if effort in ("none", "minimal"):
        template_kwargs.setdefault("enable_thinking", False)
        template_kwargs.setdefault("thinking", False)
        return False
    # An effort asks for reasoning: models that think only when asked (DeepSeek V3.1's ``thinking``) are asked.
    template_kwargs.setdefault("enable_thinking", True)
    template_kwargs.setdefault("thinking", True)
    return True


@dataclasses.dataclass(slots=True)  # not frozen: made per request (see GenerationPlan, gateway/serving/generation.py)
class CompletionRequest:
    model: str
    prompt_text: str | None
    prompt_ids: tuple[int, ...] | None
    sampling: SamplingRequest
    stream: bool
    include_usage: bool
    echo: bool


def parse_completion(body: dict[str, Any]) -> CompletionRequest:
    model = field(body, "model", str)
    prompt = body.get("prompt")
    text: str | None = None
    ids: tuple[int, ...] | None = None
    if isinstance(prompt, str):
        text = prompt
    elif isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        text = prompt[0]
    elif isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
        ids = token_ids(prompt, "prompt")
    elif isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], list):
        ids = token_ids(prompt[0], "prompt")
    elif isinstance(prompt, list) and len(prompt) > 1:
        raise BadRequest("only one prompt per request is supported", param="prompt", code="unsupported_value")
    else:
        raise BadRequest("'prompt' must be a string or an array of token ids", param="prompt", code="invalid_type")
    if text == "" or ids == ():
        raise BadRequest("'prompt' must not be empty", param="prompt", code="invalid_value")
    _unsupported(body, "suffix")
    best_of = body.get("best_of")
    if best_of not in (None, 1):
        raise BadRequest("only best_of=1 is supported", param="best_of", code="unsupported_value")
    stream = field(body, "stream", bool, False)
    stream_options = field(body, "stream_options", dict, {})
    sampling = parse_sampling(body, ("max_tokens",))
    if sampling.max_tokens is None and "max_tokens" not in body:
        sampling = dataclasses.replace(sampling, max_tokens=16)  # OpenAI's default for completions
    echo = field(body, "echo", bool, False)
    if "logprobs" in body:
        sampling.logprobs = positive_int(body, "logprobs", None, minimum=0, maximum=TOP_LOGPROBS_MAX)
        sampling.prompt_logprobs = echo and sampling.logprobs is not None
    return CompletionRequest(model=model, prompt_text=text, prompt_ids=ids, sampling=sampling, stream=stream,
                             include_usage=bool(stream_options.get("include_usage")) if stream else False,
                             echo=echo)


@dataclasses.dataclass(slots=True)  # not frozen: made per request (see GenerationPlan, gateway/serving/generation.py)
class GenerateRequest:
    """SGLang's native /generate: text or input_ids, sampling_params, token-level output."""

    model: str | None
    text: str | None
    input_ids: tuple[int, ...] | None
    sampling: SamplingRequest
    stream: bool
    rid: str | None


def parse_generate(body: dict[str, Any]) -> GenerateRequest:
    text = field(body, "text", str, None)
    input_ids = token_ids(body["input_ids"], "input_ids") if body.get("input_ids") is not None else None
    if (text is None) == (input_ids is None):
        raise BadRequest("exactly one of 'text' and 'input_ids' is required", param="text", code="invalid_value")
    if text == "" or input_ids == ():
        raise BadRequest("the input must not be empty", param="text", code="invalid_value")
    params = field(body, "sampling_params", dict, {})
    rid = field(body, "rid", str, None)
    if rid is not None and (len(rid) > REQUEST_ID_CHARS_MAX or not rid.isprintable()):
        raise BadRequest("'rid' must be printable and at most 128 characters", param="rid", code="invalid_value")
    sampling = parse_sampling(params, ("max_new_tokens",))
    if sampling.n != 1:
        raise BadRequest("/generate answers one sequence: n must be 1 (use /v1/completions for more)",
                         param="sampling_params.n", code="unsupported_value")
    return GenerateRequest(model=field(body, "model", str, None), text=text, input_ids=input_ids,
                           sampling=sampling,
                           stream=field(body, "stream", bool, False), rid=rid)

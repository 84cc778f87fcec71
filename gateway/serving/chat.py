"""The serving core's typed chat request and answer, the vocabulary between the front APIs and what answers them.

Every front API (OpenAI chat, the Responses API, Anthropic's Messages) translates its body into a ``ChatRequest``
(``gateway/api/protocol.py`` ``chat_request`` makes it, with the rules across fields) and renders a chat answer
given as typed deltas and a ``ChatAnswer`` (``gateway/api/pipeline.py`` ``ChatRenderer``). What answers in
between, the engines through the model's parsers (``gateway/api/chat_output.py``) or a hosted provider
(``gateway/providers/``), speaks only these types: no API's shape is known here.

A request's ``messages`` are OpenAI chat messages as chat templates read them: ``role`` (system, user, assistant,
tool), ``content`` (a string, or parts where images are ``{"type": "image"}`` placeholders for ``images`` in
order), an assistant's ``tool_calls`` (OpenAI's shape) and ``reasoning_content``, a tool message's
``tool_call_id``.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from ..base.ids import new_id
from ..engine.grpc_engine import Constraint
from ..media.service import ImageRef, VideoRef
from .generation import GenerationResult


@dataclasses.dataclass(slots=True)  # not frozen: made per request (see GenerationPlan, gateway/serving/generation.py)
class SamplingRequest:
    """Sampling and stopping, common to every generation endpoint (the defaults: what a request that does
    not mention a field gets, so an API without the field leaves it out)."""

    max_tokens: int | None = None  # None: bounded by the context, else --default-max-tokens
    temperature: float | None = None  # None: the engine's (the model's generation config)
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    repetition_penalty: float | None = None
    min_tokens: int = 0
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    constraint: Constraint | None = None  # structured output (api/structured.py)
    constraint_field: str | None = None  # the request field it came from, for errors
    logit_bias: "tuple[tuple[int, float], ...]" = ()  # ids checked against the vocabulary by plan_generation
    n: int = 1  # answers to the one prompt (the engine's n)
    logprobs: int | None = None  # alternatives per output token's logprob; None: no logprobs
    prompt_logprobs: bool = False  # the prompt's too (completions with echo)


@dataclasses.dataclass(slots=True)  # not frozen: made per request (see GenerationPlan, gateway/serving/generation.py)
class ChatRequest:
    model: str
    messages: list[dict[str, Any]]
    sampling: SamplingRequest
    stream: bool
    include_usage: bool
    tools: list[dict[str, Any]] | None
    tool_choice: str  # "none", "auto", "required" or "named" (api/tools.py)
    template_kwargs: dict[str, Any]
    # The model's reasoning apart (reasoning_content) when it has a reasoning parser; false: all content.
    separate_reasoning: bool = True
    # Asks for special-token spellings in messages to be tokenized as control tokens (admin keys only).
    special_tokens_in_content: bool = False
    tool_name: str | None = None  # the function a named tool_choice calls
    # Reasoning streamed as it comes (SGLang's stream_reasoning); false: held and sent in one delta.
    stream_reasoning: bool = True
    # False when the request turns the model's thinking off (reasoning_effort none/minimal, or
    # chat_template_kwargs enable_thinking/thinking false): no reasoning parser then.
    thinking: bool = True
    # The images the messages carry, in order (each message's {"type": "image"} parts stand for them).
    images: tuple[ImageRef, ...] = ()
    # The videos (vLLM's video_url parts), in order (each message's {"type": "video"} parts stand for them).
    videos: tuple[VideoRef, ...] = ()
    # The client allows several calls in one answer (OpenAI's parallel_tool_calls, Anthropic's
    # disable_parallel_tool_use): an engine's constraint holds it already; a hosted provider is told.
    parallel_tool_calls: bool = True
    # How many tokens the model may think (Anthropic's thinking.budget_tokens): engines have no such bound; a
    # hosted provider with one is given it.
    reasoning_budget: int | None = None
    # vLLM's mm_processor_kwargs: settings of the model's image processor for this request's images (Gemma 3's pan
    # and scan), checked against the model's processor when its images are processed.
    media_kwargs: "dict[str, Any] | None" = None
    # vLLM's media_io_kwargs: how this request's videos are loaded (their frames a second, a JPEG frame list's
    # frames taken), over the node's --media-video-fps and --media-video-frames (gateway/media/video.py's
    # VideoLoading).
    media_io_kwargs: "dict[str, Any] | None" = None


def new_call_id() -> str:
    return new_id("call")


class Reasoning:
    """Reasoning text, as it comes."""

    __slots__ = ("text",)

    def __init__(self, text: str) -> None:
        self.text = text

    def __eq__(self, other: object) -> bool:
        return type(other) is Reasoning and other.text == self.text

    def __repr__(self) -> str:
        return f"Reasoning({self.text!r})"


class Content:
    """Answer text, as it comes."""

    __slots__ = ("text",)

    def __init__(self, text: str) -> None:
        self.text = text

    def __eq__(self, other: object) -> bool:
        return type(other) is Content and other.text == self.text

    def __repr__(self) -> str:
        return f"Content({self.text!r})"


@dataclasses.dataclass(frozen=True, slots=True)
class Call:
    """One tool call, whole: the ``index``-th of the answer."""

    index: int
    id: str
    name: str
    arguments: str  # JSON text


@dataclasses.dataclass(frozen=True, slots=True)
class ReasoningSignature:
    """The signature a provider gave the reasoning just before it (Anthropic's and Bedrock's thinking, at the end of
    its block): a client must send it back with that reasoning for the provider to take the reasoning in a later
    turn (Anthropic refuses a tool-use turn whose thinking is unsigned)."""

    signature: str
    thinking: str = ""  # the text of the block it signs (its Reasoning deltas, joined): the block whole


@dataclasses.dataclass(frozen=True, slots=True)
class RedactedReasoning:
    """Reasoning a provider gave encrypted (Anthropic's redacted_thinking, Bedrock's redactedContent): nothing to
    show, but part of the turn: Anthropic wants it back, as it came, with the turn's other thinking."""

    data: str  # as the provider gave it (base64 text)


Delta = Reasoning | Content | Call | ReasoningSignature | RedactedReasoning

# A reasoning block as a client sends it back and a provider takes it: Anthropic's own form, which Messages clients
# and LiteLLM's chat clients (``thinking_blocks``) use. {"type": "thinking", "thinking": text, "signature": s} or
# {"type": "redacted_thinking", "data": d}.
ThinkingBlock = dict[str, Any]
# How a Responses reasoning item carries a redacted block in ``encrypted_content`` (where a signed block's signature
# goes): marked, so that the item is given back as the redacted block it was, not as a signature.
REDACTED_REASONING_PREFIX = "redacted_thinking:"


@dataclasses.dataclass(slots=True)
class ChatAnswer:
    """A chat answer's end: the whole of it (``ChatOutput.whole``, ``plain_answer``) or a stream's last word
    (its text went out as deltas: ``content`` and ``reasoning`` are then None and ``calls`` empty)."""

    result: GenerationResult
    finish_reason: str  # OpenAI's: tool_calls when calls were made and the engine stopped by itself
    called: bool  # calls were made (a stream's went out as deltas)
    reasoning_tokens: int  # usage.completion_tokens_details.reasoning_tokens (0 without a reasoning parser)
    content: str | None = None  # None: only calls (or a stream's end)
    reasoning: str | None = None  # None: no reasoning came (or a stream's end)
    calls: tuple[Call, ...] = ()
    # A reasoning parser applies: the answer has a reasoning field (OpenAI's reasoning_content, null or not).
    separates_reasoning: bool = False
    reasoning_signature: str | None = None  # a provider's signature of the reasoning (ReasoningSignature)
    # A provider's reasoning block by block (ThinkingBlock), None without any: what a client sends back, where
    # ``reasoning`` and its one signature cannot say several blocks (interleaved thinking, each signature of its own
    # block) or a redacted one.
    thinking_blocks: "tuple[ThinkingBlock, ...] | None" = None


def plain_answer(result: GenerationResult) -> ChatAnswer:
    """The answer of a request no parser applies to: its text as it is."""
    return ChatAnswer(result, result.finish_reason, False, 0, result.text)

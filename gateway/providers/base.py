"""What a hosted provider is to the gateway: a wire format both ways, for the one typed chat request every front API
makes (``gateway/serving/chat.py``).

A ``Provider`` (one module per wire format, registered in ``PROVIDERS``) answers four questions for a ``Target``
(one provider model the operator configured: ``targets.py``):

    check       what of the request it cannot do: ``Unsupported``, a 400 naming the model and the feature, never a
                silent drop
    call        the HTTP request that asks it (method, URL, headers with the target's credential, body)
    answer      a whole answer's body as a ``ProviderAnswer``: text, reasoning, calls, finish reason, usage
    stream      a ``StreamReader`` that turns the streamed body, as it arrives, into the same typed deltas the
                engines' parsers make (``Reasoning``, ``Content``, ``Call``), then the finish reason and usage
    error       a failed answer (status, headers, body) as a ``ProviderError``: its kind (what a route's fallback
                reads), status, the provider's own message, the retry-after it asked for

Finish reasons are OpenAI's (``stop``, ``length``, ``tool_calls``, ``content_filter``); each client API renders
them its own way, as it renders the engines'. Nothing here does I/O: ``dispatch.py`` sends the call with the
node's HTTP client and reads the answer within its bounds.
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Mapping
from typing import Any

import orjson

from ..base.registry import Registry
from ..serving.chat import Call, ChatRequest, Content, Delta, Reasoning

# Kinds of failure a route's fallback can name (targets.py FALLBACK_KINDS), each a ProviderError's kind.
CONNECT = "connect"  # no connection (refused, unreachable, TLS failed)
TIMEOUT = "timeout"  # no answer within the target's timeout
SERVER = "server"  # a 5xx, or a connection broken mid-answer
RATE_LIMITED = "rate_limited"  # a 429 (its retry-after kept), or the account's quota here
CONTEXT_LENGTH = "context_length"  # the prompt is longer than the target's window
BAD_REQUEST = "bad_request"  # the provider refused the request itself: a 4xx that another target would refuse too
AUTH = "auth"  # 401/403: the target's credential
NOT_FOUND = "not_found"  # 404: the target's model or deployment does not exist
OVERLOADED = "overloaded"  # 529 (Anthropic's) and the like: busy, not broken
QUOTA = "quota"  # the account's quota, held here (quotas.py): the request was not sent


@dataclasses.dataclass(frozen=True)
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0  # of the prompt, read from the provider's cache
    reasoning_tokens: int = 0  # of the completion
    cache_write_tokens: int = 0  # of the prompt, written to the provider's cache (Anthropic's)


@dataclasses.dataclass
class ProviderAnswer:
    """A provider's whole answer, in the gateway's vocabulary."""

    content: str | None
    reasoning: str | None
    calls: list[Call]
    finish_reason: str
    usage: Usage
    stop_sequence: str | None = None  # the stop sequence that ended it, when the provider says
    reasoning_signature: str | None = None  # the reasoning's signature (serving.chat.ReasoningSignature)
    # Its reasoning block by block (serving.chat.ThinkingBlock; a thinking block's signature "" where the provider
    # gave none), None without any.
    thinking_blocks: "tuple[dict[str, Any], ...] | None" = None
    # The answer as the provider wrote it, parsed, when its wire is a client API's own (Provider.relays): what a
    # client of that API is given as it is.
    passed: "dict[str, Any] | None" = None


@dataclasses.dataclass
class StreamEnd:
    """What a stream says at its end: its last deltas (a call still being assembled), finish reason and usage."""

    finish_reason: str
    usage: Usage
    stop_sequence: str | None = None
    deltas: "list[Delta]" = dataclasses.field(default_factory=list)


class CallAbandoned(Exception):
    """The call's client went away during it (its watch said so): nothing to answer, no target to move on to,
    nothing counted against the target."""


class ProviderError(Exception):
    """A target that did not answer: ``kind`` (this module's constants), the HTTP ``status`` the client is given
    (the provider's own where it answered), the provider's message, and the seconds it asked to wait."""

    def __init__(self, kind: str, status: int, message: str, retry_after_s: float | None = None,
                 code: str | None = None) -> None:
        super().__init__(message)
        self.kind = kind
        self.status = status
        self.message = message
        self.retry_after_s = retry_after_s
        self.code = code


class Unsupported(Exception):
    """A feature of the request the target cannot do: the client's 400 names the model and the feature."""

    def __init__(self, feature: str, param: str | None = None) -> None:
        super().__init__(feature)
        self.feature = feature
        self.param = param


@dataclasses.dataclass(frozen=True)
class Target:
    """One provider model a route can send requests to (``targets.py`` reads them from the models config)."""

    name: str  # the operator's name for it: metrics, logs, spans, cooldowns, quotas
    provider: str  # a PROVIDERS name
    model: str  # the provider's model id (Azure: the deployment; Bedrock: the model or inference profile id)
    base_url: str  # scheme, host and the path every call starts with
    credential: Any = None  # a credentials.Credential (a reference, resolved when the call is made)
    headers: tuple[tuple[str, str], ...] = ()  # sent with every call (an organization, a beta feature)
    timeout_s: float = 120.0  # a whole answer, or a stream's first byte and each gap after it
    context_tokens: int | None = None  # its window, when the operator states it (a longer prompt skips it)
    options: Mapping[str, Any] = dataclasses.field(default_factory=dict)  # the provider's own (api_version, region)
    price: Any = None  # a gateway.spend.Price, when the models config gives it one (else its route's)


@dataclasses.dataclass
class HttpCall:
    """The request that asks a provider: the dispatcher sends it as it is."""

    method: bytes
    url: str
    headers: list[tuple[bytes, bytes]]
    body: bytes


class Passed:
    """A piece of a provider's stream as the provider wrote it (whole events, each checked), for a client of the
    provider's own API (``Provider.relays``): sent on as it is."""

    __slots__ = ("events", "answer_id")

    def __init__(self, events: bytes, answer_id: "bytes | None" = None) -> None:
        self.events = events
        self.answer_id = answer_id  # the provider's id of the answer, as its JSON spells it (a client API may own it)


class StreamReader(abc.ABC):
    """A streamed answer read as it arrives: ``feed`` each piece of the body, get the deltas it completes."""

    @abc.abstractmethod
    def feed(self, data: bytes) -> "list[Delta]": ...

    @abc.abstractmethod
    def finish(self) -> StreamEnd:
        """The stream ended (the body is over): its finish reason and usage; ProviderError if it ended before
        the provider said it was done (or it said it failed)."""


class Provider(abc.ABC):
    """One wire format (the module's docstring)."""

    name: str

    def check(self, chat: ChatRequest, target: Target) -> None:
        """Unsupported for what the request asks and the target cannot do; the default refuses what no provider
        here takes (the engines' own sampling fields)."""
        refuse_engine_only(chat, target)

    @abc.abstractmethod
    def call(self, chat: ChatRequest, target: Target, stream: bool, secret: Any) -> HttpCall:
        """The HTTP request; ``secret`` is the target's credential, resolved (a key, or AWS credentials)."""

    @abc.abstractmethod
    def answer(self, body: bytes) -> ProviderAnswer: ...

    @abc.abstractmethod
    def stream(self) -> StreamReader: ...

    # The client API whose answers this wire's answers are (Anthropic's Messages: "messages"), or None. A client of
    # that API is given the provider's own answer: its whole body (``ProviderAnswer.passed``), its stream's events
    # (``passing_stream``), every block and field the provider wrote, which no translation to and from the
    # gateway's deltas could keep (redacted thinking, several signed thinking blocks, citations, its tool ids).
    relays: str | None = None

    def check_relayed(self, chat: ChatRequest, target: Target) -> None:
        """``check`` for a client of ``relays``' API, which is given the provider's own answer: what only the
        translation could not carry (OpenAI's ``n`` and logprobs, in its own chunks) is then the provider's to do."""
        self.check(chat, target)

    def passing_stream(self, chat: ChatRequest) -> StreamReader:
        """A reader whose deltas are ``Passed``: the stream's events for a client of ``relays``' API (``chat``'s),
        each checked to be what the wire says it is, with the finish reason and usage read for the node's
        accounting."""
        raise NotImplementedError(f"the {self.name} wire relays no client API")

    @abc.abstractmethod
    def error(self, status: int, headers: "list[tuple[bytes, bytes]]", body: bytes) -> ProviderError: ...

    def wire(self, target: Target) -> "Provider":
        """The wire that speaks to ``target``: this one, unless the target chose another API of the same provider
        (an OpenAI target's ``api = "responses"``)."""
        return self

    # Whether the wire has embeddings (``embeddings_call`` then builds their request).
    embeds = False

    def embeddings_call(self, body: "dict[str, Any]", target: Target, secret: Any) -> HttpCall:
        """The HTTP request for an embeddings request (OpenAI's body, its model already the target's)."""
        raise Unsupported("embeddings", "model")


PROVIDERS: Registry[Provider] = Registry("provider")


def thinking_blocks_of(blocks: Any) -> "list[dict[str, Any]]":
    """A turn's ``thinking_blocks`` as a client sent them (a Messages client's, a chat client's as LiteLLM names
    them, a Responses conversation's reasoning items): the signed and the redacted blocks, each rebuilt from its own
    fields (serving.chat.ThinkingBlock); anything else left out (a provider refuses unsigned thinking)."""
    out: list[dict[str, Any]] = []
    for block in blocks if isinstance(blocks, list) else ():
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "thinking" and isinstance(block.get("thinking"), str) and isinstance(block.get("signature"), str) \
                and block["signature"]:
            out.append({"type": "thinking", "thinking": block["thinking"], "signature": block["signature"]})
        elif kind == "redacted_thinking" and isinstance(block.get("data"), str) and block["data"]:
            out.append({"type": "redacted_thinking", "data": block["data"]})
    return out


def wire_of(target: Target) -> Provider:
    """The wire format that asks ``target`` (its provider's, or the other API it chose)."""
    return PROVIDERS[target.provider].wire(target)


def refuse_engine_only(chat: ChatRequest, target: Target) -> None:
    """What only our engines do: token-level controls and constraints no hosted API takes."""
    sampling = chat.sampling
    for value, feature, param in (
            (sampling.stop_token_ids, "stop_token_ids", "stop_token_ids"),
            (sampling.logit_bias and target.provider not in ("openai", "azure", "openai_compatible"), "logit_bias",
             "logit_bias"),
            (sampling.min_tokens, "min_tokens", "min_tokens"),
            (sampling.ignore_eos, "ignore_eos", "ignore_eos"),
            (sampling.repetition_penalty is not None and target.provider != "openai_compatible",
             "repetition_penalty", "repetition_penalty"),
            (sampling.min_p is not None and target.provider != "openai_compatible", "min_p", "min_p"),
            (sampling.prompt_logprobs, "prompt logprobs", "echo"),
            (sampling.include_stop_str_in_output, "include_stop_str_in_output", "include_stop_str_in_output")):
        if value:
            raise Unsupported(feature, param)
    constraint = sampling.constraint
    if constraint is not None and sampling.constraint_field != "tool_choice" \
            and constraint.kind not in ("json_schema", "json_object"):
        raise Unsupported(f"{constraint.kind} constraints", sampling.constraint_field)
    if chat.special_tokens_in_content:
        raise Unsupported("special_tokens_in_content", "special_tokens_in_content")
    if chat.videos:  # preprocessed for our engines only; no wire here carries a video
        raise Unsupported("video inputs", chat.videos[0].where)


# Features a wire may not have, each with what the client's 400 names (refuse() below).
_FEATURES: "dict[str, tuple[Any, str, str]]" = {
    "n": (lambda chat: chat.sampling.n != 1, "n above 1", "n"),
    "logprobs": (lambda chat: chat.sampling.logprobs is not None, "logprobs", "logprobs"),
    "seed": (lambda chat: chat.sampling.seed is not None, "seed", "seed"),
    "frequency_penalty": (lambda chat: chat.sampling.frequency_penalty, "frequency_penalty", "frequency_penalty"),
    "presence_penalty": (lambda chat: chat.sampling.presence_penalty, "presence_penalty", "presence_penalty"),
    "logit_bias": (lambda chat: chat.sampling.logit_bias, "logit_bias", "logit_bias"),
    "json_object": (lambda chat: chat.sampling.constraint is not None and chat.sampling.constraint_field !=
                    "tool_choice" and chat.sampling.constraint.kind == "json_object",
                    "a JSON object without a schema (give a json_schema)", "response_format"),
}


def refuse(chat: ChatRequest, target: Target, *features: str) -> None:
    """Unsupported for what no provider takes (``refuse_engine_only``) and for each of ``features`` (``_FEATURES``'
    names) the request asks for: a wire's ``check`` names what it lacks."""
    refuse_engine_only(chat, target)
    for name in features:
        asks, feature, param = _FEATURES[name]
        if asks(chat):
            raise Unsupported(feature, param)


def retry_after_s(headers: "list[tuple[bytes, bytes]]") -> float | None:
    """The seconds a ``retry-after`` header asks for (its delta-seconds form; a date is read as none), or the
    milliseconds of OpenAI's ``retry-after-ms``."""
    for name, value in headers:
        if name == b"retry-after-ms":
            try:
                return max(0.0, float(value) / 1000.0)
            except ValueError:
                continue
    for name, value in headers:
        if name == b"retry-after":
            try:
                return max(0.0, float(value))
            except ValueError:
                return None
    return None


def kind_of_status(status: int) -> str:
    """The failure kind of an HTTP status a provider answered with (its body may say more: context_length)."""
    if status == 429:
        return RATE_LIMITED
    if status in (401, 403):
        return AUTH
    if status == 404:
        return NOT_FOUND
    if status == 408:
        return TIMEOUT
    if status == 529:
        return OVERLOADED
    if status >= 500:
        return SERVER
    return BAD_REQUEST


def put_sampling(out: "dict[str, Any]", sampling: Any, names: "dict[str, str]") -> None:
    """The request's sampling fields that are set, into ``out`` under the wire's names (``names``: ours to theirs):
    a field left at its default (no stop strings, a penalty of 0, None) is left out, as the provider's default."""
    for field, wire in names.items():
        value = getattr(sampling, field)
        if field == "stop":
            value = list(value) if value else None
        elif field in ("frequency_penalty", "presence_penalty"):
            value = value or None
        if value is not None:
            out[wire] = value


def call_arguments(text: str) -> "dict[str, Any]":
    """A tool call's arguments (JSON text, as OpenAI's messages carry them) as the object the wires that take
    objects want (Anthropic's input, Gemini's args, Bedrock's input)."""
    try:
        value = orjson.loads(text or "{}")
    except orjson.JSONDecodeError:
        value = None
    if not isinstance(value, dict):
        raise Unsupported("tool call arguments that are not a JSON object", "messages")
    return value


def fold_turn(turns: "list[dict[str, Any]]", role: str, items: "list[Any]", key: str) -> None:
    """Append ``items`` as a turn of ``role`` (its list under ``key``), merged into the last turn when that one has
    the same role: the wires that want roles to alternate (Anthropic, Gemini, Bedrock)."""
    if not items:
        return
    if turns and turns[-1]["role"] == role:
        turns[-1][key] += items
    else:
        turns.append({"role": role, key: items})


def joined(deltas: "list[Delta]") -> "list[Delta]":
    """Consecutive text deltas of one kind joined into one: what arrived together goes to the client as one event
    (the engines' streams do the same with the tokens of one read), at a fraction of the rendering."""
    if len(deltas) < 2:
        return deltas
    out: list[Delta] = []
    for delta in deltas:
        kind = type(delta)
        if out and kind is type(out[-1]) and (kind is Content or kind is Reasoning):
            out[-1] = kind(out[-1].text + delta.text)
        else:
            out.append(delta)
    return out

"""The serving pipeline every generation API stands on: model, prompt, plan, admission, run, answer.

An endpoint translates its body into the internal request (``protocol.ChatRequest`` or a prompt of
its own), then takes these steps, which are the same for every API:

    ready_model_entry   the model (404, or 503 while a configured engine has not answered), once
                        its tokenizer is loaded; the caller's right to it
    chat_prompt         the chat template and the prompt's token ids (encode_chat; encode_text for a
                        plain prompt), refused early when it cannot fit the context
    plan_generation     the context check, max_tokens, the engine's sampling options: a GenerationPlan
    admitted            rate limits first (a denied request never queues), then an admission slot
    run_unary / run_streamed
                        the generation under the request's deadline and the client's presence: one
                        result, or SSE events written as text is decided
    answer_chat         a chat answer (through its parsers when some apply: ``chat_output``) shaped by
                        the API's ``ChatRenderer``, whole or streamed

and shapes what comes back in its own renderer. Streaming: nothing is sent until the first text is
decided, so a failure before that (no healthy worker, every retry failed) is still a proper HTTP
error status. After that, failures become the API's error event (OpenAI's is followed by
``[DONE]``: the SDK raises on it instead of waiting on a silent stream).
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Protocol

import trio

from ..auth import Authenticator, Principal
from ..engine.errors import EngineCallError
from ..serving.generation import (AnswerTooLarge, GenerationPlan, GenerationResult, LogprobRecord, MidStreamError,
                                  UsageTally, answer_bytes_estimate)
from ..media.families import with_request_kwargs
from ..media.service import MediaError, MediaInputs, expand_batches
from ..media.video import VIDEO_MODEL_TYPES, VideoLoading
from ..serving.models import ModelEntry
from ..routing.policies import RoutingRequest
from ..tokenizer.chat_template import TemplateError
from ..tokenizer.service import TokenizerService
from .chat_output import ChatOutput
from ..serving.chat import ChatAnswer, ChatRequest, Delta, SamplingRequest, plain_answer
from .errors import ApiError, BadRequest, ContextLengthExceeded, Forbidden, NotFound, Unavailable, UpstreamTimeout, \
    from_engine_error, to_api_error
from .http import JSON_HEADERS, SSE_DONE, SSE_HEADERS, Request, sse_event
from .logprobs import LogprobShape
from .ratelimits import rate_limited
from .state import GatewayState


# -- the model ----------------------------------------------------------------------------------------------

def model_entry(state: GatewayState, model: str | None, principal: Principal) -> ModelEntry:
    if model is None:
        names = state.catalog.names()
        if len(names) == 1:
            model = names[0]
        else:
            raise BadRequest("'model' is required when the node serves several models", param="model")
    entry = state.catalog.get(model)
    if entry is None:
        entry = _adapter_entry(state, model)
    if entry is None:
        if state.status.unreachable_engines:
            # An engine configured at start has not answered yet: the model may be its own. 503 says when to
            # come back (a 404 told a new user the model does not exist while the engine was starting).
            engines = ", ".join(sorted(state.status.unreachable_engines))
            raise Unavailable(f"The model '{model}' is not served yet: the configured engine(s) {engines} do not "
                              "answer; retry when they do", code="engine_unreachable", retry_after_s=5)
        raise model_not_found(state, model, principal)
    if principal.models is not None:
        Authenticator.check_model(principal, entry.name)
    return entry


def _adapter_entry(state: GatewayState, model: str) -> ModelEntry | None:
    """The entry of the LoRA adapter ``model`` names (gateway/adapters), on its base model's; None if none."""
    spec = state.adapters.resolve(model)
    if spec is None:
        return None
    base = state.catalog.get(spec.base)
    if base is None or base.tokenizer is None and not base.tokenizer_wanted:
        return None  # its base is not served (or only by HTTP workers, which are relayed as they are): not found
    return base.as_adapter(spec)


# The names a 404 for an unknown model lists (a node with more says how many more).
NAMES_LISTED_MAX = 20


def model_not_found(state: GatewayState, model: str, principal: Principal) -> NotFound:
    """OpenAI's 404 for a model, with what this caller may use instead (never a model it may not: a tenant
    learns nothing of another's routes or a key's forbidden models)."""
    names = sorted(name for name in state.catalog.names() if principal.may_use(name))
    providers = getattr(state, "providers", None)
    if providers is not None:
        names = sorted(set(names) | {name for name, route in providers.routes.routes.items()
                                     if principal.may_use(name) and route.allows(principal.tenant)})
    if not names:
        served = "no model is served here yet"
    else:
        shown = ", ".join(names[:NAMES_LISTED_MAX])
        more = f" and {len(names) - NAMES_LISTED_MAX} more (GET /v1/models)" if len(names) > NAMES_LISTED_MAX else ""
        served = f"the models served here: {shown}{more}"
    return NotFound(f"The model '{model}' does not exist; {served}", param="model", code="model_not_found")


# How long a request waits for its model's tokenizer when a gRPC engine just registered.
TOKENIZER_WAIT_S = 30.0


async def ready_model_entry(state: GatewayState, model: str | None, principal: Principal) -> ModelEntry:
    """The model's entry (if the caller may use it), once the tokenizer it needs (if any) is loaded."""
    entry = model_entry(state, model, principal)
    if entry.tokenizer is None and entry.tokenizer_wanted:
        with trio.move_on_after(TOKENIZER_WAIT_S):
            await entry.tokenizer_loaded.wait()
        if entry.tokenizer is None:
            raise Unavailable(f"the tokenizer of model '{entry.name}' is still loading", code="tokenizer_loading",
                              retry_after_s=1)
    return entry


# -- the prompt ---------------------------------------------------------------------------------------------

# A dataclass, not a NamedTuple: one is made per request, and a NamedTuple's __new__ is Python code calling
# tuple.__new__ (~3.3 k instructions against ~1.8 k).
@dataclasses.dataclass(slots=True)
class ChatPrompt:
    """A chat's prompt for its model: the ids (images' placeholders expanded), and with images their processed
    inputs and the ids routing reads (``MediaInputs.expand``)."""

    entry: ModelEntry
    tokenizer: TokenizerService
    ids: list[int]
    media: "tuple[MediaInputs, ...] | None" = None  # a batch per modality: images, then videos
    routing_ids: "list[int] | None" = None


async def chat_prompt(state: GatewayState, request: Request, chat: ChatRequest, api: str) -> ChatPrompt:
    """The model, its tokenizer and the chat's prompt, for an API that needs the gateway's own template
    (Anthropic's Messages, the Responses API): only a gRPC engine's model with a chat template serves it."""
    entry = await ready_model_entry(state, chat.model, request.principal)
    tokenizer = entry.tokenizer
    if tokenizer is None or tokenizer.chat_template is None:
        raise BadRequest(f"the model '{entry.name}' has no chat template on this node (the {api} needs a gRPC "
                         f"engine's model)", param="model", code="unsupported_model")
    ids = await encode_chat(state, request, entry, tokenizer, chat, True)
    if not chat.images and not chat.videos:
        return ChatPrompt(entry, tokenizer, ids)
    return ChatPrompt(entry, tokenizer, *await with_media(state, entry, chat, ids, request.tenant_key))


def check_media_kwargs_trusted(state: GatewayState, chat: ChatRequest) -> "VideoLoading | None":
    """A request's own mm_processor_kwargs and media_io_kwargs are a 400 unless the node trusts them
    (``--media-trust-request-kwargs``, vLLM's --trust-request-mm-kwargs: a client's crops or frames multiply what
    its media cost), with or without media, as vLLM's server answers. Trusted, the media_io_kwargs are checked here
    and are how the request's videos load (returned; None without them)."""
    trusted = state.media.config.trust_request_kwargs
    for value, param, what in ((chat.media_kwargs, "mm_processor_kwargs", "preprocessing"),
                               (chat.media_io_kwargs, "media_io_kwargs", "media loading")):
        if value and not trusted:
            raise BadRequest(f"Per-request {param} are disabled by default because they can change multimodal "
                             f"{what} resource usage. Start the node with --media-trust-request-kwargs only when "
                             "clients are trusted.", param=param, code="invalid_value")
    if not chat.media_io_kwargs:
        return None
    try:
        return state.media.loading.with_request(chat.media_io_kwargs)
    except ValueError as e:
        raise BadRequest(f"media_io_kwargs: {e}", param="media_io_kwargs", code="invalid_value") from None


async def with_media(state: GatewayState, entry: ModelEntry, chat: ChatRequest, ids: "list[int]",
                      tenant: str | None, loading: "VideoLoading | None" = None
                      ) -> "tuple[list[int], tuple[MediaInputs, ...], list[int]]":
    """The chat's images and videos fetched and processed for the model (gateway/media), and its prompt ids with
    each one's placeholder expanded: (ids, a batch of inputs per modality, the ids routing reads). ``tenant``:
    whose share of the media pools they take (the request's ``tenant_key``); ``loading``: how its videos load,
    when the request says (check_media_kwargs_trusted)."""
    wanted: list[tuple[list[Any], Any, int | None]] = []
    for refs, processor, items_max in ((chat.images, entry.image_processor, entry.images_max),
                                       (chat.videos, entry.video_processor, entry.videos_max)):
        if not refs:
            continue
        if processor is None:
            raise (_images_not_supported if refs is chat.images else _videos_not_supported)(entry, chat)
        if chat.media_kwargs:  # (trusted: the chat's entry checked it, check_media_kwargs_trusted)
            try:
                processor = with_request_kwargs(processor, chat.media_kwargs)
            except ValueError as e:
                raise BadRequest(f"mm_processor_kwargs: {e}", param="mm_processor_kwargs",
                                 code="invalid_value") from None
        wanted.append((list(refs), processor, items_max))
    tracing = state.tracing
    if tracing is None or not tracing.active():
        batches = await state.media.prepare_all(wanted, entry.normalize_images, tenant, loading)
    else:
        with tracing.span("media", attributes={"smg.images": len(chat.images), "smg.videos": len(chat.videos)}):
            batches = await state.media.prepare_all(wanted, entry.normalize_images, tenant, loading)
    if entry.image_tokens_max is not None:
        for (refs, _, _), media in zip(wanted, batches):
            for ref, item in zip(refs, media.images):
                if item.tokens > entry.image_tokens_max:
                    raise MediaError(f"{ref.where}: the {ref.modality} takes {item.tokens} tokens; this model's "
                                     f"engines take at most {entry.image_tokens_max} per item: send a smaller one",
                                     code=f"{ref.modality}_too_large", param=ref.where)
    expanded, routing_ids = expand_batches(ids, tuple(batches))
    return expanded, tuple(batches), routing_ids


async def encode_chat(state: GatewayState, request: Request, entry: ModelEntry, tokenizer: TokenizerService,
                      chat: ChatRequest, add_generation_prompt: bool, raw: bytes | None = None) -> list[int]:
    """The chat's prompt ids. Client text that spells a special token is encoded as plain text
    (gateway/tokenizer/literal_spans.py) unless the node trusts it (--allow-special-tokens-in-content)
    or an admin key asks for it (``"special_tokens_in_content": true``)."""
    tracing = state.tracing
    if tracing is None or not tracing.active():
        return await _encode_chat(state, request, entry, tokenizer, chat, add_generation_prompt, raw)
    with tracing.span("tokenize", attributes={"gen_ai.request.model": entry.name}):  # the template and the ids
        ids = await _encode_chat(state, request, entry, tokenizer, chat, add_generation_prompt, raw)
        tracing.annotate({"gen_ai.usage.input_tokens": len(ids)})
        return ids


async def _encode_chat(state: GatewayState, request: Request, entry: ModelEntry, tokenizer: TokenizerService,
                       chat: ChatRequest, add_generation_prompt: bool, raw: bytes | None) -> list[int]:
    messages, tools, spans = chat.messages, chat.tools, []
    if chat.images and entry.image_processor is None:  # said before a text model's template chokes on them
        raise _images_not_supported(entry, chat)
    if chat.images and entry.engine_support is not None and not entry.engine_support.images:
        raise BadRequest(f"the model '{entry.name}' is served by {_kinds(entry)} engines, to which this node does not "
                         "send images", param=chat.images[0].where, code="images_not_supported")
    if chat.videos:
        if entry.video_processor is None:
            raise _videos_not_supported(entry, chat)
        if entry.kinds_without_videos:
            raise BadRequest(f"the model '{entry.name}' is served by {' and '.join(entry.kinds_without_videos)} "
                             "engines, to which this node sends no videos (vLLM's engines take them)",
                             param=chat.videos[0].where, code="videos_not_supported")
    if chat.special_tokens_in_content and not request.principal.is_admin:
        raise Forbidden("'special_tokens_in_content' needs an admin key", code="insufficient_role")
    literal_spans = tokenizer.literal_spans
    if not (state.config.allow_special_tokens_in_content or chat.special_tokens_in_content) and (
            raw is None or literal_spans.may_occur_in(raw)):  # ``raw``: the request body, a cheap first look
        messages, tools, spans = literal_spans.protect(messages, tools)
    prompt = render_prompt(tokenizer, messages, add_generation_prompt=add_generation_prompt, tools=tools,
                           **chat.template_kwargs)
    if len(prompt) > PROMPT_CHARS_PRECHECK_MIN:
        check_prompt_chars(entry, tokenizer, prompt, "messages")
    if spans:
        return await tokenizer.encode_with_literals(literal_spans.split(prompt, spans))
    return await tokenizer.encode(prompt, add_special_tokens=False)


def _videos_not_supported(entry: ModelEntry, chat: ChatRequest) -> BadRequest:
    return BadRequest(f"the model '{entry.name}' does not take videos here (videos are preprocessed for the model "
                      f"types {', '.join(VIDEO_MODEL_TYPES)})", param=chat.videos[0].where, code="videos_not_supported")


def _images_not_supported(entry: ModelEntry, chat: ChatRequest) -> BadRequest:
    return BadRequest(f"the model '{entry.name}' does not take images (its engine ships no image processor this "
                      "node knows)", param=chat.images[0].where, code="images_not_supported")


def render_prompt(tokenizer: TokenizerService, messages: "list[dict[str, Any]]", **options: Any) -> str:
    """The chat template on these messages; a template that fails on them is the request's 400."""
    try:
        return tokenizer.chat_template.render(messages, **options)
    except TemplateError as e:
        raise BadRequest(str(e), param="messages", code="chat_template_error") from None


async def encode_text(entry: ModelEntry, tokenizer: TokenizerService, text: str, param: str,
                      add_special_tokens: bool = True) -> list[int]:
    """A plain prompt's ids (completions, /generate, tokenize), refused first when it cannot fit."""
    if len(text) > PROMPT_CHARS_PRECHECK_MIN:
        check_prompt_chars(entry, tokenizer, text, param)
    return await tokenizer.encode(text, add_special_tokens=add_special_tokens)


# Shorter texts skip the check (a call saved per request): encoding one costs little, and one that does
# not fit is refused after it by plan_generation's count.
PROMPT_CHARS_PRECHECK_MIN = 64 * 1024


def check_prompt_chars(entry: ModelEntry, tokenizer: TokenizerService, text: str, param: str) -> None:
    """Refuse, before encoding it, a text that cannot fit the context whatever its tokens: encoding
    a 30 MB prompt to find out took 1.4 GiB and seconds of a core."""
    context = entry.max_context_tokens
    if context and len(text) > context * tokenizer.token_chars_max:
        raise ContextLengthExceeded(
            f"This model's maximum context length is {context} tokens, and your prompt has {len(text)} characters: "
            f"more than that many tokens can hold. Please reduce the length of the prompt.", param=param)


def check_vocab(ids: "tuple[int, ...] | list[int]", tokenizer: TokenizerService, param: str = "prompt",
                model_vocab_size: int = 0) -> None:
    """Token ids a client sent: each below the tokenizer's size, or the model's when it is larger."""
    size = max(tokenizer.vocab_size, model_vocab_size)
    bad = next((t for t in ids if t >= size), None)
    if bad is not None:
        raise BadRequest(f"token id {bad} is outside the vocabulary (size {size})", param=param,
                         code="invalid_token_id")


def check_prompt_ids(ids: "tuple[int, ...] | list[int]", entry: ModelEntry, param: str = "prompt") -> None:
    """A prompt given as token ids, checked as vLLM's server checks it: out of vocabulary only past both the
    tokenizer's ids and the model's embedding rows (GetModelInfo's vocab_size). Qwen models have rows past their
    tokenizer's last id, some vision models placeholder ids past their rows: the engine takes any id below
    either, so refusing one that vLLM's own server takes would be a wrong answer."""
    assert entry.tokenizer is not None
    check_vocab(ids, entry.tokenizer, param, entry.model_vocab_size)


# -- the plan -----------------------------------------------------------------------------------------------

def plan_generation(state: GatewayState, request: Request, entry: ModelEntry, input_ids: list[int],
                    sampling: SamplingRequest, stream: bool, prompt_param: str, media: "MediaInputs | None" = None,
                    routing_ids: "list[int] | None" = None) -> GenerationPlan:
    """Check the prompt against the context and turn request fields into engine options (with its images:
    their inputs, and the ids routing reads in place of theirs)."""
    if entry.embeds:
        raise BadRequest(f"the model '{entry.name}' is an embedding model: it does not generate (use "
                         "/v1/embeddings)", param="model", code="model_not_generative")
    n = len(input_ids)
    context = entry.max_context_tokens
    max_tokens = sampling.max_tokens
    if context:
        if n >= context:
            raise ContextLengthExceeded(
                f"This model's maximum context length is {context} tokens. However, your prompt has {n} tokens. "
                f"Please reduce the length of the prompt.", param=prompt_param)
        if max_tokens is not None and n + max_tokens > context:
            raise ContextLengthExceeded(
                f"This model's maximum context length is {context} tokens. However, you requested "
                f"{n + max_tokens} tokens ({n} in the prompt, {max_tokens} for the completion). Please reduce the "
                f"length of the prompt or the completion.", param="max_tokens")
        if max_tokens is None:
            max_tokens = context - n
    if max_tokens is None:
        max_tokens = state.config.default_max_tokens
    if sampling.min_tokens > max_tokens:
        raise BadRequest("'min_tokens' must not exceed the maximum number of tokens", param="min_tokens")
    if entry.engine_support is not None:
        check_engine_support(entry, sampling)
    if sampling.logit_bias and entry.tokenizer is not None:
        check_vocab([token_id for token_id, _ in sampling.logit_bias], entry.tokenizer, "logit_bias")
    if sampling.stop_token_ids and entry.tokenizer is not None:
        check_vocab(sampling.stop_token_ids, entry.tokenizer, "stop_token_ids")
    answer_bytes_max = 0 if stream else state.config.answer_bytes_max
    # Asked for outright (n, max_tokens and top_logprobs all given), an answer that cannot fit is refused now;
    # one bounded only by the context is stopped if it really grows past the bound (AnswerTooLarge).
    if answer_bytes_max and sampling.max_tokens is not None and \
            answer_bytes_estimate(sampling.n, max_tokens, sampling.logprobs) > answer_bytes_max:
        raise AnswerTooLarge(answer_bytes_max)
    usage = request.usage = UsageTally(prompt_tokens=n)  # what the answer's cost is counted from (gateway/spend)
    request.model = entry.name
    plan = GenerationPlan(
        request_id=state.new_engine_request_id(),
        model=entry.name,
        input_ids=input_ids,
        sampling=state.engine_sampling(sampling, max_tokens),
        stop=sampling.stop,
        include_stop_str=sampling.include_stop_str_in_output,
        skip_special_tokens=sampling.skip_special_tokens,
        stream=stream,
        routing=RoutingRequest(input_ids=input_ids if routing_ids is None else routing_ids,
                               routing_key=request.header(state.config.routing_key_header)),
        timeout_s=state.config.admission.request_timeout_s,
        usage=usage,
        answer_bytes_max=answer_bytes_max,
        media=media,
    )
    if entry.adapter is not None:  # the base's workers that hold the adapter, asked to answer with it
        plan.model = entry.adapter.base
        plan.routing.adapter = entry.adapter
        plan.sampling.adapter = entry.adapter.adapter_id
    return plan


def check_engine_support(entry: ModelEntry, sampling: SamplingRequest) -> None:
    """A request that asks what the model's engines cannot do, refused with what and why (an engine kind whose
    proto has no field for it would drop it, or fail the call mid-way)."""
    support = entry.engine_support
    lacking: "tuple[str, str] | None" = None  # (what, its field)
    if sampling.n > 1 and not support.choices:
        lacking = ("several answers (n > 1)", "n")
    elif sampling.logprobs is not None and not support.logprobs:
        lacking = ("log probabilities", "logprobs")
    elif sampling.prompt_logprobs and not support.prompt_logprobs:
        lacking = ("the prompt's log probabilities (echo with logprobs)", "echo")
    elif sampling.constraint is not None and sampling.constraint.kind not in support.constraints:
        lacking = (f"structured output ({sampling.constraint.kind})", sampling.constraint_field or "response_format")
    elif sampling.min_tokens and not support.min_tokens:
        lacking = ("min_tokens", "min_tokens")
    elif sampling.logit_bias and not support.logit_bias:
        lacking = ("logit_bias", "logit_bias")
    if lacking is not None:
        raise BadRequest(f"the model '{entry.name}' is served by {_kinds(entry)} engines, which do not support "
                         f"{lacking[0]}", param=lacking[1], code="unsupported_by_engine")


def _kinds(entry: ModelEntry) -> str:
    return " and ".join(entry.engine_kinds) or "its"


def logprob_shape(plan: GenerationPlan, tokenizer: TokenizerService, chat: bool) -> LogprobShape | None:
    """When the request asks for logprobs: the record the generation fills, and its OpenAI shape."""
    if plan.sampling.logprobs is None:
        return None
    plan.logprobs = LogprobRecord(keep=not plan.stream)
    return LogprobShape(plan.logprobs, tokenizer, chat, plan.sampling.logprobs)


def logprob_shapes(plan: GenerationPlan, tokenizer: TokenizerService, chat: bool) -> "list[LogprobShape] | None":
    """``logprob_shape`` for each of n > 1 answers."""
    if plan.sampling.logprobs is None:
        return None
    plan.choice_logprobs = [LogprobRecord(keep=not plan.stream) for _ in range(plan.sampling.n)]
    return [LogprobShape(record, tokenizer, chat, plan.sampling.logprobs)
            for record in plan.choice_logprobs]


# -- admission ----------------------------------------------------------------------------------------------

def admitted(state: GatewayState, request: Request, plan: GenerationPlan) -> Any:
    """``async with admitted(...)``: rate limits first (a denied request never queues), then a slot
    of the admission queue."""
    limiter = state.rate_limiter
    if (limiter is None or not limiter.active) and not state.spend.budgets_active:
        return state.admission.slot(request.tenant_key)  # no limits nor budgets: the slot alone, nothing around it
    return _rate_limited_then_admitted(state, request, plan)


def rate_limited_generation(state: GatewayState, request: Request, plan: GenerationPlan) -> Any:
    """The rate limits of a generation alone (its slot taken later: a background response)."""
    return rate_limited(state, request, plan.model, plan.usage, estimated_tokens(plan), len(plan.input_ids))


def estimated_tokens(plan: GenerationPlan) -> int:
    return len(plan.input_ids) + plan.sampling.max_new_tokens * plan.sampling.n


@contextlib.asynccontextmanager
async def _rate_limited_then_admitted(state: GatewayState, request: Request,
                                      plan: GenerationPlan) -> AsyncIterator[None]:
    async with rate_limited(state, request, plan.model, plan.usage, estimated_tokens(plan), len(plan.input_ids)), \
            state.admission.slot(request.tenant_key):
        yield


# -- the run ------------------------------------------------------------------------------------------------

def _deadline(plan: GenerationPlan) -> float:
    return trio.current_time() + plan.timeout_s if plan.timeout_s else float("inf")


def timeout_error() -> UpstreamTimeout:
    return UpstreamTimeout("the request took longer than the gateway's request timeout", code="request_timeout")


async def run_unary(state: GatewayState, request: Request, plan: GenerationPlan,
                    tokenizer: TokenizerService) -> GenerationResult | None:
    """The whole result, or None when the client went away (nothing to answer then)."""
    result = await _unary(request, plan, lambda: state.generator.run(plan, tokenizer, None))
    if result is not None:
        state.count_tokens(plan.model, result)
    return result


async def run_unary_choices(state: GatewayState, request: Request, plan: GenerationPlan,
                            tokenizer: TokenizerService) -> "list[GenerationResult] | None":
    """``run_unary`` for n > 1 answers."""
    results = await _unary(request, plan, lambda: state.generator.run_choices(plan, tokenizer, None))
    for result in results or ():
        state.count_tokens(plan.model, result)
    return results


async def _unary(request: Request, plan: GenerationPlan, generate: Callable[[], Awaitable[Any]]) -> Any:
    async with request.cancel_on_disconnect() as scope:
        scope.deadline = _deadline(plan)  # one scope for both ends: the client's and the clock's
        try:
            outcome = await generate()
        except EngineCallError as e:  # mapped here, where the model is known: the answer names it
            raise from_engine_error(e, plan.model) from None
    if request.disconnected:
        return None
    if scope.cancelled_caught:
        raise timeout_error()
    return outcome


def openai_error_event(error: ApiError) -> bytes:
    return sse_event(error.body())


async def run_streamed(state: GatewayState, request: Request, plan: GenerationPlan, tokenizer: TokenizerService,
                       text_event: Callable[[str, bool], bytes],
                       final_events: Callable[[GenerationResult], bytes],
                       error_event: Callable[[ApiError], bytes] = openai_error_event, done: bytes = SSE_DONE,
                       finish: "Callable[[], Awaitable[bytes]] | None" = None, opened: bool = False) -> None:
    """Stream SSE: ``text_event(text, first)`` per decided piece, ``final_events(result)`` then ``done``
    ([DONE]); another API's stream (Anthropic's, the Responses API's) gives its own ``error_event`` and
    ends without [DONE]. ``finish``, when given, runs after a successful generation and before the last
    write (the Responses API stores the response there); its events come last, or its error's.

    ``request`` is where the stream goes: the client's response, or a background response's
    (``background.BackgroundOut``: the events are in its log already, no client to watch), whose opening
    events were made before it ran (``opened``)."""
    sink = SseSink(request, text_event)
    sink.started = opened

    def tail(result: GenerationResult | None) -> bytes:
        opening = b"" if sink.started else text_event("", True)  # no text came at all: an empty answer
        if result is None:
            return opening
        state.count_tokens(plan.model, result)
        return opening + final_events(result)

    await _stream_sse(request, plan, sink, lambda: state.generator.run(plan, tokenizer, sink), tail,
                      error_event, done, finish)


async def run_streamed_choices(state: GatewayState, request: Request, plan: GenerationPlan,
                               tokenizer: TokenizerService, text_event: Callable[[int, str, bool], bytes],
                               final_events: Callable[[list[GenerationResult]], bytes]) -> None:
    """``run_streamed`` for n > 1 answers: ``text_event(index, text, first)``, ``final_events(results)``."""
    sink = ChoicesSseSink(request, text_event)

    def tail(results: "list[GenerationResult] | None") -> bytes:
        opening = b"".join(text_event(i, "", True) for i in range(plan.sampling.n) if i not in sink.opened)
        if results is None:
            return opening
        for result in results:
            state.count_tokens(plan.model, result)
        return opening + final_events(results)

    await _stream_sse(request, plan, sink, lambda: state.generator.run_choices(plan, tokenizer, sink), tail)


async def _stream_sse(request: Request, plan: GenerationPlan, sink: Any, generate: Callable[[], Awaitable[Any]],
                      tail: Callable[[Any], bytes], error_event: Callable[[ApiError], bytes] = openai_error_event,
                      done: bytes = SSE_DONE, finish: "Callable[[], Awaitable[bytes]] | None" = None) -> None:
    """Run ``generate`` under the request's deadline and the client's presence; its text went out through
    ``sink``; end with ``tail(outcome)`` (None after a failure: ``error_event`` follows) and ``done``."""
    outcome: Any = None
    error: ApiError | None = None
    async with request.cancel_on_disconnect():
        # Two scopes here, unlike run_unary: the last events are written after the deadline has
        # cancelled the generation, still under the watch for the client going away.
        with trio.CancelScope(deadline=_deadline(plan)) as timeout:
            try:
                outcome = await generate()
            except MidStreamError as e:
                error = from_engine_error(e.error, plan.model)
            except EngineCallError as e:  # before the first byte: a status, naming the model
                raise from_engine_error(e, plan.model) from None
        if timeout.cancelled_caught:
            if not sink.started:
                raise timeout_error()
            error = timeout_error()
        if request.disconnected:
            return
        # The last write carries the head too when no text came at all (an empty answer).
        if not sink.started:
            await request.start_stream(200, SSE_HEADERS)
        await end_sse(request, tail(None if error is not None else outcome), error, finish, error_event, done)


async def end_sse(request: Request, end: bytes, error: ApiError | None,
                  finish: "Callable[[], Awaitable[bytes]] | None", error_event: Callable[[ApiError], bytes],
                  done: bytes) -> None:
    """A stream's last write, in one: its last events, then what ``finish`` adds (the Responses API's stored
    terminal event) unless it failed already, the error event of whatever failed, and the end."""
    if error is None and finish is not None:
        try:
            end += await finish()
        except Exception as e:
            error = to_api_error(e)
            if error is None:
                raise
    if error is not None:
        end += error_event(error)
    await request.end_stream(end + done)


class SseSink:
    """Where a streamed generation's text goes: one SSE event per piece, the response head with the first.

    Awaited by the request's task; also written synchronously (``ready_now``, ``send_now``, ``flush``:
    ``generation.TextSink``) by what reads the engine, the first piece with the response head too (the native
    server), so a token costs no wake-up of the request's task, the first one included.
    """

    __slots__ = ("_request", "_text_event", "started")

    def __init__(self, request: Request, text_event: Callable[[str, bool], bytes]) -> None:
        self._request = request
        self._text_event = text_event
        self.started = False

    async def __call__(self, text: str) -> None:
        if not self.started:
            self.started = True
            await self._request.start_stream(200, SSE_HEADERS)
            await self._request.send_chunk(self._text_event(text, True))
        else:
            await self._request.send_chunk(self._text_event(text, False))

    def ready_now(self) -> bool:
        request = self._request
        return request.can_send_chunk_now() if self.started else request.can_start_stream_now()

    def send_now(self, text: str) -> bool:
        if self.started:
            return self._request.send_chunk_now(self._text_event(text, False))
        self.started = True  # the first piece: the response head goes with it
        return self._request.start_stream_now(200, SSE_HEADERS, self._text_event(text, True))

    async def flush(self) -> None:
        await self._request.flush()


class ChoicesSseSink:
    """``SseSink`` for n > 1 answers in one stream: written only by the request's task (in order), the
    response head with the first text of any answer, each answer's first piece marked first."""

    __slots__ = ("_request", "_text_event", "started", "opened")

    def __init__(self, request: Request, text_event: Callable[[int, str, bool], bytes]) -> None:
        self._request = request
        self._text_event = text_event
        self.started = False
        self.opened: set[int] = set()  # answers whose first piece went out

    async def __call__(self, index: int, text: str) -> None:
        first = index not in self.opened
        self.opened.add(index)
        if not self.started:
            self.started = True
            await self._request.start_stream(200, SSE_HEADERS)
        await self._request.send_chunk(self._text_event(index, text, first))


# -- a chat answer, in an API's shape -------------------------------------------------------------------------

class ChatRenderer(Protocol):
    """How an API shapes a chat answer (OpenAI chat completions, the Responses API, Anthropic's Messages).

    Whole: ``whole(answer)`` is the JSON body. Streamed: ``text_event`` for each piece of a plain answer
    (no parser applies: the text is content as it is, the path most requests take), ``delta_events``
    for the deltas of a parsed one; ``first`` marks the stream's first event (the response head goes with
    it). ``final_events(deltas, answer)`` ends it: the last deltas, then the end. ``error_event`` after a
    failure mid-stream, ``done`` the stream's last bytes.
    """

    done: bytes
    api: str  # the client API's name: "chat", "responses", "messages" (a provider of that API relays to it)

    def whole(self, answer: ChatAnswer) -> dict[str, Any]: ...

    def text_event(self, text: str, first: bool) -> bytes: ...

    def delta_events(self, deltas: "list[Delta]", first: bool) -> bytes: ...

    def final_events(self, deltas: "list[Delta]", answer: ChatAnswer) -> bytes: ...

    def error_event(self, error: ApiError) -> bytes: ...


async def answer_chat(state: GatewayState, request: Request, plan: GenerationPlan, tokenizer: TokenizerService,
                      output: ChatOutput | None, renderer: ChatRenderer,
                      keep: "Callable[[dict[str, Any]], Awaitable[bytes | None]] | None" = None,
                      finish: "Callable[[], Awaitable[bytes]] | None" = None) -> None:
    """Admit and run a chat generation, and answer in ``renderer``'s shape: through ``output``'s parsers when
    some apply. ``keep`` gets a whole body before it is sent (the Responses API stores it) and may return it as
    JSON, sent as it is; ``finish`` runs after a stream's generation, before its last write (``run_streamed``)."""
    async with admitted(state, request, plan):
        if not plan.stream:
            result = await run_unary(state, request, plan, tokenizer)
            if result is None:
                return
            await send_whole(request, renderer.whole(output.whole(result) if output is not None else
                                                     plain_answer(result)), keep)
            return
        await stream_chat(state, request, plan, tokenizer, output, renderer, finish)


async def send_whole(request: Request, body: dict[str, Any],
                     keep: "Callable[[dict[str, Any]], Awaitable[bytes | None]] | None") -> None:
    """A whole answer's body sent, after ``keep`` (the Responses API stores it, and gives back the JSON it stored,
    sent as it is)."""
    encoded = await keep(body) if keep is not None else None
    if encoded is not None:
        await request.send_bytes(200, encoded, JSON_HEADERS)
    else:
        await request.send_json(200, body)


async def stream_chat(state: GatewayState, out: Any, plan: GenerationPlan, tokenizer: TokenizerService,
                      output: ChatOutput | None, renderer: ChatRenderer,
                      finish: "Callable[[], Awaitable[bytes]] | None" = None, opened: bool = False,
                      error_event: "Callable[[ApiError], bytes] | None" = None) -> None:
    """A chat generation streamed in ``renderer``'s shape (through ``output``'s parsers when some apply) to
    ``out``: the client's response, or a background response's (``run_streamed`` says how; ``error_event`` in
    place of the renderer's, to see the error)."""
    failed = error_event or renderer.error_event
    if output is None:
        await run_streamed(state, out, plan, tokenizer, renderer.text_event,
                           lambda result: renderer.final_events([], plain_answer(result)), failed, renderer.done,
                           finish, opened)
        return
    await run_streamed(state, out, plan, tokenizer, lambda text, first: renderer.delta_events(output.feed(text), first),
                       lambda result: renderer.final_events(output.finish(), output.streamed_answer(result)), failed,
                       renderer.done, finish, opened)

"""The gateway's vocabulary for what engines are asked and answer: no protobuf message outside ``gateway/engine``.

Each engine kind (``runtimes/``) builds its requests from these and reads its answers into them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import NamedTuple


@dataclasses.dataclass(frozen=True)
class ModelInfo:
    model_path: str
    served_model_name: str
    max_context_tokens: int
    vocab_size: int
    eos_token_ids: tuple[int, ...]
    is_generation: bool = True  # False: a pooling model (embeddings): the engine answers Embed, not Generate
    supports_vision: bool = False
    architectures: tuple[str, ...] = ()  # the model's (the parser choice reads them)


CONSTRAINT_KINDS = frozenset({"json_schema", "json_object", "regex", "grammar", "structural_tag", "choice"})


@dataclasses.dataclass(frozen=True)
class EngineSupport:
    """What an engine kind can be asked, as its proto carries it and its server facts confirm (runtimes/): a request
    that needs more is refused with a 400 naming it, not sent to be dropped or misread. SGLang and vLLM carry all of
    it (the defaults); a model served by several kinds is held to what every one of them supports (``both``)."""

    logprobs: bool = True  # output tokens' log probabilities (top_logprobs)
    prompt_logprobs: bool = True  # the prompt's (completions' echo with logprobs)
    choices: bool = True  # n > 1 answers from one prompt
    constraints: frozenset[str] = CONSTRAINT_KINDS  # structured output, by Constraint.kind
    min_tokens: bool = True
    logit_bias: bool = True
    embeddings: bool = True  # the Embed call (a pooling model's)
    images: bool = True  # preprocessed images in Generate (when the model has an image processor here)
    videos: bool = True  # preprocessed videos in Generate (vLLM's servicer: a VIDEO batch)
    kv_events: bool = True  # SubscribeKvEvents (cache-aware routing reads them)
    loads: bool = True  # GetLoads (load-aware policies read them; without, the node's own counts)
    disaggregation: bool = True  # prefill/decode legs (the runtime's handover)

    def both(self, other: "EngineSupport") -> "EngineSupport":
        """What two engines both support."""
        return EngineSupport(**{f.name: (getattr(self, f.name) & getattr(other, f.name))
                                for f in dataclasses.fields(self)})

    @property
    def everything(self) -> bool:
        """All the plain request path checks for: videos are checked apart, on the requests that carry them, so a
        kind that takes no videos (SGLang's) costs the others nothing."""
        return self == FULL_SUPPORT or dataclasses.replace(self, videos=True) == FULL_SUPPORT


FULL_SUPPORT = EngineSupport()


@dataclasses.dataclass(frozen=True, slots=True)
class Embedding:
    """An engine's answer to Embed: the vector (as the engine pooled and normalized it) and the prompt's tokens."""

    vector: "Sequence[float]"
    prompt_tokens: int


@dataclasses.dataclass(frozen=True)
class EngineLoad:
    running: int
    waiting: int
    token_usage: float
    max_running: int


@dataclasses.dataclass(frozen=True, slots=True)
class Constraint:
    """What the engine's constrained decoding must hold the output to.

    ``kind``: one of ``CONSTRAINT_KINDS`` (each engine kind's field for each: ``CONSTRAINT_FIELDS`` in its module
    of ``runtimes/``).
    ``spec``: the JSON schema / regex / EBNF grammar / structural tag as text, the choices as a tuple
    of strings, nothing for ``json_object`` (any JSON object).
    """

    kind: str
    spec: "str | tuple[str, ...]" = ""
    # A json_schema's name and strictness as the client gave them (response_format's): engines ignore both; a
    # hosted provider that takes a named schema is given them back (gateway/providers/).
    name: str = ""
    strict: bool | None = None


@dataclasses.dataclass(slots=True)  # not frozen: made per request (see GenerationPlan, gateway/serving/generation.py)
class SamplingOptions:
    max_new_tokens: int
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    repetition_penalty: float | None = None
    seed: int | None = None
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    min_new_tokens: int = 0
    constraint: Constraint | None = None
    logit_bias: "tuple[tuple[int, float], ...]" = ()  # (token id, bias), ids checked against the vocabulary
    # Log probabilities of the output tokens with this many alternatives each (None: none); of the
    # prompt's tokens too when prompt_logprobs (completions' echo).
    logprobs: int | None = None
    prompt_logprobs: bool = False
    n: int = 1  # answers to sample from the one prompt (the engine's n: its prefill is done once)
    adapter: str | None = None  # the id of the LoRA adapter loaded on the engine to answer with (gateway/adapters)


# One token's log probability: (token id, logprob, ((alternative id, logprob), ...) most likely first).
# The prompt's first token has none: its logprob is None.
TokenLogprob = "tuple[int, float | None, tuple[tuple[int, float], ...]]"


@dataclasses.dataclass(frozen=True, slots=True)
class Handover:
    """What one leg of a disaggregated request tells its engine about the KV hand-over.

    SGLang: both legs carry the same bootstrap address (the prefill's host and bootstrap port) and room.
    vLLM: each leg carries its kv_transfer_params as JSON (the prefill's asks for a remote decode; the
    decode's are those the prefill answered with).
    """

    bootstrap_host: str = ""
    bootstrap_port: int = 0
    bootstrap_room: int | None = None
    kv_transfer_params_json: str | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class PrefillAnswer:
    """What a prefill leg answered that matters: vLLM's parameters for the decode, and its token counts."""

    kv_transfer_params_json: str | None
    prompt_tokens: int
    cached_tokens: int


class GenerateEvent(NamedTuple):
    """New tokens of one generation; the last event has ``finish_reason`` set.

    A NamedTuple, made once per engine message (per token when streaming): ~0.17 us to
    build against ~0.56 us for a frozen dataclass, whose __init__ sets each field through
    object.__setattr__.
    """

    # A list as protobuf's slice gives it (twice as fast as tuple() over the repeated field, per token when
    # streaming); nothing changes it after.
    token_ids: "list[int] | tuple[int, ...]"
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    finish_reason: str | None = None
    matched_token_id: int | None = None
    logprobs: "tuple[TokenLogprob, ...] | None" = None  # of token_ids, when the request asked
    prompt_logprobs: "tuple[TokenLogprob, ...] | None" = None  # of the prompt, once, when asked
    index: int = 0  # which of the request's n answers (n > 1)

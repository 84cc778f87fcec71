"""Which models the node serves, and the tokenizer and context length of each.

A model appears when its first worker registers. Its tokenizer comes from
``--tokenizer-path`` when given, else from the engine itself (``GetTokenizer``
streams the engine's own files, so gateway and engine cannot disagree).
Models served only by OpenAI-compatible HTTP workers need no tokenizer: their
requests are proxied as they are.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import trio

from ..engine.errors import EngineCallError
from ..media.families import image_processor, with_node_kwargs
from ..media.processors import ProcessorConfigError
from ..media.video import video_processor
from ..observe.metrics import counter, gauge
from ..parsers import HarmonyUnavailable, harmony_encoding, is_harmony
from ..parsers.choice import choose
from ..tokenizer.service import TokenizerConfig, TokenizerLoadError, TokenizerService
from ..workers import Worker, WorkerUnreachable

log = logging.getLogger("gateway.models")

TOKENIZER_FETCH_TIMEOUT_S = 120.0


@dataclasses.dataclass
class ModelEntry:
    name: str
    tokenizer: TokenizerService | None
    max_context_tokens: int | None
    created: int
    # A gRPC engine serves it, so it needs a tokenizer; until that is loaded (a fetch and a parse, up
    # to seconds), requests wait for it rather than being taken for an HTTP-proxied model.
    tokenizer_wanted: bool = False
    tokenizer_loaded: trio.Event = dataclasses.field(default_factory=trio.Event)
    # The parsers its chat answers go through (gateway/parsers/choice.py), None: the text as it is.
    tool_call_parser: str | None = None
    reasoning_parser: str | None = None
    # An embedding (pooling) model: its engine answers Embed, not Generate (GetModelInfo's is_generation).
    embeds: bool = False
    # A vision model's image processor (gateway/media/processors.py), built from the preprocessor config its
    # engine ships; None: the model takes no images here.
    image_processor: Any = None
    # The video processor its files call for (gateway/media/video.py), None: the model takes no videos here.
    video_processor: Any = None
    # How its engines take images (their GetServerInfo, gateway/engine/media_facts.py): whether one of them takes
    # normalized floats (then they are computed with the raw pixels, in the processing thread), and the lowest
    # bounds they said on images per prompt and tokens per image.
    normalize_images: bool = False
    images_max: int | None = None
    image_tokens_max: int | None = None
    videos_max: int | None = None
    # The model's vocabulary as its engine says (GetModelInfo's vocab_size: its embedding rows); 0 when unsaid.
    model_vocab_size: int = 0
    # What its engines can be asked when one of them cannot be asked everything (gateway/engine/messages.py's
    # EngineSupport: what every engine kind that served it supports), and the kinds that lack something; None:
    # everything (SGLang, vLLM), so the request path checks nothing more. Only ever narrowed: a request refused once for what an engine
    # of the model lacks is refused until the node restarts, never sent to that engine by chance of routing.
    engine_support: Any = None
    engine_kinds: tuple[str, ...] = ()
    # The kinds serving it that take no videos (EngineSupport.videos; not part of engine_support's plain-path check).
    kinds_without_videos: tuple[str, ...] = ()
    # A LoRA adapter's view of its base model (gateway/adapters' AdapterSpec): its name is the adapter's (what the
    # client asked for, what usage and limits count), its generations go to the base's workers that hold it.
    adapter: Any = None

    @property
    def tasks(self) -> list[str]:
        """What the model is served for (/v1/models): "generate", or "embed" and "score" (/v1/score and /v1/rerank
        over its vectors), "vision" when it takes images and "video" when it takes videos."""
        return (["embed", "score"] if self.embeds else ["generate"]) + \
            (["vision"] if self.image_processor is not None else []) + \
            (["video"] if self.video_processor is not None else [])

    def as_adapter(self, spec: Any) -> "ModelEntry":
        """The entry requests for the adapter ``spec`` (of this model) answer with."""
        return dataclasses.replace(self, name=spec.name, adapter=spec)

    def embedding_size(self) -> int | None:
        """The size of the model's vectors as its config.json says (``hidden_size``); None when it does not."""
        config = self.tokenizer.model_files["config.json"] if self.tokenizer is not None else {}
        size = config.get("hidden_size")
        return size if isinstance(size, int) and not isinstance(size, bool) and size > 0 else None

    def matryoshka_dimensions(self) -> "tuple[int, ...] | None":
        """The sizes an embedding may be cut to (``dimensions``), as vLLM reads them from the model's config.json:
        its ``matryoshka_dimensions``; () when ``is_matryoshka`` says any size will do; None: no cut (refused)."""
        config = self.tokenizer.model_files["config.json"] if self.tokenizer is not None else {}
        sizes = config.get("matryoshka_dimensions")
        if isinstance(sizes, list) and sizes and all(isinstance(n, int) and not isinstance(n, bool) and n > 0
                                                     for n in sizes):
            return tuple(sizes)
        return () if config.get("is_matryoshka") is True else None


BODY_BYTES_PER_CONTEXT_TOKEN = 32
BODY_BYTES_MIN = 1024 * 1024
BODY_BYTES_MAX = 64 * 1024 * 1024
BODY_BYTES_UNKNOWN_CONTEXT = 8 * 1024 * 1024


def usable_parsers(model: str, tool: str | None, reasoning: str | None) -> tuple[str | None, str | None]:
    """The parsers as chosen, but harmony's (gpt-oss) only when its encoding loads: without it the model
    is served with its text as it is, and the log says why and what to do."""
    if is_harmony(tool) or is_harmony(reasoning):
        try:
            harmony_encoding()
        except HarmonyUnavailable as e:
            log.error("model %s: no harmony parsing (%s)", model, e)
            return (None if is_harmony(tool) else tool), (None if is_harmony(reasoning) else reasoning)
    return tool, reasoning


def _take_media_facts(entry: ModelEntry, facts: Any) -> None:
    """A vision worker's facts into its model's entry: floats when any engine takes them, the lowest bounds."""
    entry.normalize_images = entry.normalize_images or not facts.raw_pixels
    for name in ("images_max", "videos_max", "image_tokens_max"):
        said, held = getattr(facts, name), getattr(entry, name)
        if said is not None and (held is None or said < held):
            setattr(entry, name, said)


def _take_support(entry: ModelEntry, client: Any) -> None:
    """A gRPC engine's support into its model's entry: what every kind serving the model supports."""
    support = getattr(client, "support", None)
    if support is not None and not support.videos and client.runtime_name not in entry.kinds_without_videos:
        entry.kinds_without_videos += (client.runtime_name,)
    if support is None or support.everything:
        return  # an HTTP worker (its requests are relayed as they are) or a kind that takes everything
    if client.runtime_name not in entry.engine_kinds:
        entry.engine_kinds += (client.runtime_name,)
    entry.engine_support = support if entry.engine_support is None else entry.engine_support.both(support)


def _media_processor(model: str, tokenizer: TokenizerService, pixel_reference: str, modality: str,
                     node_kwargs: "dict[str, Any] | None" = None) -> Any:
    """The model's image (or video) processor, when its files name one this node has (logged either way), with the
    node's ``--media-processor-kwargs`` its family takes."""
    try:
        if modality == "image":
            processor = image_processor(tokenizer.model_files, tokenizer.token_to_id, pixel_reference,
                                        tokenizer.encode_uncached)
        else:  # a family may write text into a video's prompt (Qwen3-VL's timestamps): the tokenizer's plain encode
            processor = video_processor(tokenizer.model_files, tokenizer.token_to_id, pixel_reference,
                                        tokenizer.encode_uncached)
        if processor is not None and node_kwargs:
            processor, ignored = with_node_kwargs(processor, node_kwargs)
            if ignored:
                log.info("model %s: --media-processor-kwargs %s not applied to its %ss (%s takes %s)", model,
                         ", ".join(ignored), modality, processor.family,
                         ", ".join(getattr(processor, "request_kwargs", ())) or "none")
    except (ProcessorConfigError, ValueError) as e:
        log.warning("model %s: its %s processor cannot be used (%s): it takes no %ss here", model, modality, e,
                    modality)
        return None
    if processor is not None:
        log.info("model %s: %ss preprocessed here (%s)", model, modality, processor.family)
    return processor


class ModelCatalog:
    def __init__(self, tokenizer_config: TokenizerConfig, tokenizer_path: Path | None,
                 chat_template_path: Path | None, tool_call_parser: str | None = None,
                 reasoning_parser: str | None = None, pixel_reference: str = "torchvision",
                 processor_kwargs: "dict[str, Any] | None" = None) -> None:
        self._tokenizer_config = tokenizer_config
        self._pixel_reference = pixel_reference  # whose pixels image processors compute (MediaConfig)
        self._processor_kwargs = processor_kwargs  # the node's settings of them (MediaConfig)
        self._parsers = (tool_call_parser, reasoning_parser)  # the operator's; None: chosen by model id
        self._tokenizer_path = tokenizer_path
        self._chat_template_path = chat_template_path
        self._local_tokenizer: TokenizerService | None = None
        self._models: dict[str, ModelEntry] = {}
        # One tokenizer fetch per model even when its workers register concurrently.
        self._locks: dict[str, trio.Lock] = {}
        # The request body limit when --max-payload-size is not given (AdmissionConfig says why).
        self.body_bytes_max_auto = BODY_BYTES_UNKNOWN_CONTEXT

    def get(self, name: str) -> ModelEntry | None:
        return self._models.get(name)

    def names(self) -> list[str]:
        return list(self._models)

    async def local_tokenizer(self) -> TokenizerService | None:
        """The tokenizer given on the command line, loaded once (in a thread: it takes ~1 s)."""
        if self._tokenizer_path is not None and self._local_tokenizer is None:
            self._local_tokenizer = await trio.to_thread.run_sync(
                TokenizerService.from_directory, self._tokenizer_path, self._tokenizer_config,
                self._chat_template_path)
        return self._local_tokenizer

    async def ensure(self, worker: Worker, created: int) -> None:
        """Make sure every model of this worker has an entry (and a tokenizer if it needs one)."""
        for name in worker.models:
            entry = self._models.get(name)
            if entry is None:
                tool, reasoning = usable_parsers(name, *choose(name, *self._parsers,
                                                               architectures=worker.client.architectures))
                entry = self._models[name] = ModelEntry(name, None, worker.max_context_tokens, created,
                                                        tool_call_parser=tool, reasoning_parser=reasoning,
                                                        embeds=not getattr(worker.client, "is_generation", True))
                log.info("model %s: tool-call parser %s, reasoning parser %s", name, tool or "none",
                         reasoning or "none")
            if worker.max_context_tokens and not entry.max_context_tokens:
                entry.max_context_tokens = worker.max_context_tokens
            vocab = getattr(worker.client, "vocab_size", 0)
            if isinstance(vocab, int) and vocab > entry.model_vocab_size:
                entry.model_vocab_size = vocab
            _take_support(entry, worker.client)
            facts = getattr(worker.client, "media_facts", None)
            if facts is not None and getattr(worker.client, "supports_vision", False):
                _take_media_facts(entry, facts)
            self._size_body_limit()
            if worker.kind == "grpc" and entry.tokenizer is None:
                entry.tokenizer_wanted = True
                async with self._locks.setdefault(name, trio.Lock()):
                    if entry.tokenizer is None:
                        entry.tokenizer = await self.local_tokenizer() or await self._fetch(worker)
                        entry.image_processor = _media_processor(name, entry.tokenizer, self._pixel_reference,
                                                                 "image", self._processor_kwargs)
                        entry.video_processor = _media_processor(name, entry.tokenizer, self._pixel_reference,
                                                                 "video", self._processor_kwargs)
                        entry.tokenizer_loaded.set()
            learn = getattr(worker.client, "learn_model_files", None)
            if learn is not None and entry.tokenizer is not None:
                learn(entry.tokenizer.eos_token_ids)  # a kind whose requests name the model's end (TensorRT-LLM)

    def _size_body_limit(self) -> None:
        contexts = [e.max_context_tokens for e in self._models.values() if e.max_context_tokens]
        if contexts and len(contexts) == len(self._models):
            limit = max(BODY_BYTES_MIN, BODY_BYTES_PER_CONTEXT_TOKEN * max(contexts))
        else:  # a model without a stated context (an HTTP worker's): the fixed default, or more
            limit = max(BODY_BYTES_UNKNOWN_CONTEXT, BODY_BYTES_PER_CONTEXT_TOKEN * max(contexts, default=0))
        self.body_bytes_max_auto = min(BODY_BYTES_MAX, limit)

    async def _fetch(self, worker: Worker) -> TokenizerService:
        try:
            bundle = await worker.client.fetch_tokenizer_bundle(TOKENIZER_FETCH_TIMEOUT_S)
            service = await trio.to_thread.run_sync(
                TokenizerService.from_bundle, bundle, f"{worker.url} (GetTokenizer)", self._tokenizer_config,
                self._chat_template_path)
        except (EngineCallError, TokenizerLoadError) as e:
            raise WorkerUnreachable(f"no --tokenizer-path and {worker.url} did not provide its tokenizer: {e}") \
                from None
        log.info("tokenizer for %s fetched from %s", ",".join(worker.models), worker.url)
        return service

    def metric_families(self) -> Iterator[Any]:
        hits, misses, sizes = [], [], []
        for name in self.names():
            tokenizer = self.get(name).tokenizer
            if tokenizer is None:
                continue
            stats = tokenizer.statistics()
            for level in ("l0", "l1"):
                hits.append(([name, level], stats[f"{level}_hits"]))
                misses.append(([name, level], stats[f"{level}_misses"]))
                sizes.append(([name, level], float(stats[f"{level}_bytes"])))
        yield counter("smg_tokenizer_cache_hits", "Tokenizer cache hits by level", ["model", "level"], hits)
        yield counter("smg_tokenizer_cache_misses", "Tokenizer cache misses by level", ["model", "level"], misses)
        yield gauge("smg_tokenizer_cache_bytes", "Tokenizer cache size by level (an estimate, as bounded)",
                    ["model", "level"], sizes)

"""The serving core as subsystems of the node (gateway/base/subsystem.py): admission, the models served (the
catalog), prefill/decode pairs, the generator every API runs its generations on, and embeddings' bounds."""

from __future__ import annotations

import dataclasses
import random
from typing import Any

from ..base.subsystem import ConfigProblem, StartContext, Subsystem
from ..routing.policies import make_policy
from ..workers import WorkerUrlError, parse_worker_origin
from . import admission, disaggregation, embeddings
from .admission import Admission, AdmissionConfig
from .disaggregation import PairRouter, PdConfig, PdLegs
from .embeddings import EmbeddingConfig
from .generation import Generator
from .models import ModelCatalog


def _check_admission(config: Any) -> None:
    bounds = config.admission
    if bounds.max_concurrent_requests < 0 or bounds.queue_size < 0:
        raise ConfigProblem("--max-concurrent-requests and --queue-size must not be negative")
    if any(v is not None and v < 1 for v in (bounds.tenant_max_concurrent, bounds.tenant_queue_max)):
        raise ConfigProblem("--max-concurrent-requests-per-tenant and --queue-size-per-tenant must be positive")
    if bounds.body_bytes_max is not None and bounds.body_bytes_max <= 0:
        raise ConfigProblem("--max-payload-size must be positive")


def _check_pd(config: Any) -> None:
    pd = config.pd
    if (pd.prefill or pd.decode) and not pd.enabled:
        raise ConfigProblem("--prefill and --decode need --pd-disaggregation")
    if not pd.bootstrap_timeout_s > 0:
        raise ConfigProblem("--pd-bootstrap-timeout-secs must be positive")
    for flag, url in [*(("--prefill", u) for u, _ in pd.prefill), *(("--decode", u) for u in pd.decode)]:
        try:
            if parse_worker_origin(url).kind != "grpc":
                raise WorkerUrlError("prefill and decode engines are gRPC engines (grpc://host:port)")
        except WorkerUrlError as e:
            raise ConfigProblem(f"{flag} {url}: {e}") from None


def _check_embeddings(config: Any) -> None:
    if config.embeddings.inputs_max < 1 or config.embeddings.tokens_max < 1:
        raise ConfigProblem("--max-embedding-inputs and --max-embedding-tokens must be positive")


async def _start_admission(context: StartContext) -> Admission:
    return Admission(context.config.admission)


async def _start_catalog(context: StartContext) -> ModelCatalog:
    config = context.config
    return ModelCatalog(config.tokenizer, config.tokenizer_path, config.chat_template, config.tool_call_parser,
                        config.reasoning_parser, config.media.pixel_reference, dict(config.media.processor_kwargs))


async def _start_pd(context: StartContext) -> PdLegs:
    """Pairs are chosen whenever prefill/decode workers are registered (here, or on another node of the cluster),
    each role by its own policy."""
    config, kv_index = context.config, context.need("kv_index")
    policies = (make_policy(dataclasses.replace(config.policy, name=name or config.policy.name), kv_index)
                for name in (config.pd.prefill_policy, config.pd.decode_policy))
    pairs = PairRouter(context.need("registry"), *policies)
    return PdLegs(config.pd, pairs, context.need("metrics"), context.nursery, context.need("tracing"))


async def _start_generator(context: StartContext) -> Generator:
    return Generator(context.need("router"), context.config.retry, context.need("metrics"), context.nursery,
                     context.need("pd"), context.need("tracing"), random.Random())


ADMISSION = Subsystem("admission", AdmissionConfig(), admission.OPTIONS, _check_admission, _start_admission)
CATALOG = Subsystem("catalog", start=_start_catalog)
PD = Subsystem("pd", PdConfig(), disaggregation.OPTIONS, _check_pd, _start_pd,
               needs=("registry", "kv_index", "metrics", "tracing"))
GENERATOR = Subsystem("generator", start=_start_generator, needs=("router", "pd", "metrics", "tracing"))
EMBEDDINGS = Subsystem("embeddings", EmbeddingConfig(), embeddings.OPTIONS, _check_embeddings)

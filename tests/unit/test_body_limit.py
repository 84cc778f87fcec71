"""The request body limit sized for the models' contexts (gateway/serving/models.py, AdmissionConfig)."""

from __future__ import annotations

from types import SimpleNamespace

from gateway.serving.models import BODY_BYTES_MAX, BODY_BYTES_MIN, BODY_BYTES_UNKNOWN_CONTEXT, ModelCatalog
from gateway.tokenizer.service import TokenizerConfig


def worker(model: str, context: int | None):
    return SimpleNamespace(models=(model,), max_context_tokens=context, kind="http", url="http://w:80",
                           client=SimpleNamespace(architectures=()))


async def test_the_limit_follows_the_largest_context_and_has_a_floor_and_a_ceiling():
    catalog = ModelCatalog(TokenizerConfig(), None, None)
    assert catalog.body_bytes_max_auto == BODY_BYTES_UNKNOWN_CONTEXT  # nothing served yet
    await catalog.ensure(worker("small", 4096), 0)
    assert catalog.body_bytes_max_auto == BODY_BYTES_MIN  # 32 x 4,096 is under the floor
    await catalog.ensure(worker("long", 131_072), 0)
    assert catalog.body_bytes_max_auto == 32 * 131_072  # 4 MiB for a 128k context
    await catalog.ensure(worker("huge", 10_000_000), 0)
    assert catalog.body_bytes_max_auto == BODY_BYTES_MAX


async def test_a_model_without_a_stated_context_keeps_the_fixed_default():
    catalog = ModelCatalog(TokenizerConfig(), None, None)
    await catalog.ensure(worker("small", 4096), 0)
    await catalog.ensure(worker("proxied", None), 0)
    assert catalog.body_bytes_max_auto == BODY_BYTES_UNKNOWN_CONTEXT

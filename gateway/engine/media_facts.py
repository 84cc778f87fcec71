"""What a vision engine says about the images it takes (GetServerInfo), in the gateway's vocabulary.

vLLM's servicer advertises three facts the gateway must follow when it preprocesses images itself:

- ``mm_device_do_normalize``: the engine rescales and normalizes pixels on its device (vLLM's default for the
  Qwen-VL families since 0.2x) and takes the resized pixels' own uint8 values; anything else it would
  normalize twice (the answer is then garbage, with no error anywhere).
- ``mm_item_limits``: its ``--limit-mm-per-prompt`` as ``image=8,video=2``; its own server refuses more.
- ``mm_encoder_budget``: the most tokens one image (or video) may take and still be scheduled.

SGLang's servicer advertises none of them: its engines take normalized floats, with no bound said.
"""

from __future__ import annotations

import dataclasses
from typing import Any


@dataclasses.dataclass(frozen=True)
class MediaFacts:
    raw_pixels: bool = False  # the engine normalizes: send uint8 pixels
    images_max: int | None = None  # images per prompt (None: not said)
    videos_max: int | None = None  # videos per prompt (None: not said)
    image_tokens_max: int | None = None  # tokens of one image (None: not said)


def media_facts_of_vllm(response: Any) -> MediaFacts:
    """vLLM's GetServerInfoResponse read for the three facts above (its runtime asks: runtimes/vllm.py)."""
    fields = response.DESCRIPTOR.fields_by_name  # an older proto may lack them: not said
    raw = bool(response.mm_device_do_normalize) if "mm_device_do_normalize" in fields else False
    limits = _limits(response.mm_item_limits) if "mm_item_limits" in fields else {}
    budget = int(response.mm_encoder_budget) if "mm_encoder_budget" in fields else 0
    return MediaFacts(raw_pixels=raw, images_max=limits.get("image"), videos_max=limits.get("video"),
                      image_tokens_max=budget or None)


def _limits(label: str) -> dict[str, int]:
    """``image=8,video=2`` as {"image": 8, "video": 2}; what does not parse is left out (not said). A count of 0 is
    kept: the engine takes none of that modality (``--limit-mm-per-prompt '{"video": 0}'``, an image-only
    deployment's), and a request with one is refused here rather than failed by the engine."""
    out: dict[str, int] = {}
    for pair in label.split(","):
        modality, sep, count = pair.partition("=")
        if sep and count.strip().isdigit():
            out[modality.strip()] = int(count)
    return out

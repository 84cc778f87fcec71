"""The simulated engine as a Qwen3-VL model (``--vision-family qwen3_vl``): its bundle carries Qwen3-VL's image and
video processor configs (patch 16, ImageNet's 0.5 normalization, small pixel budgets so tests stay cheap), the
Qwen2-VL-style chat template of vision.py (Qwen3-VL's writes the same <|vision_start|><|video_pad|><|vision_end|>)
and a config.json that says ``qwen3_vl``. Images are checked as vision.py checks Qwen2-VL's, with rows of 16 x 16
patches. A VIDEO batch is checked as vLLM's Qwen3-VL needs it through the servicer's preprocessed path: the layout
of vision.py's videos, and each range the video's whole replacement (Qwen3VLProcessor's, vLLM's get_video_repl):
for each temporal patch its time as text ("<1.5 seconds>", times rising), <|vision_start|>, h * w / merge^2 video
tokens, <|vision_end|>; the servicer marks the video tokens in a range as the embedding positions (is_embed), so
their count must be the encoder's t * h * w / merge^2. Refused with INVALID_ARGUMENT naming what is off.
"""

from __future__ import annotations

import json
import re
from typing import Any

from . import vision
from .vision import CheckedImages, ImagesRefused

PATCH, TEMPORAL, MERGE = 16, 2, 2
PATCH_VALUES = 3 * TEMPORAL * PATCH * PATCH  # 1,536 values a patch row
PIXEL_FIELDS = {"patch_size": PATCH, "temporal_patch_size": TEMPORAL, "merge_size": MERGE,
                "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5], "rescale_factor": 1 / 255,
                "resample": 3}
PREPROCESSOR_CONFIG = {"image_processor_type": "Qwen2VLImageProcessorFast", **PIXEL_FIELDS,
                       "size": {"shortest_edge": 32 * 32 * 4, "longest_edge": 32 * 32 * 64}}  # at most 64 tokens
VIDEO_PREPROCESSOR_CONFIG = {"video_processor_type": "Qwen3VLVideoProcessor", **PIXEL_FIELDS, "fps": 2,
                             "size": {"shortest_edge": 32 * 32 * 4, "longest_edge": 32 * 32 * 256}}
MODEL_CONFIG = {"model_type": "qwen3_vl", "architectures": ["Qwen3VLForConditionalGeneration"],
                "image_token_id": vision.IMAGE_TOKEN_ID, "video_token_id": vision.VIDEO_TOKEN_ID}
_TIMESTAMP = re.compile(r"<(\d+\.\d) seconds>")


class Qwen3Tokens:
    """The Qwen tokenizer as it is (it has the vision tokens) and the ids the checks need."""

    def __init__(self, tokenizer_json: bytes) -> None:
        self.tokenizer = vision.tokenizer_with(tokenizer_json, ())
        self.tokenizer_json = tokenizer_json
        self.vision_start = self.tokenizer.token_to_id("<|vision_start|>")
        self.vision_end = self.tokenizer.token_to_id("<|vision_end|>")


def bundle_files(tokenizer_json: bytes) -> dict[str, bytes]:
    return {"preprocessor_config.json": json.dumps(PREPROCESSOR_CONFIG).encode(),
            "video_preprocessor_config.json": json.dumps(VIDEO_PREPROCESSOR_CONFIG).encode(),
            "chat_template.jinja": vision.CHAT_TEMPLATE.encode(), "config.json": json.dumps(MODEL_CONFIG).encode()}


def check_vllm(tokens: Qwen3Tokens, mm: Any, input_ids: "list[int]", config: Any) -> CheckedImages:
    return vision.check_vllm(mm, input_ids, config, PATCH_VALUES)


def check_sglang(tokens: Qwen3Tokens, mm: Any, input_ids: "list[int]") -> CheckedImages:
    raise ImagesRefused("this simulated Qwen3-VL is served by vLLM's service only")


def check_vllm_video(tokens: Qwen3Tokens, mm: Any, input_ids: "list[int]", config: Any) -> CheckedImages:
    pixels, grid, ranges = vision.video_layout(mm, config, PATCH_VALUES)
    for (t, h, w), (offset, length) in zip(grid.tolist(), ranges):
        if h % MERGE or w % MERGE or offset + length > len(input_ids):
            raise ImagesRefused(f"a video of grid {(t, h, w)} at ({offset}, {length}) does not fit the prompt")
        _check_replacement(tokens, input_ids[offset:offset + length], t, h * w // (MERGE * MERGE))
    return vision.checked_video(mm, input_ids, pixels, grid, ranges)


def _check_replacement(tokens: Qwen3Tokens, span: "list[int]", groups: int, per_group: int) -> None:
    """One video's range: ``groups`` times its time as text, <|vision_start|>, ``per_group`` video tokens and
    <|vision_end|>, the times rising."""
    seconds: list[float] = []
    at = 0
    for group in range(groups):
        start = span.index(tokens.vision_start, at) if tokens.vision_start in span[at:] else -1
        if start < 0:
            raise ImagesRefused(f"temporal patch {group} of the video has no <|vision_start|>")
        stamp = _TIMESTAMP.fullmatch(tokens.tokenizer.decode(span[at:start], skip_special_tokens=False))
        if stamp is None:
            raise ImagesRefused(f"temporal patch {group} is not preceded by its time as text")
        seconds.append(float(stamp.group(1)))
        body = span[start + 1:start + 1 + per_group]
        if body != [vision.VIDEO_TOKEN_ID] * per_group or span[start + 1 + per_group:start + 2 + per_group] != [
                tokens.vision_end]:
            raise ImagesRefused(f"temporal patch {group} is not {per_group} video tokens between the vision markers")
        at = start + 2 + per_group
    if at != len(span):
        raise ImagesRefused(f"the range holds {len(span) - at} tokens past the video's {groups} temporal patches")
    if seconds != sorted(seconds):
        raise ImagesRefused(f"the video's times {seconds} do not rise")

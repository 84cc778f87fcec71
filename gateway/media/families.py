"""The image processors by family, and the choice of one from a model's own files.

Each family is registered with the ``image_processor_type`` names of the ``preprocessor_config.json`` it reads (the
engine ships that file in its tokenizer bundle, so the gateway's numbers are the model's own) and built from it;
the families themselves live in processors.py (Qwen-VL, LLaVA/CLIP, Gemma 3, Pixtral) and a module each for the
larger ones (llama4.py, internvl.py, idefics3.py).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from ..base.registry import Registry
from .idefics3 import Idefics3Processor
from .internvl import InternVLProcessor
from .llama4 import Llama4Processor
from .processors import (QWEN3_VL_MODEL_TYPES, ClipStyleProcessor, Gemma3Processor, ImageProcessor, PixtralProcessor,
                         QwenVisionProcessor)

IMAGE_PROCESSORS: Registry[Callable[..., ImageProcessor]] = Registry("image processor")
IMAGE_PROCESSORS.add("qwen2_vl", lambda config, token_to_id, files: QwenVisionProcessor.from_config(
    config, token_to_id, partial_size=(files.get("config.json") or {}).get("model_type") in QWEN3_VL_MODEL_TYPES),
    "Qwen2-VL, Qwen2.5-VL, Qwen3-VL: smart_resize, patches by merge window, grid (t, h, w)",
    types=("Qwen2VLImageProcessor", "Qwen2VLImageProcessorFast", "Qwen2VLImageProcessorPil"))
IMAGE_PROCESSORS.add("llava", ClipStyleProcessor.from_config, "LLaVA 1.5 and CLIP-style: shortest side, center "
                     "crop, normalized", types=("CLIPImageProcessor", "CLIPImageProcessorFast", "CLIPImageProcessorPil",
                                                "LlavaImageProcessor", "LlavaImageProcessorFast",
                                                "LlavaImageProcessorPil"))
IMAGE_PROCESSORS.add("pixtral", PixtralProcessor.from_config, "Pixtral, Mistral 3: longest side within bounds, "
                     "sides in whole merged patches; rows of [IMG] ended by [IMG_BREAK], the last by [IMG_END]",
                     types=("PixtralImageProcessor", "PixtralImageProcessorFast", "PixtralImageProcessorPil"))
IMAGE_PROCESSORS.add("gemma3", Gemma3Processor.from_config, "Gemma 3: one square (896 published), bilinear, "
                     "normalized 0.5; soft tokens between <start_of_image> and <end_of_image>",
                     types=("Gemma3ImageProcessor", "Gemma3ImageProcessorFast", "Gemma3ImageProcessorPil"))
IMAGE_PROCESSORS.add("llama4", Llama4Processor.from_config, "Llama 4: a canvas of up to 16 tiles of 336 plus a "
                     "global view, normalized in bfloat16; <|patch|> runs between tile separators",
                     types=("Llama4ImageProcessor", "Llama4ImageProcessorFast"))
IMAGE_PROCESSORS.add("internvl", InternVLProcessor.from_config, "InternVL 2.5 / 3 (HF format): a grid of up to 12 "
                     "tiles of 448 nearest the aspect ratio plus a thumbnail; <IMG_CONTEXT> per tile between <img> "
                     "and </img>",
                     types=("GotOcr2ImageProcessor", "GotOcr2ImageProcessorFast", "GotOcr2ImageProcessorPil"))

IMAGE_PROCESSORS.add("idefics3", Idefics3Processor.from_config, "Idefics3 and SmolVLM: the longest edge to 4 tiles, "
                     "then whole tiles of 364 (512 SmolVLM) plus the global image, Lanczos; <row_i_col_j> before each "
                     "tile's <image> run", types=("Idefics3ImageProcessor", "Idefics3ImageProcessorFast",
                                                 "Idefics3ImageProcessorPil", "SmolVLMImageProcessor",
                                                 "SmolVLMImageProcessorFast", "SmolVLMImageProcessorPil"))


def image_processor(files: dict[str, dict[str, Any]], token_to_id: Callable[[str], "int | None"],
                    reference: str = "torchvision", encode_text: "Callable[[str], list[int]] | None" = None
                    ) -> "ImageProcessor | None":
    """The processor a model's files call for (its preprocessor_config.json, or processor_config.json's nested
    image_processor), None when they name none this node has; ProcessorConfigError when they name one wrongly.
    ``reference``: whose pixels it computes (processors.REFERENCES); ``encode_text``: the model's tokenizer, for a
    family that writes text into an image's prompt (Gemma 3's pan and scan)."""
    config = files.get("preprocessor_config.json") or {}
    processor_config = files.get("processor_config.json") or {}
    nested = processor_config.get("image_processor")
    if not config.get("image_processor_type") and isinstance(nested, dict):
        config = nested
    if "image_seq_length" in processor_config and "image_seq_length" not in config:  # the processor's own setting
        config = {**config, "image_seq_length": processor_config["image_seq_length"]}
    kind = config.get("image_processor_type")
    for plugin in IMAGE_PROCESSORS.plugins():
        if kind in plugin.detail("types", ()):
            processor = plugin.make(config, token_to_id, files)
            takes_text = any(field.name == "encode_text" for field in dataclasses.fields(processor))
            return dataclasses.replace(processor, reference=reference,
                                       **({"encode_text": encode_text} if takes_text else {}))
    return None


def with_node_kwargs(processor: Any, kwargs: "dict[str, Any]") -> "tuple[Any, list[str]]":
    """(``processor`` with the node's ``--media-processor-kwargs`` its family takes applied, the keys it does not
    take): a node serves many models, as vLLM's server serves one, so a setting meant for one family is not
    another's error. ValueError when a value is wrong."""
    taken = getattr(processor, "request_kwargs", ())
    ignored = [key for key in kwargs if key not in taken]
    wanted = {key: value for key, value in kwargs.items() if key in taken}
    return (processor.with_request_kwargs(wanted) if wanted else processor), ignored


def with_request_kwargs(processor: Any, kwargs: "dict[str, Any]") -> Any:
    """``processor`` with a request's ``mm_processor_kwargs`` applied (vLLM's per-request settings of the model's
    Hugging Face processor), for a family that takes some (``with_request_kwargs``); ValueError naming what it
    cannot take: a setting vLLM would apply and this node would not is refused rather than answered otherwise."""
    if not kwargs:
        return processor
    apply = getattr(processor, "with_request_kwargs", None)
    if apply is None:
        raise ValueError(f"this model's {getattr(processor, 'modality', 'image')}s ({processor.family}) take no "
                         "mm_processor_kwargs here")
    return apply(kwargs)

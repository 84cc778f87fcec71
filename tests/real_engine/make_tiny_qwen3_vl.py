"""Write a tiny random-weight Qwen3-VL model next to the real Qwen tokenizer files, with Qwen3-VL's processor configs
(its image processor's and its video processor's: patch 16, ImageNet's 0.5 normalization) and the Qwen-VL chat
template, for the video tests (test_vllm_video.py): its prompt carries each temporal patch's time as text.

Run with the vLLM virtual environment's Python, on the vision engines' PYTHONPATH:
    PYTHONPATH=.venv-vllm/vision-path .venv-vllm/bin/python tests/real_engine/make_tiny_qwen3_vl.py OUT_DIR TOKENIZER_DIR
Sizes: text hidden 128 (2 heads of 64, interleaved M-RoPE sections summing to 32), 2 layers; vision depth 2,
hidden 64, patch 16, merge 2, one deepstack layer; images at most 256 merged patches, videos 512 in all.
"""

import json
import sys
from pathlib import Path

import torch
from transformers import Qwen3VLConfig, Qwen3VLForConditionalGeneration

from make_tiny_qwen2_vl import IMAGE_PAD, VIDEO_PAD, VISION_END, VISION_START, save

TEXT_CONFIG = {"vocab_size": 151936, "hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 2,
               "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 64, "max_position_embeddings": 8192,
               "rope_parameters": {"rope_type": "default", "rope_theta": 5000000.0, "mrope_section": [12, 10, 10],
                                   "mrope_interleaved": True},
               "eos_token_id": 151645, "bos_token_id": 151643, "tie_word_embeddings": True}
PIXELS = {"patch_size": 16, "temporal_patch_size": 2, "merge_size": 2, "image_mean": [0.5, 0.5, 0.5],
          "image_std": [0.5, 0.5, 0.5], "do_rescale": True, "rescale_factor": 1 / 255, "do_normalize": True,
          "do_convert_rgb": True, "do_resize": True, "resample": 3}


def main(out_dir: str, tokenizer_dir: str) -> None:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    config = Qwen3VLConfig(
        text_config=TEXT_CONFIG,
        vision_config={"depth": 2, "hidden_size": 64, "intermediate_size": 128, "num_heads": 2, "patch_size": 16,
                       "spatial_merge_size": 2, "temporal_patch_size": 2, "in_channels": 3, "out_hidden_size": 128,
                       "num_position_embeddings": 256, "deepstack_visual_indexes": [1]},
        image_token_id=IMAGE_PAD, video_token_id=VIDEO_PAD, vision_start_token_id=VISION_START,
        vision_end_token_id=VISION_END, tie_word_embeddings=True)
    save(Qwen3VLForConditionalGeneration(config).to(torch.bfloat16), out, tokenizer_dir, "Qwen3VLProcessor")
    # Qwen3-VL's own processor configs over the Qwen2-VL ones save() wrote.
    (out / "preprocessor_config.json").write_text(json.dumps({
        "image_processor_type": "Qwen2VLImageProcessorFast", "processor_class": "Qwen3VLProcessor", **PIXELS,
        "size": {"shortest_edge": 32 * 32 * 4, "longest_edge": 32 * 32 * 256}}, indent=1))
    (out / "video_preprocessor_config.json").write_text(json.dumps({
        "video_processor_type": "Qwen3VLVideoProcessor", "processor_class": "Qwen3VLProcessor", **PIXELS,
        "fps": 2, "min_frames": 4, "max_frames": 768, "cap_pixels_per_frame": False,
        "size": {"shortest_edge": 32 * 32 * 4, "longest_edge": 32 * 32 * 512}}, indent=1))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])

"""Write a tiny random-weight Qwen2.5-VL model next to the real Qwen tokenizer files, with Qwen2-VL's processor config
and chat template (Qwen2.5-VL publishes the same ones), for the video tests (test_vllm_video.py): its M-RoPE reads
each video's seconds per temporal step, which Qwen2-VL's does not.

Run with the vLLM virtual environment's Python:
    .venv-vllm/bin/python tests/real_engine/make_tiny_qwen2_5_vl.py OUT_DIR TOKENIZER_DIR
Sizes: the text model of make_tiny_qwen2_vl.py; vision depth 2 (the second block full attention, the first
windowed), hidden 64, patch 14, merge 2, two position steps a second (tokens_per_second, so a video's time moves its
positions).
"""

import sys
from pathlib import Path

import torch
from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

from make_tiny_qwen2_vl import IMAGE_PAD, TEXT_CONFIG, VIDEO_PAD, VISION_END, VISION_START, save


def main(out_dir: str, tokenizer_dir: str) -> None:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    config = Qwen2_5_VLConfig(
        text_config=TEXT_CONFIG,
        vision_config={"depth": 2, "hidden_size": 64, "intermediate_size": 128, "num_heads": 2, "out_hidden_size": 128,
                       "fullatt_block_indexes": [1], "window_size": 112, "tokens_per_second": 2, "patch_size": 14,
                       "spatial_merge_size": 2, "temporal_patch_size": 2, "in_channels": 3},
        image_token_id=IMAGE_PAD, video_token_id=VIDEO_PAD, vision_start_token_id=VISION_START,
        vision_end_token_id=VISION_END, tie_word_embeddings=True)
    save(Qwen2_5_VLForConditionalGeneration(config).to(torch.bfloat16), out, tokenizer_dir, "Qwen2_5_VLProcessor")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])

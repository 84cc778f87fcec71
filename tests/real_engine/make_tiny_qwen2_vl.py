"""Write a tiny random-weight Qwen2-VL model next to the real Qwen tokenizer files, with Qwen2-VL's own
processor config and chat template, for the vision tests (test_vllm_media.py).

Run with the vLLM virtual environment's Python (it has transformers and torch):
    .venv-vllm/bin/python tests/real_engine/make_tiny_qwen2_vl.py OUT_DIR TOKENIZER_DIR
The weights are random, so the text is gibberish; the vision tower, the processor's numbers, the placeholder
tokens and every gRPC message are the real ones. Sizes: text hidden 128 (2 heads of 64, M-RoPE sections
summing to 32), vision depth 2, patch 14, merge 2; images at most 28 x 28 x 256 pixels (256 tokens) so a
CPU engine answers in seconds.
"""

import json
import shutil
import sys
from pathlib import Path

import torch
from transformers import Qwen2VLConfig, Qwen2VLForConditionalGeneration

# The Qwen tokenizer's vision tokens (the same ids in Qwen2-VL's, Qwen2.5's and Qwen3's vocabularies).
VISION_START, VISION_END, IMAGE_PAD, VIDEO_PAD = 151652, 151653, 151655, 151656
CLIP_MEAN = [0.48145466, 0.4578275, 0.40821073]  # Qwen2-VL's published normalization (OpenAI CLIP's)
CLIP_STD = [0.26862954, 0.26130258, 0.27577711]
# Qwen2-VL-2B-Instruct's published chat template: an image part becomes <|vision_start|><|image_pad|><|vision_end|>.
CHAT_TEMPLATE = (
    "{% set image_count = namespace(value=0) %}{% set video_count = namespace(value=0) %}"
    "{% for message in messages %}{% if loop.first and message['role'] != 'system' %}<|im_start|>system\n"
    "You are a helpful assistant.<|im_end|>\n{% endif %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}<|im_end|>\n"
    "{% else %}{% for content in message['content'] %}"
    "{% if content['type'] == 'image' or 'image' in content or 'image_url' in content %}"
    "{% set image_count.value = image_count.value + 1 %}{% if add_vision_id %}Picture {{ image_count.value }}: "
    "{% endif %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif content['type'] == 'video' or 'video' in content %}{% set video_count.value = video_count.value + 1 %}"
    "{% if add_vision_id %}Video {{ video_count.value }}: {% endif %}<|vision_start|><|video_pad|><|vision_end|>"
    "{% elif 'text' in content %}{{ content['text'] }}{% endif %}{% endfor %}<|im_end|>\n"
    "{% endif %}{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


# The text model: hidden 128, 2 heads of 64, M-RoPE sections summing to 32 (Qwen2.5-VL's tiny model shares it).
TEXT_CONFIG = {"vocab_size": 151936, "hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 2,
               "num_attention_heads": 2, "num_key_value_heads": 1, "max_position_embeddings": 4096,
               "rope_scaling": {"type": "mrope", "mrope_section": [8, 12, 12]},
               "rope_parameters": {"rope_type": "default", "mrope_section": [8, 12, 12], "rope_theta": 1000000.0},
               "eos_token_id": 151645, "bos_token_id": 151643, "tie_word_embeddings": True}


def main(out_dir: str, tokenizer_dir: str) -> None:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    config = Qwen2VLConfig(
        text_config=TEXT_CONFIG,
        vision_config={"depth": 2, "embed_dim": 64, "hidden_size": 128, "num_heads": 2, "mlp_ratio": 2,
                       "patch_size": 14, "spatial_merge_size": 2, "temporal_patch_size": 2, "in_channels": 3},
        image_token_id=IMAGE_PAD, video_token_id=VIDEO_PAD, vision_start_token_id=VISION_START,
        vision_end_token_id=VISION_END, tie_word_embeddings=True)
    save(Qwen2VLForConditionalGeneration(config).to(torch.bfloat16), out, tokenizer_dir, "Qwen2VLProcessor")


def save(model, out: Path, tokenizer_dir: str, processor_class: str) -> None:
    """The model, the Qwen tokenizer with the template above, and Qwen2-VL's image processor config (small images),
    which the family's other models share (make_tiny_qwen2_5_vl.py)."""
    model.save_pretrained(out)
    for name in ("tokenizer.json", "vocab.json", "merges.txt"):
        shutil.copy(Path(tokenizer_dir) / name, out / name)
    tokenizer_config = json.loads((Path(tokenizer_dir) / "tokenizer_config.json").read_text())
    tokenizer_config["chat_template"] = CHAT_TEMPLATE
    (out / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=1))
    (out / "preprocessor_config.json").write_text(json.dumps({
        "image_processor_type": "Qwen2VLImageProcessor", "processor_class": processor_class,
        "min_pixels": 56 * 56, "max_pixels": 28 * 28 * 256, "patch_size": 14, "temporal_patch_size": 2,
        "merge_size": 2, "image_mean": CLIP_MEAN, "image_std": CLIP_STD, "do_rescale": True,
        "rescale_factor": 1 / 255, "do_normalize": True, "do_convert_rgb": True, "do_resize": True,
        "resample": 3}, indent=1))
    print(out)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])

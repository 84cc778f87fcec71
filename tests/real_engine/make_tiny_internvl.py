"""Write a tiny random-weight InternVL in the Hugging Face format (InternVLForConditionalGeneration, as the "-hf"
checkpoints of InternVL 2.5 / 3) for test_vllm_internvl.py: GotOcr2's image processor config and InternVL's
processor config, the simulated InternVL's chat template (chaos/sim_engine/vision_internvl.py) and the Qwen
tokenizer with <img>, </img>, <IMG_CONTEXT> and <video> added.

Run with the vLLM virtual environment's Python (it has transformers and torch):
    .venv-vllm/bin/python tests/real_engine/make_tiny_internvl.py OUT_DIR TOKENIZER_DIR
The weights are random, so the text is gibberish; the processor's numbers, the tiles and every gRPC message are
InternVL's. Sizes: Qwen2 text hidden 64 (2 heads of 32), 2 layers; vision 1 layer of 32, tiles of 56 pixels in
patches of 14, downsampled 0.5 (4 <IMG_CONTEXT> a tile), at most 4 tiles, so a CPU engine answers in seconds.
"""

import json
import sys
from pathlib import Path

import torch
from transformers import InternVLConfig, InternVLForConditionalGeneration

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run as a script, from the vLLM venv
from chaos.sim_engine.vision_internvl import CHAT_TEMPLATE, InternVLTokens  # noqa: E402
from tests.real_engine.tiny_models import write_tokenizer  # noqa: E402

TILE, PATCH, MAX_TILES = 56, 14, 4
TOKENS_PER_TILE = (TILE // PATCH) ** 2 // 4


def main(out_dir: str, tokenizer_dir: str) -> None:
    out = Path(out_dir)
    tokens = InternVLTokens((Path(tokenizer_dir) / "tokenizer.json").read_bytes())
    write_tokenizer(out, tokenizer_dir, tokens.tokenizer_json, CHAT_TEMPLATE, extra_special_tokens={
        "start_image_token": "<img>", "end_image_token": "</img>", "context_image_token": "<IMG_CONTEXT>",
        "video_token": "<video>"})
    torch.manual_seed(0)
    config = InternVLConfig(
        text_config={"model_type": "qwen2", "vocab_size": 151936, "hidden_size": 64, "intermediate_size": 128,
                     "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 32,
                     "max_position_embeddings": 4096, "eos_token_id": 151645, "bos_token_id": 151643,
                     "tie_word_embeddings": True},
        vision_config={"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2,
                       "image_size": [TILE, TILE], "patch_size": [PATCH, PATCH]},
        image_token_id=tokens.context, image_seq_length=TOKENS_PER_TILE, downsample_ratio=0.5)
    model = InternVLForConditionalGeneration(config).to(torch.bfloat16)
    model.save_pretrained(out)
    (out / "generation_config.json").write_text(json.dumps({"eos_token_id": 151645, "bos_token_id": 151643}))
    (out / "preprocessor_config.json").write_text(json.dumps({
        "image_processor_type": "GotOcr2ImageProcessorFast", "processor_class": "InternVLProcessor",
        "crop_to_patches": False, "min_patches": 1, "max_patches": MAX_TILES, "do_convert_rgb": True,
        "do_normalize": True, "do_rescale": True, "do_resize": True, "resample": 3, "rescale_factor": 1 / 255,
        "image_mean": [0.485, 0.456, 0.406], "image_std": [0.229, 0.224, 0.225],
        "size": {"height": TILE, "width": TILE}}, indent=1))
    (out / "processor_config.json").write_text(json.dumps({
        "processor_class": "InternVLProcessor", "image_seq_length": TOKENS_PER_TILE}, indent=1))
    print(out)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])

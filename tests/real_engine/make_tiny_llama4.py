"""Write a tiny random-weight Llama 4 vision model for test_vllm_llama4.py: Llama 4's processor configs
(Llama4ImageProcessor, Llama4Processor) and its tiled image sequence, with a tokenizer made from the Qwen one (Meta's
is not on this machine) that has Llama 4's image, tile and header tokens, and the chat template of the simulated
Llama 4 (chaos/sim_engine/vision_llama4.py).

Run with the vLLM virtual environment's Python (it has transformers and torch):
    .venv-vllm/bin/python tests/real_engine/make_tiny_llama4.py OUT_DIR TOKENIZER_DIR
The weights are random, so the text is gibberish; the processor's numbers, the tile sequence and every gRPC message
are Llama 4's. Sizes: text hidden 64 (2 heads of 32), 2 dense layers (no experts: vLLM's CPU build is then plain
attention and MLPs; the image path does not touch the experts) without chunked attention; vision 1 layer, tiles of
56 pixels in patches of 14 shuffled 2 x 2 (4 <|patch|> a tile), at most 4 tiles, so a CPU engine answers in seconds.
"""

import json
import sys
from pathlib import Path

import torch
from transformers import Llama4Config, Llama4ForConditionalGeneration

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run as a script, from the vLLM venv
from chaos.sim_engine.vision_llama4 import CHAT_TEMPLATE, Llama4Tokens  # noqa: E402
from tests.real_engine.tiny_models import write_tokenizer  # noqa: E402

TILE, PATCH, MAX_TILES = 56, 14, 4


def main(out_dir: str, tokenizer_dir: str) -> None:
    out = Path(out_dir)
    # The simulated Llama 4's tokenizer and template: the same tokens added, the same template.
    tokens = Llama4Tokens((Path(tokenizer_dir) / "tokenizer.json").read_bytes())
    write_tokenizer(out, tokenizer_dir, tokens.tokenizer_json, CHAT_TEMPLATE, bos_token="<|im_start|>",
                    eos_token="<|eot|>")
    eot = json.loads(tokens.tokenizer_json)["added_tokens"]
    eot = next(t["id"] for t in eot if t["content"] == "<|eot|>")
    torch.manual_seed(0)
    config = Llama4Config(
        text_config={"vocab_size": 151936, "hidden_size": 64, "intermediate_size": 128, "intermediate_size_mlp": 128,
                     "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 32,
                     "max_position_embeddings": 4096, "moe_layers": [], "interleave_moe_layer_step": 0,
                     "num_local_experts": 1, "attention_chunk_size": None, "eos_token_id": eot,
                     "bos_token_id": 151644, "pad_token_id": 151643},
        # The pixel shuffle's MLP takes intermediate_size inputs: the hidden size times 1 / ratio^2 (4), as Llama 4's
        # 1408 -> 5632 (vLLM's CPU linear overruns its buffer rather than refusing a mismatch).
        vision_config={"hidden_size": 32, "intermediate_size": 128, "num_hidden_layers": 1, "num_attention_heads": 2,
                       "image_size": TILE, "patch_size": PATCH, "pixel_shuffle_ratio": 0.5, "vision_output_dim": 32,
                       "projector_input_dim": 32, "projector_output_dim": 32},
        boi_token_index=tokens.start, eoi_token_index=tokens.end, image_token_index=tokens.patch)
    model = Llama4ForConditionalGeneration(config).to(torch.bfloat16)
    model.save_pretrained(out)
    (out / "generation_config.json").write_text(json.dumps({"eos_token_id": eot, "bos_token_id": 151644}))
    (out / "preprocessor_config.json").write_text(json.dumps({
        "image_processor_type": "Llama4ImageProcessorFast", "processor_class": "Llama4Processor",
        "do_convert_rgb": True, "do_normalize": True, "do_rescale": True, "do_resize": True, "resample": 2,
        "rescale_factor": 1 / 255, "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5],
        "max_patches": MAX_TILES, "resize_to_max_canvas": False, "size": {"height": TILE, "width": TILE}}, indent=1))
    (out / "processor_config.json").write_text(json.dumps({
        "processor_class": "Llama4Processor", "patch_size": PATCH, "pixel_shuffle_ratio": 0.5,
        "fake_image_token": "<|image|>", "image_token": "<|image|>"}, indent=1))
    print(out)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])

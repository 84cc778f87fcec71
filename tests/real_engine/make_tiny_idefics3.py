"""Write a tiny random-weight Idefics3 (Idefics3ForConditionalGeneration) for test_vllm_idefics3.py: Idefics3's image
processor config and processor config, the simulated Idefics3's chat template (chaos/sim_engine/vision_idefics3.py)
and the Qwen tokenizer with <fake_token_around_image>, <image>, <global-img>, <end_of_utterance> and the
<row_i_col_j> tokens added.

Run with the vLLM virtual environment's Python (it has transformers and torch):
    .venv-vllm/bin/python tests/real_engine/make_tiny_idefics3.py OUT_DIR TOKENIZER_DIR
The weights are random, so the text is gibberish; the processor's numbers, the tiles and every gRPC message are
Idefics3's. Sizes: Llama text hidden 64 (2 heads of 32), 2 layers; a SigLIP-style vision tower of 1 layer of 32,
tiles of 56 pixels in patches of 14, pixel-shuffled by 2 (4 <image> a tile), the longest edge 4 tiles.
"""

import json
import sys
from pathlib import Path

import torch
from transformers import Idefics3Config, Idefics3ForConditionalGeneration

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run as a script, from the vLLM venv
from chaos.sim_engine.vision_idefics3 import CHAT_TEMPLATE, Idefics3Tokens  # noqa: E402
from tests.real_engine.tiny_models import write_tokenizer  # noqa: E402

TILE, PATCH, SCALE = 56, 14, 2
TOKENS_PER_TILE = (TILE // PATCH) ** 2 // SCALE ** 2


def main(out_dir: str, tokenizer_dir: str) -> None:
    out = Path(out_dir)
    tokens = Idefics3Tokens((Path(tokenizer_dir) / "tokenizer.json").read_bytes())
    write_tokenizer(out, tokenizer_dir, tokens.tokenizer_json, CHAT_TEMPLATE)
    torch.manual_seed(0)
    config = Idefics3Config(
        text_config={"model_type": "llama", "vocab_size": 151936, "hidden_size": 64, "intermediate_size": 128,
                     "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 32,
                     "max_position_embeddings": 4096, "eos_token_id": 151645, "bos_token_id": 151643,
                     "tie_word_embeddings": True},
        vision_config={"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2,
                       "image_size": TILE, "patch_size": PATCH},
        image_token_id=tokens.image, scale_factor=SCALE, tie_word_embeddings=True)
    model = Idefics3ForConditionalGeneration(config).to(torch.bfloat16)
    model.save_pretrained(out)
    (out / "generation_config.json").write_text(json.dumps({"eos_token_id": 151645, "bos_token_id": 151643}))
    (out / "preprocessor_config.json").write_text(json.dumps({
        "image_processor_type": "Idefics3ImageProcessor", "processor_class": "Idefics3Processor",
        "do_convert_rgb": True, "do_image_splitting": True, "do_normalize": True, "do_pad": True, "do_rescale": True,
        "do_resize": True, "resample": 1, "rescale_factor": 1 / 255, "image_mean": [0.5, 0.5, 0.5],
        "image_std": [0.5, 0.5, 0.5], "size": {"longest_edge": 4 * TILE},
        "max_image_size": {"longest_edge": TILE}}, indent=1))
    (out / "processor_config.json").write_text(json.dumps({
        "processor_class": "Idefics3Processor", "image_seq_len": TOKENS_PER_TILE}, indent=1))
    print(out)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])

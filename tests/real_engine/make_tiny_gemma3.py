"""Write a tiny random-weight Gemma 3 vision model for test_vllm_gemma3.py: Gemma 3's processor
(Gemma3ImageProcessor, Gemma3Processor) and its image sequence, with a tokenizer made from the Qwen one (Gemma's
own is not on this machine) that has Gemma 3's image and turn tokens and newline tokens as Gemma's vocabulary has
them ("\\n" up to four in a row as one token: the joins the image sequence makes with the text's newlines), and the
chat template of the simulated Gemma 3 (chaos/sim_engine/vision_gemma3.py).

Run with the vLLM virtual environment's Python (it has transformers and torch):
    .venv-vllm/bin/python tests/real_engine/make_tiny_gemma3.py OUT_DIR TOKENIZER_DIR
The weights are random, so the text is gibberish; the processor's numbers, the image sequence and every gRPC
message are Gemma 3's. Sizes: text hidden 64 (2 heads of 32), 2 layers; SigLIP vision 64 x 64 pixels in 16 x 16
patches, 1 layer; 4 soft tokens an image (the 4 x 4 patches pooled 2 x 2), so a CPU engine answers in seconds.
"""

import json
import sys
from pathlib import Path

import tokenizers
import torch
from safetensors.torch import load_file, save_file
from transformers import Gemma3Config, Gemma3ForConditionalGeneration

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run as a script, from the vLLM venv
from chaos.sim_engine.vision_gemma3 import CHAT_TEMPLATE, Gemma3Tokens  # noqa: E402
from tests.real_engine.tiny_models import write_tokenizer  # noqa: E402

IMAGE_SIZE, PATCH, TOKENS_PER_IMAGE = 64, 16, 4
SPECIAL = ("<start_of_image>", "<end_of_image>", "<image_soft_token>", "<start_of_turn>", "<end_of_turn>")


def main(out_dir: str, tokenizer_dir: str) -> None:
    out = Path(out_dir)
    # The simulated Gemma 3's tokenizer and template: the same tokens added, the same template.
    tokens = Gemma3Tokens((Path(tokenizer_dir) / "tokenizer.json").read_bytes())
    write_tokenizer(out, tokenizer_dir, tokens.tokenizer_json, CHAT_TEMPLATE, eos_token="<end_of_turn>",
                    extra_special_tokens={"boi_token": "<start_of_image>", "eoi_token": "<end_of_image>",
                                          "image_token": "<image_soft_token>"})
    tok = tokenizers.Tokenizer.from_str(tokens.tokenizer_json.decode())
    ids = {t: tok.token_to_id(t) for t in SPECIAL}
    torch.manual_seed(0)
    config = Gemma3Config(
        text_config={"vocab_size": 151936, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
                     "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 32,
                     "max_position_embeddings": 4096, "sliding_window": 512, "query_pre_attn_scalar": 32,
                     "eos_token_id": ids["<end_of_turn>"], "bos_token_id": None, "pad_token_id": 151643},
        vision_config={"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2,
                       "image_size": IMAGE_SIZE, "patch_size": PATCH, "vision_use_head": False},
        mm_tokens_per_image=TOKENS_PER_IMAGE, boi_token_index=ids["<start_of_image>"],
        eoi_token_index=ids["<end_of_image>"], image_token_index=ids["<image_soft_token>"],
        eos_token_id=ids["<end_of_turn>"])
    model = Gemma3ForConditionalGeneration(config)
    # transformers starts the projection of the image's features at zero (a trained model's is not): random here,
    # on the scale of the text's embeddings, or no image would move the answer.
    torch.nn.init.normal_(model.model.multi_modal_projector.mm_input_projection_weight, std=0.05)
    model = model.to(torch.bfloat16)
    model.save_pretrained(out)
    # The published checkpoints' names (vision_tower.vision_model.*), which vLLM's loader maps; transformers 5 saves
    # the vision tower's without the vision_model level.
    weights = load_file(out / "model.safetensors")
    save_file({("vision_tower.vision_model." + k[len("vision_tower."):] if k.startswith("vision_tower.") else k): v
               for k, v in weights.items()}, out / "model.safetensors", metadata={"format": "pt"})
    (out / "generation_config.json").write_text(json.dumps({"eos_token_id": ids["<end_of_turn>"]}))
    (out / "preprocessor_config.json").write_text(json.dumps({
        "image_processor_type": "Gemma3ImageProcessor", "processor_class": "Gemma3Processor",
        "do_convert_rgb": None, "do_normalize": True, "do_pan_and_scan": None, "do_rescale": True,
        "do_resize": True, "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5], "resample": 2,
        "rescale_factor": 1 / 255, "size": {"height": IMAGE_SIZE, "width": IMAGE_SIZE},
        "image_seq_length": TOKENS_PER_IMAGE}, indent=1))
    (out / "processor_config.json").write_text(json.dumps({
        "image_seq_length": TOKENS_PER_IMAGE, "processor_class": "Gemma3Processor"}, indent=1))
    print(out)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])

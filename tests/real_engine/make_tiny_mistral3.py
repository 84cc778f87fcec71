"""Write a tiny random-weight Mistral 3 vision model (Mistral Small 3.1's architecture: a Pixtral vision tower,
patches merged 2 x 2) for test_vllm_mistral3.py: Pixtral's processor configs (PixtralImageProcessor,
PixtralProcessor) and its image rows, with a tokenizer made from the Qwen one (Mistral's is not on this machine)
that has the [IMG], [IMG_BREAK], [IMG_END], [INST] and [/INST] tokens, and a chat template in Mistral's shape (the
simulated Mistral 3's, chaos/sim_engine/vision_pixtral.py).

Run with the vLLM virtual environment's Python (it has transformers and torch):
    .venv-vllm/bin/python tests/real_engine/make_tiny_mistral3.py OUT_DIR TOKENIZER_DIR
The weights are random, so the text is gibberish; the processor's numbers, the image rows and every gRPC message
are Mistral 3's. Sizes: text hidden 64 (2 heads of 32), 2 layers; vision 1 layer, patch 14, images at most 112
pixels a side (at most 4 x 4 merged patches, 20 tokens with the row ends), so a CPU engine answers in seconds.
"""

import json
import sys
from pathlib import Path

import torch
from transformers import Mistral3Config, Mistral3ForConditionalGeneration

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run as a script, from the vLLM venv
from chaos.sim_engine.vision_pixtral import CHAT_TEMPLATE, PixtralTokens  # noqa: E402
from tests.real_engine.tiny_models import write_tokenizer  # noqa: E402

LONGEST_EDGE, PATCH, MERGE = 112, 14, 2


def main(out_dir: str, tokenizer_dir: str) -> None:
    out = Path(out_dir)
    # The simulated Mistral 3's tokenizer and template: the same tokens added, the same template.
    tokens = PixtralTokens((Path(tokenizer_dir) / "tokenizer.json").read_bytes())
    write_tokenizer(out, tokenizer_dir, tokens.tokenizer_json, CHAT_TEMPLATE)
    ids = {"[IMG]": tokens.image}
    torch.manual_seed(0)
    config = Mistral3Config(
        text_config={"model_type": "mistral", "vocab_size": 151936, "hidden_size": 64, "intermediate_size": 128,
                     "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 32,
                     "max_position_embeddings": 4096, "eos_token_id": 151645, "bos_token_id": 151643,
                     "sliding_window": None},
        vision_config={"model_type": "pixtral", "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
                       "num_attention_heads": 2, "head_dim": 16, "image_size": LONGEST_EDGE, "patch_size": PATCH,
                       "num_channels": 3},
        image_token_index=ids["[IMG]"], spatial_merge_size=MERGE, vision_feature_layer=-1,
        multimodal_projector_bias=False, projector_hidden_act="gelu")
    model = Mistral3ForConditionalGeneration(config).to(torch.bfloat16)
    model.save_pretrained(out)
    (out / "generation_config.json").write_text(json.dumps({"eos_token_id": 151645, "bos_token_id": 151643}))
    (out / "preprocessor_config.json").write_text(json.dumps({
        "image_processor_type": "PixtralImageProcessor", "processor_class": "PixtralProcessor",
        "do_convert_rgb": True, "do_normalize": True, "do_rescale": True, "do_resize": True, "resample": 3,
        "rescale_factor": 1 / 255, "image_mean": [0.48145466, 0.4578275, 0.40821073],
        "image_std": [0.26862954, 0.26130258, 0.27577711], "patch_size": {"height": PATCH, "width": PATCH},
        "size": {"longest_edge": LONGEST_EDGE}}, indent=1))
    (out / "processor_config.json").write_text(json.dumps({
        "processor_class": "PixtralProcessor", "patch_size": PATCH, "spatial_merge_size": MERGE,
        "image_token": "[IMG]", "image_break_token": "[IMG_BREAK]", "image_end_token": "[IMG_END]"}, indent=1))
    print(out)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])

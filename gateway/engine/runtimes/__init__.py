"""Engine kinds: one module each, each registering itself in ``ENGINE_RUNTIMES`` (``base.py`` says what a kind
holds and answers).

    sglang.SglangRuntime           SGLang's scheduler service
    vllm.VllmRuntime               vLLM's engine service
    trtllm.TrtllmRuntime           TensorRT-LLM's service
    mlx.MlxRuntime                 MLX's engine service (Apple silicon)
    tokenspeed.TokenSpeedRuntime   TokenSpeed's scheduler service

The registry's order is detection's (the order of the imports below): an engine is the first kind whose
GetModelInfo it answers.
"""

from .base import BOOTSTRAP_ROOM, ENGINE_RUNTIMES, KV_TRANSFER_PARAMS, EngineRuntime
from .sglang import SglangRuntime
from .vllm import VllmRuntime
from .trtllm import TrtllmRuntime
from .mlx import MlxRuntime
from .tokenspeed import TokenSpeedRuntime

__all__ = ["BOOTSTRAP_ROOM", "ENGINE_RUNTIMES", "KV_TRANSFER_PARAMS", "EngineRuntime", "MlxRuntime", "SglangRuntime",
           "TokenSpeedRuntime", "TrtllmRuntime", "VllmRuntime"]

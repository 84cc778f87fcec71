"""What an engine says about prefill/decode disaggregation (GetServerInfo), in the gateway's vocabulary.

Read once when a prefill or decode worker registers; ``gateway/workers/pairing.py`` decides from it which
workers may pair.
"""

from __future__ import annotations

import dataclasses
from typing import Any


@dataclasses.dataclass(frozen=True)
class PairingInfo:
    """What an engine reported about disaggregation (GetServerInfo); "" / 0 where it said nothing."""

    protocol: str = ""  # SMG_PAIRING_PROTOCOL of the engine process
    mode: str = ""  # the role the engine runs in: prefill, decode, regular ("" when unknown)
    kv_connector: str = ""  # vLLM: NixlConnector, MooncakeConnector...
    engine_id: str = ""  # vLLM: kv_transfer_config.engine_id
    kv_cache_dtype: str = ""
    block_size: int = 0
    model_dtype: str = ""
    attention_backend: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in dataclasses.asdict(self).items() if v}


def _vllm_mode(kv_role: str) -> str:
    """kv_both (or no connector) runs either way: no mode to hold a registration to."""
    return {"kv_producer": "prefill", "kv_consumer": "decode"}.get(kv_role, "")


def pairing_from_server_info(runtime: str, response: Any) -> PairingInfo:
    """The pairing facts of a GetServerInfo answer (``sglang_scheduler_pb2`` or ``vllm_engine_pb2``)."""
    if runtime == "vllm":
        return PairingInfo(protocol=response.pairing_protocol, mode=_vllm_mode(response.kv_role),
                           kv_connector=response.kv_connector, engine_id=response.kv_engine_id,
                           kv_cache_dtype=response.kv_cache_dtype, block_size=int(response.block_size),
                           model_dtype=response.model_dtype, attention_backend=response.attention_backend)
    # SGLang reports its server arguments as a Struct: disaggregation_mode is prefill, decode or "null".
    args = dict(response.server_args.items()) if response.HasField("server_args") else {}
    mode = str(args.get("disaggregation_mode") or "")
    return PairingInfo(protocol=str(args.get("pairing_protocol") or ""),
                       mode="regular" if mode == "null" else mode if mode in ("prefill", "decode") else "",
                       kv_connector=str(args.get("disaggregation_transfer_backend") or ""))

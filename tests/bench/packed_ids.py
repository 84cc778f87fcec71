"""A prompt's ids into an engine request: upb's ``extend`` and serialization against gateway/engine/packed_ids.py.

Not a test: it prints figures. For each prompt length, the ids of real text (the Qwen3 tokenizer that ships with
the node, encoding smg_compare.py's long prompt, ``LONG_TEXT``, cut to the length) go into a vLLM GenerateRequest
both ways, and the request is serialized: the median of ``--repeats`` timings of ``--number`` builds each, and their
ratio.
The two serializations are checked to parse to the same message first. Where the ratio crosses 1 is where
``PACKED_IDS_MIN`` belongs.

    python tests/bench/packed_ids.py [--lengths 512 1024 2048 4096 7800 16000] [--number 300] [--repeats 9]
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import timeit
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from smg_grpc_proto.generated import vllm_engine_pb2 as vl  # noqa: E402

from gateway.engine import packed_ids  # noqa: E402
from gateway.tokenizer.bundled import default_tokenizer_dir  # noqa: E402
from tests.bench.smg_compare import LONG_TEXT  # noqa: E402


def prompt_ids_of_real_text(length: int) -> "list[int]":
    import tokenizers

    tokenizer = tokenizers.Tokenizer.from_file(str(default_tokenizer_dir() / "tokenizer.json"))
    ids: list[int] = []
    while len(ids) < length:
        ids += tokenizer.encode(LONG_TEXT).ids
    return ids[:length]


def build(ids: "list[int]", packed: bool) -> bytes:
    request = vl.GenerateRequest(request_id="bench-1", stream=True)
    request.sampling_params.max_tokens = 16
    if not packed:
        request.tokenized.input_ids.extend(ids)
        return request.SerializeToString()
    return packed_ids.with_prompt_ids(request, "tokenized", "input_ids", ids).SerializeToString()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lengths", type=int, nargs="+", default=[512, 1024, 2048, 4096, 7800, 16000])
    parser.add_argument("--number", type=int, default=300)
    parser.add_argument("--repeats", type=int, default=9)
    args = parser.parse_args()
    print(f"# {platform.python_implementation()} {platform.python_version()}; the node's PACKED_IDS_MIN: "
          f"{packed_ids.PACKED_IDS_MIN} (0 here, to time the packed path at every length)")
    print("| ids | upb extend + serialize (us) | packed (us) | packed / upb |")
    print("|---|---|---|---|")
    packed_ids.PACKED_IDS_MIN = 0
    longest = prompt_ids_of_real_text(max(args.lengths))
    for length in args.lengths:
        ids = longest[:length]
        assert vl.GenerateRequest.FromString(build(ids, True)) == vl.GenerateRequest.FromString(build(ids, False))
        times = {}
        for packed in (False, True):
            runs = timeit.repeat(lambda packed=packed: build(ids, packed), number=args.number, repeat=args.repeats)
            times[packed] = statistics.median(runs) / args.number * 1e6
        print(f"| {length} | {times[False]:.1f} | {times[True]:.1f} | {times[True] / times[False]:.2f} |")


if __name__ == "__main__":
    main()

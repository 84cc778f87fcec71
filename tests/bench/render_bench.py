"""Chat-template render cost of smg_compare's request bodies: Jinja2 against MiniJinja, one process.

    python tests/bench/render_bench.py

Each scenario's first eight conversations (as parse_chat hands them over) are rendered by the
bundled Qwen3 template with both renderers (checked equal first); the figure is the median of five
timeit runs, in microseconds per render.
"""

import statistics
import sys
import timeit
from pathlib import Path

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from gateway.api.protocol import parse_chat  # noqa: E402
from gateway.tokenizer.bundled import default_tokenizer_dir  # noqa: E402
from gateway.tokenizer.chat_template import ChatTemplate  # noqa: E402
from gateway.tokenizer.service import TokenizerService  # noqa: E402
from tests.bench.smg_compare import conversation_bodies  # noqa: E402


def main() -> None:
    fast = TokenizerService.from_directory(default_tokenizer_dir()).chat_template
    if fast.fast is None:
        raise SystemExit(f"MiniJinja is not used for this template: {fast.fast_refusal}")
    reference = ChatTemplate(fast.source, fast._special, fast=False)
    for scenario in ("short", "multiturn", "long"):
        bodies = conversation_bodies(scenario, False)
        conversations = [parse_chat(orjson.loads(next(bodies))).messages for _ in range(8)]
        for messages in conversations:
            assert fast.render(messages) == reference.render(messages)
        medians = {}
        for name, template in (("jinja2", reference), ("minijinja", fast)):
            number = 50 if scenario == "long" else 200
            runs = [timeit.timeit(lambda: [template.render(m) for m in conversations], number=number)
                    / (number * len(conversations)) * 1e6 for _ in range(5)]
            medians[name] = statistics.median(runs)
        print(f"{scenario:9} jinja2 {medians['jinja2']:7.1f} us  minijinja {medians['minijinja']:7.1f} us  "
              f"ratio {medians['jinja2'] / medians['minijinja']:.1f}x")


if __name__ == "__main__":
    main()

"""The README's tables of what can be plugged in, made from the registries (``gateway/base/registry.py``).

Each table sits in README.md between ``<!-- registry: NAME -->`` and ``<!-- /registry -->``;
``tests/unit/test_registries.py`` holds the README to these, so a member registered in its module and not
in the README fails the suite. ``python -m gateway.cli.catalog`` prints them (paste them in after adding one).
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable

from ..history import HISTORY_BACKENDS
from ..media.processors import IMAGE_PROCESSORS
from ..parsers import REASONING_PARSERS, TOOL_CALL_PARSERS
from ..base.registry import named
from ..routing.policies import POLICIES

TABLES: dict[str, Callable[[], str]] = {
    "tool-call parsers": lambda: TOOL_CALL_PARSERS.markdown_table(
        ("tool-call parser", "format", "models"), lambda p: (named(p), p.summary, p.detail("models", ""))),
    "reasoning parsers": lambda: REASONING_PARSERS.markdown_table(
        ("reasoning parser", "format", "models"), lambda p: (named(p), p.summary, p.detail("models", ""))),
    "routing policies": lambda: POLICIES.markdown_table(("`--policy`", "sends a request to"),
                                                        lambda p: (named(p), p.summary)),
    "history backends": lambda: HISTORY_BACKENDS.markdown_table(("`--history-backend`", "stores"),
                                                                lambda p: (named(p), p.summary)),
    "image processors": lambda: IMAGE_PROCESSORS.markdown_table(("image processor", "what it does"),
                                                                lambda p: (named(p), p.summary)),
}
_BLOCK = re.compile(r"<!-- registry: (?P<name>[^>]+?) -->\n(?P<table>.*?)\n<!-- /registry -->", re.S)


def readme_tables(readme: str) -> dict[str, str]:
    """The tables README holds, by name."""
    return {m.group("name"): m.group("table") for m in _BLOCK.finditer(readme)}


def main() -> None:
    for name, table in TABLES.items():
        sys.stdout.write(f"<!-- registry: {name} -->\n{table()}\n<!-- /registry -->\n\n")


if __name__ == "__main__":
    main()

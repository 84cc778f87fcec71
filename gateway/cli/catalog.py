"""The docs' tables of what can be plugged in and of ``serve``'s options, made from the registries
(``gateway/base/registry.py``) and the subsystems' option declarations (``gateway/node/subsystems.py``).

Each table sits in README.md or a page of ``docs/`` between ``<!-- registry: NAME -->`` and ``<!-- /registry -->``;
``tests/unit/test_registries.py`` holds the docs to these, so a member registered in its module, or an option
declared beside its subsystem, that the docs do not show fails the suite. ``python -m gateway.cli.catalog``
prints them all; ``--write`` puts them in place (a new table's block is written by hand first).
"""

from __future__ import annotations

import pathlib
import re
import sys
from collections.abc import Callable, Iterable
from typing import Any

from ..base.options import HELP_SECTIONS, Option
from ..base.registry import named
from ..history import HISTORY_BACKENDS
from ..media.families import IMAGE_PROCESSORS
from ..node import config as node_config
from ..parsers import REASONING_PARSERS, TOOL_CALL_PARSERS
from ..providers import PROVIDERS
from ..routing.policies import POLICIES


def _cell(text: Any) -> str:
    """A value inside a markdown table cell: pipes escaped, no line breaks."""
    return str(text).replace("|", "\\|").replace("\n", " ")


def _default_cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, (list, tuple)):
        return _cell(" ".join(str(item) for item in value))
    return f"`{_cell(value)}`"


def options_table(options: "Iterable[Option]") -> str:
    """One section of ``serve``'s options: the flag, its environment variable (the TOML key is the flag's name
    with underscores), its default and what it sets, in --help's order."""
    lines = ["| flag | environment | default | what it sets |", "|---|---|---|---|"]
    for option in options:
        if option.internal:
            continue
        text, default = node_config.help_parts(option)
        env = node_config.ENV_PREFIX + option.flag[2:].upper().replace("-", "_")
        secret = " (a secret: give it by environment or the config file)" if option.secret else ""
        lines.append(f"| `{option.flag}` | `{env}` | {_default_cell(default)} | {_cell(text)}{secret} |")
    return "\n".join(lines)


def _options_of(section: str) -> Callable[[], str]:
    return lambda: options_table(option for option in node_config.OPTIONS if option.section == section)


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
    "providers": lambda: PROVIDERS.markdown_table(("`provider`", "what it speaks"), lambda p: (named(p), p.summary)),
    **{f"options: {key}": _options_of(key) for key, _ in HELP_SECTIONS},
}
# A block's table holds no HTML comment: a block with no table yet (a new one) does not run into the next.
_BLOCK = re.compile(r"<!-- registry: (?P<name>[^>]+?) -->\n(?P<table>(?:(?!<!--).)*?)\n?<!-- /registry -->", re.S)


def readme_tables(readme: str) -> dict[str, str]:
    """The tables a page holds, by name."""
    return {m.group("name"): m.group("table") for m in _BLOCK.finditer(readme)}


def docs_tables(root: pathlib.Path) -> dict[str, list[tuple[str, str]]]:
    """The tables README.md and the pages of ``docs/`` hold: by name, each page that holds one and its table."""
    found: dict[str, list[tuple[str, str]]] = {}
    for page in [root / "README.md", *sorted((root / "docs").glob("*.md"))]:
        for name, table in readme_tables(page.read_text(encoding="utf-8")).items():
            found.setdefault(name, []).append((str(page.relative_to(root)), table))
    return found


def write(root: pathlib.Path, tables: "dict[str, Callable[[], str]]") -> list[str]:
    """Rewrite, in README.md and docs/, every table of ``tables`` to what its source makes now; the pages changed."""
    changed = []
    for page in [root / "README.md", *sorted((root / "docs").glob("*.md"))]:
        text = page.read_text(encoding="utf-8")
        made = _BLOCK.sub(lambda m: (f"<!-- registry: {m.group('name')} -->\n{tables[m.group('name')]()}\n"
                                     "<!-- /registry -->") if m.group("name") in tables else m.group(0), text)
        if made != text:
            page.write_text(made, encoding="utf-8")
            changed.append(str(page.relative_to(root)))
    return changed


def main(argv: "list[str] | None" = None) -> None:
    """Print every table; ``--write``: put them in place in README.md and docs/ (a new table's block, with its
    name, is written by hand first: where it goes is the page's to say)."""
    args = sys.argv[1:] if argv is None else argv
    if args == ["--write"]:
        for page in write(pathlib.Path(__file__).resolve().parents[2], TABLES):
            sys.stdout.write(f"rewrote {page}\n")
        return
    for name, table in TABLES.items():
        sys.stdout.write(f"<!-- registry: {name} -->\n{table()}\n<!-- /registry -->\n\n")


if __name__ == "__main__":
    main()

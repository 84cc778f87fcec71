"""docs/chaos.md's tables of the scenarios and the checkers, made from ``SCENARIOS`` and the checker modules.

The tables sit between ``<!-- registry: NAME -->`` and ``<!-- /registry -->`` as the gateway's do
(``gateway/cli/catalog.py``); ``tests/unit/test_chaos_catalog.py`` holds the page to these, so a scenario or
checker added without its line fails the suite. ``python -m chaos.catalog`` prints them.
"""

from __future__ import annotations

import sys
from collections.abc import Callable

from .checkers import all_checkers
from .scenarios import ENGINE_SCENARIOS, SCENARIO_SPECS, SCENARIOS


def _cluster_of(name: str) -> str:
    """What the scenario's cluster is beyond the defaults, and the fewest nodes it runs on."""
    spec = SCENARIO_SPECS.get(name, {})
    notes = [f"{spec['models']} models" if "models" in spec else "",
             f"prefill/decode pairs, {spec['engines']} engines" if spec.get("pd") else "",
             f"{spec['workers']} processes a node" if "workers" in spec else "",
             f"`{spec['mesh_preset']}` timers" if "mesh_preset" in spec else ""]
    nodes = "2+ nodes" if name in ENGINE_SCENARIOS else "3+ nodes"
    return "; ".join([nodes, *(note for note in notes if note)])


def scenarios_table() -> str:
    lines = ["| scenario | faults | cluster |", "|---|---|---|"]
    lines += [f"| `{name}` | {text} | {_cluster_of(name)} |" for name, (_, text) in SCENARIOS.items()]
    return "\n".join(lines)


def checkers_table() -> str:
    """Each checker's name and the first sentence of what its module says it checks."""
    lines = ["| check | holds when |", "|---|---|"]
    for module in all_checkers():
        first = (module.__doc__ or "").strip().split("\n\n")[0].replace("\n", " ")
        claim = first.split(": ", 1)[-1]
        claim = claim.split(". ", 1)[0].rstrip(".")
        lines.append(f"| {module.NAME} | {claim} |")
    return "\n".join(lines)


TABLES: dict[str, Callable[[], str]] = {"chaos scenarios": scenarios_table, "chaos checkers": checkers_table}


def main() -> None:
    for name, table in TABLES.items():
        sys.stdout.write(f"<!-- registry: {name} -->\n{table()}\n<!-- /registry -->\n\n")


if __name__ == "__main__":
    main()

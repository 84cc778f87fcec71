"""docs/chaos.md's tables are the harness's own: every scenario of ``SCENARIOS`` and every checker of
``all_checkers()`` with what it says of itself (chaos/catalog.py), so one added without its line fails here."""

from __future__ import annotations

import pathlib

import pytest

from chaos import catalog
from gateway.cli.catalog import readme_tables

PAGE = pathlib.Path(__file__).resolve().parents[2] / "docs" / "chaos.md"


@pytest.mark.parametrize("name", sorted(catalog.TABLES))
def test_the_chaos_page_table_is_the_harnesss(name):
    expected = catalog.TABLES[name]()
    assert readme_tables(PAGE.read_text(encoding="utf-8")).get(name) == expected, \
        f"docs/chaos.md's '{name}' table is not the harness's; `python -m chaos.catalog` prints it:\n{expected}"


def test_every_scenario_has_its_row():
    table = catalog.scenarios_table()
    assert all(f"| `{name}` |" in table for name in catalog.SCENARIOS)
    assert "2+ nodes; prefill/decode pairs, 4 engines" in table  # a scenario's needs said from SCENARIO_SPECS

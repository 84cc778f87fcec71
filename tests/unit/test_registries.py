"""One registry per pluggable kind (gateway/base/registry.py): lookups by name and alias, the docs' tables made
from them and from the subsystems' options (a member or an option missing from the docs fails here), and a member
added in one place reaching every reader: the config's check, --help, the parser choice, the server's start of a
history backend."""

from __future__ import annotations

import dataclasses
import pathlib

import pytest

from gateway.cli import catalog
from gateway.node import config as cfg
from gateway.history import HISTORY_BACKENDS, HistoryBackend
from gateway.parsers import REASONING_PARSERS, TOOL_CALL_PARSERS, tool_call_parser
from gateway.parsers import choice
from gateway.parsers.tool_calls import TaggedParser
from gateway.base.registry import Registry
from gateway.routing.policies import POLICIES, PolicyConfig, make_policy

ROOT = pathlib.Path(__file__).resolve().parents[2]
DOCS_TABLES = catalog.docs_tables(ROOT)


@pytest.mark.parametrize("name", sorted(catalog.TABLES))
def test_the_docs_table_is_the_registrys(name):
    expected = catalog.TABLES[name]()
    held = DOCS_TABLES.get(name, [])
    assert len(held) == 1, f"the '{name}' table belongs on one page of README.md or docs/, not {held or 'none'}"
    page, table = held[0]
    assert table == expected, \
        f"{page}'s '{name}' table is not the registry's; `python -m gateway.cli.catalog` prints it:\n{expected}"


def test_lookups_by_name_and_alias_and_refusals():
    registry: Registry[str] = Registry("widget", off=("none",))
    registry.add("a", "A", "the first", aliases=("alpha",), models="x")
    assert registry["a"] == registry["alpha"] == "A" and "alpha" in registry and registry.get("b") is None
    assert registry.names() == ["a"] and sorted(registry) == ["a", "alpha"] and registry.choices() == "a, none"
    assert registry.check("none", "--widget") is None and registry.check(None, "--widget") is None
    assert registry.check("b", "--widget") == "--widget: unknown widget 'b'; choose one of a, none"
    for taken in ("a", "alpha", "none"):
        with pytest.raises(ValueError):
            registry.add(taken, "B", "again")
    assert registry.plugin("alpha").detail("models") == "x"


def test_aliases_and_registered_names_still_make_their_parsers():
    for name in ("qwen", "hermes", "qwen25", "llama3_json", "deepseek_v31", "kimi_k2", "glm", "gpt-oss", "openai"):
        assert name in TOOL_CALL_PARSERS
    assert isinstance(tool_call_parser("hermes", None), TaggedParser)
    assert REASONING_PARSERS["minimax_m2"] is REASONING_PARSERS["minimax"]
    assert set(POLICIES.names()) == {"cache_aware", "round_robin", "random", "power_of_two", "least_load",
                                     "consistent_hashing", "prefix_hash", "manual"}
    assert make_policy(PolicyConfig(name="least_load")).name == "least_load"


@pytest.fixture
def extra_parser():
    """A tool-call parser added the way a new one is: one registration in its own module."""
    TOOL_CALL_PARSERS.add("acme", TaggedParser, "`<tool_call>`", models="Acme-1", ids=("acme-1",),
                          architectures=("acmeforcausallm",))
    yield
    TOOL_CALL_PARSERS._plugins.pop("acme")
    TOOL_CALL_PARSERS._by_any_name.pop("acme")


def test_a_parser_registered_in_its_module_reaches_config_help_and_the_choice(extra_parser, capsys):
    validate = lambda name: cfg.validate(dataclasses.replace(cfg.GatewayConfig(), tool_call_parser=name))  # noqa
    validate("acme")
    with pytest.raises(cfg.ConfigError, match="unknown tool-call parser 'acne'"):
        validate("acne")
    option = next(o for o in cfg.OPTIONS if o.flag == "--tool-call-parser")
    assert "acme" in cfg._help_with_default(option)
    # The choice tables are built when choice.py loads; a parser registered later is read the same way.
    assert choice._patterns(TOOL_CALL_PARSERS)["acme-1"] == "acme"
    assert choice._architectures(TOOL_CALL_PARSERS)["acmeforcausallm"] == "acme"


async def test_a_history_backend_registered_in_its_module_is_chosen_started_and_checked(nursery):
    @dataclasses.dataclass(frozen=True)
    class SqliteConfig:
        path: str | None = None

    started = []

    async def start(section, history, cluster, nursery):
        started.append(section.path)
        return None

    backend = HistoryBackend(start, "sqlite", SqliteConfig(), check=lambda s: None if s.path else "no --sqlite-path",
                             options=(cfg.Option("--sqlite-path", "sqlite.path", str, "where", "history"),))
    HISTORY_BACKENDS.add("sqlite", backend, "a file")
    try:
        assert "sqlite" in HISTORY_BACKENDS.choices()
        assert cfg.GatewayConfig().sqlite == SqliteConfig()  # its section, with its defaults
        config = dataclasses.replace(cfg.GatewayConfig(), history_backend="sqlite",
                                     plugin_sections=(("sqlite", SqliteConfig("/tmp/h.db")),))
        cfg.validate(config)
        with pytest.raises(cfg.ConfigError, match="no --sqlite-path"):
            cfg.validate(dataclasses.replace(config, plugin_sections=()))
        from gateway.base.subsystem import StartContext
        from gateway.history.subsystem import SUBSYSTEM as HISTORY
        assert await HISTORY.start(StartContext(config, nursery, {"cluster": None, "tracing": None})) is None
        assert started == ["/tmp/h.db"]
    finally:
        HISTORY_BACKENDS._plugins.pop("sqlite")
        HISTORY_BACKENDS._by_any_name.pop("sqlite")
    with pytest.raises(AttributeError):
        cfg.GatewayConfig().sqlite

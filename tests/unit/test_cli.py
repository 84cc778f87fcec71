"""The smg-node command line: --version, and serve --help in sections with every default shown."""

from __future__ import annotations

import subprocess
import sys

import pytest

from gateway.node import config as cfg
from gateway.cli.command import parse_args, version


def test_every_option_is_declared_once_in_a_section_or_internal():
    flags = [opt.flag for opt in cfg.OPTIONS]
    assert len(set(flags)) == len(flags)
    keys = {key for key, _ in cfg.HELP_SECTIONS}
    assert all(opt.section in keys for opt in cfg.OPTIONS)
    assert cfg.INTERNAL_FLAGS == {"--worker-index", "--http-reuse-port", "--mesh-private"}


def test_serve_help_has_the_sections_and_hides_internal_flags(capsys):
    with pytest.raises(SystemExit):
        parse_args(["serve", "--help"])
    text = capsys.readouterr().out
    positions = [text.index(title + ":") for _, title in cfg.HELP_SECTIONS]
    assert positions == sorted(positions)
    for flag in cfg.INTERNAL_FLAGS:
        assert flag not in text
    # Each flag under its own section's title (the sections come from the declarations, not a list of flags).
    for key, title in cfg.HELP_SECTIONS:
        section = text[text.index(title + ":"):]
        following = [t for _, t in cfg.HELP_SECTIONS if t != title and section.find(t + ":") > 0]
        section = section[:min(section.index(t + ":") for t in following)] if following else section
        for opt in cfg.OPTIONS:
            if opt.section == key and not opt.internal:
                assert opt.flag in section, (opt.flag, title)


def test_choices_in_help_and_config_come_from_the_registries(capsys):
    from gateway.history import HISTORY_BACKENDS
    from gateway.parsers import REASONING_PARSERS, TOOL_CALL_PARSERS
    from gateway.routing.policies import POLICIES
    with pytest.raises(SystemExit):
        parse_args(["serve", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for registry in (HISTORY_BACKENDS, TOOL_CALL_PARSERS, REASONING_PARSERS, POLICIES):
        assert registry.choices() in text, registry.kind
    assert "memory, postgres, redis" in HISTORY_BACKENDS.choices() and "gpt_oss" in TOOL_CALL_PARSERS.choices()


@pytest.mark.parametrize("opt", [o for o in cfg.OPTIONS if not o.internal], ids=lambda o: o.flag)
def test_every_default_is_shown(opt):
    value = cfg.GatewayConfig()
    for part in opt.path.split("."):
        value = getattr(value, part, None)
    shown = cfg._help_with_default(opt)
    if opt.kind in ("bool", "disable") or value in (None, ()):
        return  # switches, and options whose absence means none, say so in words
    assert "default" in shown, f"{opt.flag}: {shown}"


def test_version():
    run = subprocess.run([sys.executable, "-m", "gateway.cli", "--version"], capture_output=True, text=True,
                         timeout=60)
    assert run.returncode == 0 and run.stdout.strip() == f"smg-node {version()}" and version() != "unknown"


def test_the_cli_imports_no_serving_machinery_for_its_other_commands():
    """Issue 34: members and --help took 1.3-5 s, importing every subsystem; they must start at once."""
    probe = ("import sys, gateway.cli.command as cli; cli.build_parser(); "
             "print(sorted(m for m in ('gateway.node.config', 'gateway.node.server', 'psycopg', 'redis', 'trio', 'tokenizers') "
             "if m in sys.modules))")
    run = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0 and run.stdout.strip() == "[]", run.stdout + run.stderr


def test_node_options_are_taken_before_and_after_the_command():
    assert parse_args(["keys", "list", "--url", "http://x:1"]).url == "http://x:1"
    assert parse_args(["keys", "--url", "http://y:1", "list"]).url == "http://y:1"
    assert parse_args(["keys", "--admin-token", "t", "revoke", "abc"]).admin_token == "t"
    assert parse_args(["members", "--rpc-addr", "a:1"]).rpc_addr == "a:1"
    assert parse_args(["--rpc-addr", "b:1", "members", "--json"]).rpc_addr == "b:1"
    assert parse_args(["--node", "30001", "leave"]).node == "30001" and parse_args(["members"]).rpc_addr is None


def test_every_command_takes_the_same_node_flags_before_or_after_it():
    from gateway.cli.node_client import node_url

    for argv in (["--node", "30005", "keys", "list"], ["keys", "--node", "30005", "list"],
                 ["workers", "list", "--node", "30005"], ["models", "--node", "30005"]):
        assert node_url(parse_args(argv)) == "http://127.0.0.1:30005", argv
    for argv in (["keys", "list", "--rpc-token", "t"], ["--admin-token", "t", "workers", "list"],
                 ["members", "--admin-token", "t"], ["keyring", "list", "--rpc-token", "t"]):
        args = parse_args(argv)
        assert "t" in (getattr(args, "admin_token", None), getattr(args, "rpc_token", None)), argv
    assert parse_args(["members", "--url", "http://127.0.0.1:30001"]).url == "http://127.0.0.1:30001"


def test_workers_add_keeps_the_workers_url_apart_from_the_nodes():
    for argv in (["workers", "add", "grpc://engine:5000", "--url", "http://node:30001"],
                 ["workers", "--url", "http://node:30001", "add", "grpc://engine:5000"]):
        args = parse_args(argv)
        assert (args.worker_url, args.url) == ("grpc://engine:5000", "http://node:30001"), argv


def test_an_unknown_serve_flag_prints_serves_usage():
    run = subprocess.run([sys.executable, "-m", "gateway.cli", "serve", "--no-such-flag"], capture_output=True,
                         text=True, timeout=60)
    assert run.returncode == 2 and "usage: smg-node serve" in run.stderr and "--no-such-flag" in run.stderr


def test_the_sim_engines_help_says_each_default_once():
    run = subprocess.run([sys.executable, "-m", "chaos.sim_engine", "--help"], capture_output=True, text=True,
                         timeout=60)
    assert run.returncode == 0 and "(default: None)" not in run.stdout
    assert run.stdout.count("(default:") == len([line for line in run.stdout.splitlines() if "(default:" in line])


def test_each_local_node_records_its_endpoint_and_the_cli_picks_the_only_live_one_or_asks(tmp_path, monkeypatch):
    import socket

    from mesh.admin_client import admin_addr
    from mesh.admin_token import FILE_ENV, forget_endpoint, record_endpoint, recorded_endpoints
    monkeypatch.setenv(FILE_ENV, str(tmp_path / "admin-token"))
    monkeypatch.delenv("SMG_NODE_RPC_ADDR", raising=False)
    listeners = [socket.create_server(("127.0.0.1", 0)) for _ in range(2)]
    addrs = [f"127.0.0.1:{s.getsockname()[1]}" for s in listeners]
    try:
        record_endpoint(addrs[0], 30000)
        record_endpoint("127.0.0.1:1", 30005)  # a node killed without a goodbye: its record stays, nobody answers
        assert admin_addr(None) == addrs[0]  # the only live one
        record_endpoint(addrs[1], 30001)  # a second node of the same user: it does not overwrite the first
        assert recorded_endpoints() == {"30000": addrs[0], "30001": addrs[1], "30005": "127.0.0.1:1"}
        with pytest.raises(SystemExit) as asked:
            admin_addr(None)
        assert "--node 30000" in str(asked.value) and "--node 30001" in str(asked.value)
        assert admin_addr(None, "30001") == addrs[1] and admin_addr("x:9", "30001") == "x:9"
        forget_endpoint(30001, addrs[1])
        assert admin_addr(None) == addrs[0]
    finally:
        for s in listeners:
            s.close()

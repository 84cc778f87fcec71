"""The smg-node command line: --version, and serve --help in sections with every default shown."""

from __future__ import annotations

import subprocess
import sys

import pytest

from gateway import config as cfg
from gateway.cli import build_parser, version


def test_every_option_is_in_exactly_one_section_or_internal():
    flags = [opt.flag for opt in cfg._OPTIONS]
    placed = [flag for _, section in cfg.HELP_SECTIONS for flag in section]
    assert sorted(placed + sorted(cfg.INTERNAL_FLAGS)) == sorted(flags)
    assert len(set(placed)) == len(placed)


def test_serve_help_has_the_sections_and_hides_internal_flags(capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--help"])
    text = capsys.readouterr().out
    positions = [text.index(title + ":") for title, _ in cfg.HELP_SECTIONS]
    assert positions == sorted(positions)
    for flag in cfg.INTERNAL_FLAGS:
        assert flag not in text


@pytest.mark.parametrize("opt", [o for o in cfg._OPTIONS if o.flag not in cfg.INTERNAL_FLAGS], ids=lambda o: o.flag)
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

"""The chaos harness says what is missing before a run starts, and how to get it."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

from chaos import preflight


def test_nothing_missing_here_when_the_test_extra_is_installed(monkeypatch):
    monkeypatch.setattr(preflight.shutil, "which", lambda name: f"/usr/sbin/{name}")
    assert preflight.missing("nginx") == []


def test_each_missing_piece_is_named_with_its_remedy(monkeypatch):
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(preflight.importlib.util, "find_spec",
                        lambda name: None if name == "matplotlib" else real_find_spec(name))
    monkeypatch.setattr(preflight.shutil, "which", lambda name: None)
    problems = preflight.missing("haproxy")
    assert len(problems) == 2
    assert "'matplotlib'" in problems[0] and "smg-node[chaos]" in problems[0]
    assert "apt-get install haproxy" in problems[1]


def test_a_run_without_its_balancer_stops_before_starting_anything(tmp_path):
    # From another directory, as an installed package: a balancer that cannot exist is refused at once.
    run = subprocess.run([sys.executable, "-m", "chaos", "run", "kill-one", "--lb", "nginx", "--out", str(tmp_path)],
                         cwd=tmp_path, capture_output=True, text=True, timeout=60,
                         env={"PATH": str(tmp_path), "HOME": str(tmp_path)})
    assert run.returncode == 2 and "apt-get install nginx" in run.stderr, run.stderr
    assert not any(tmp_path.iterdir()) or all(p.name.startswith(".") for p in tmp_path.iterdir())

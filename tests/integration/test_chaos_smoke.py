"""CI's chaos smoke run: the harness end to end on a short scenario, every checker included."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(shutil.which("nginx") is None, reason="nginx not installed (.ci/run installs it)")


def test_isolate_one_scenario_passes_every_check(tmp_path):
    # isolate-one: a network fault (one node cut off, then healed) under load, through nginx.
    result = subprocess.run([sys.executable, "-m", "chaos", "run", "isolate-one", "--nodes", "3", "--duration", "20",
                             "--seed", "7", "--out", str(tmp_path), "--base-port", "25000"],
                            capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    report = json.loads((tmp_path / "isolate-one" / "report.json").read_text())
    assert report["passed"] and {c["name"] for c in report["checks"]} == {
        "requests lost", "membership converged", "replicated state equal", "KV index equal", "rate limits held"}
    assert report["requests"]["ok"] > 100 and report["requests"]["rate_limited"] > 0
    assert sum(report["requests_per_second"]["ok"]) == report["requests"]["ok"] and report["failures"] == []
    assert (tmp_path / "isolate-one" / "timeline.png").stat().st_size > 10_000
    assert "t=" in result.stdout  # progress was shown while it ran
    assert "report: " in result.stdout

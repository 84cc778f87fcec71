"""CI's chaos smoke runs: the harness end to end on two short scenarios, every checker included."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(shutil.which("nginx") is None, reason="nginx not installed (.ci/run installs it)")


@pytest.mark.parametrize("scenario, base_port", [
    ("isolate-one", 25000),  # a network fault: one node cut off from the others, then healed
    ("kill-one", 25400),     # a process fault: SIGKILL under load, then a restart under the same name
    ("kill-history-owners", 25800),  # two owners of stored responses killed in turn, each restarted empty
])
def test_smoke_scenario_passes_every_check(tmp_path, scenario, base_port):
    result = subprocess.run([sys.executable, "-m", "chaos", "run", scenario, "--nodes", "3", "--duration", "20",
                             "--seed", "7", "--out", str(tmp_path), "--base-port", str(base_port)],
                            capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    report = json.loads((tmp_path / scenario / "report.json").read_text())
    assert report["passed"] and {c["name"] for c in report["checks"]} == {
        "requests lost", "membership converged", "replicated state equal", "KV index equal", "rate limits held",
        "stored responses kept"}
    assert report["requests"]["ok"] > 100 and report["requests"]["rate_limited"] > 0
    stored = next(c for c in report["checks"] if c["name"] == "stored responses kept")
    assert stored["details"]["acknowledged"] > 10, stored  # the chains ran, and were checked
    assert sum(report["requests_per_second"]["ok"]) == report["requests"]["ok"]
    assert len(report["failures"]) == report["requests"]["error"]
    assert (tmp_path / scenario / "timeline.png").stat().st_size > 10_000
    assert "t=" in result.stdout  # progress was shown while it ran
    assert "report: " in result.stdout

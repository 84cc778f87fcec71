"""A run's report: JSON for machines, Markdown for people, a PNG timeline for the eyes.

The timeline has one band per node (how many members it sees alive; grey when
it does not answer, hatched when not ready), the faults as shaded spans, and
under it the requests per second by outcome.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .run import RunData


def write_report(run: RunData, out_dir: Path, command: str) -> dict[str, Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {"json": out_dir / "report.json", "markdown": out_dir / "report.md", "png": out_dir / "timeline.png"}
    paths["json"].write_text(json.dumps(to_json(run, command), indent=1))
    write_png(run, paths["png"])
    paths["markdown"].write_text(to_markdown(run, command, paths["png"].name))
    return paths


def _outcomes(run: RunData) -> dict[str, int]:
    return {o: sum(1 for r in run.records if r.outcome == o) for o in ("ok", "rate_limited", "error")}


def compact(report: dict[str, Any]) -> dict[str, Any]:
    """Keep the JSON small enough to live in the repository: requests as per-second counts plus every
    failure in full, and each view sample as (t, node, members alive, ready, members not alive)."""
    detail = report.pop("requests_detail", None)
    if detail is not None:
        seconds = int(max((r["start_s"] + r["duration_s"] for r in detail), default=0)) + 1
        series = {o: [0] * seconds for o in ("ok", "rate_limited", "error")}
        for r in detail:
            k = int(r["start_s"] + r["duration_s"])
            if 0 <= k < seconds:
                series[r["outcome"]][k] += 1
        report["requests_per_second"] = series
        report["failures"] = [r for r in detail if r["outcome"] == "error"]
    views = report.get("views")
    if views and isinstance(views[0], dict):
        report["views"] = [[v["t_s"], v["node"], None if v["members"] is None else
                            sum(1 for st in v["members"].values() if st == "alive"), v["ready"],
                            None if v["members"] is None else
                            {n: st for n, st in v["members"].items() if st != "alive"}] for v in views]
        report["views_columns"] = ["t_s", "node", "alive_seen", "ready", "not_alive"]
    return report


def to_json(run: RunData, command: str) -> dict[str, Any]:
    return compact({
        "scenario": run.scenario, "seed": run.seed, "nodes": run.nodes, "engines": run.engines,
        "duration_s": run.duration_s, "command": command, "passed": run.passed,
        "events": [{"t_s": round(e.t - run.t0, 3), "planned_s": e.at_s, "label": e.label, "kind": e.kind}
                   for e in run.events],
        "heal_s": round(run.heal_t - run.t0, 3),
        "requests": _outcomes(run),
        "checks": [{"name": r.name, "passed": r.passed, "summary": r.summary, "details": r.details}
                   for r in run.results],
        "requests_detail": [{"kind": r.kind, "key": r.api_key, "model": r.model, "start_s": round(r.start - run.t0, 3),
                             "duration_s": round(r.duration_s, 4), "outcome": r.outcome, "status": r.status,
                             "error": r.error} for r in run.records],
        "views": [{"t_s": round(s.t - run.t0, 3), "node": run.node_names[s.node], "members": s.members,
                   "ready": s.ready} for s in run.samples],
    })


def to_markdown(run: RunData, command: str, png_name: str) -> str:
    counts = _outcomes(run)
    lines = [f"# Chaos run: `{run.scenario}` — {'PASSED' if run.passed else 'FAILED'}", "",
             f"`{command}`", "",
             f"{run.nodes} nodes, {run.engines} simulated engines, seed {run.seed}, {run.duration_s:.0f} s of load "
             f"through the load balancer ({counts['ok']} answered, {counts['rate_limited']} rate-limited, "
             f"{counts['error']} failed).", "",
             "| check | result | |", "|---|---|---|"]
    for r in run.results:
        lines.append(f"| {r.name} | {'pass' if r.passed else '**FAIL**'} | {r.summary} |")
    lines += ["", "| t (s) | fault |", "|---|---|"]
    for e in run.events:
        lines.append(f"| {e.t - run.t0:.1f} | {e.label} |")
    lines += ["", f"![timeline]({png_name})", ""]
    failed = [r for r in run.results if not r.passed and r.details.get("examples")]
    for r in failed:
        lines += [f"## {r.name}: examples", "", "```", *[json.dumps(x) for x in r.details["examples"]], "```", ""]
    return "\n".join(lines)


def write_png(run: RunData, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.colors import Normalize

    n = len(run.node_names)
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(12, 2.2 + 0.45 * n), sharex=True,
                                      gridspec_kw={"height_ratios": [n, 3]})
    cmap = plt.get_cmap("RdYlGn")
    norm = Normalize(0, n)
    by_node: dict[int, list] = {i: [] for i in range(n)}
    for s in sorted(run.samples, key=lambda s: s.t):
        by_node[s.node].append(s)
    for i, samples in by_node.items():
        for a, b in zip(samples, samples[1:] + [None]):
            start = a.t - run.t0
            width = (b.t - a.t) if b is not None else 0.5
            if a.members is None:
                top.broken_barh([(start, width)], (i - 0.4, 0.8), facecolors="#999999")
                continue
            alive = sum(1 for st in a.members.values() if st == "alive")
            top.broken_barh([(start, width)], (i - 0.4, 0.8), facecolors=cmap(norm(alive)),
                            hatch=None if a.ready else "//", edgecolor="white" if not a.ready else None,
                            linewidth=0)
    top.set_yticks(range(n), [f"{name} sees" for name in run.node_names])
    top.invert_yaxis()
    top.set_title(f"{run.scenario} (seed {run.seed}): members each node sees alive "
                  f"(green = all {n}, grey = no answer, hatched = not ready)", pad=16)
    for e in run.events:
        x = e.t - run.t0
        for ax in (top, bottom):
            ax.axvline(x, color="black", linewidth=0.8, linestyle="--")
        top.annotate(e.label, (x, -0.6), fontsize=7, rotation=0, ha="left", va="bottom", annotation_clip=False)
    heal = run.heal_t - run.t0
    for ax in (top, bottom):
        first = min((e.t - run.t0 for e in run.events), default=heal)
        ax.axvspan(first, heal, color="#f4cccc", alpha=0.35, linewidth=0)
    seconds = int(max(run.duration_s, max((r.end - run.t0 for r in run.records), default=0))) + 1
    series = {o: [0] * seconds for o in ("ok", "rate_limited", "error")}
    for r in run.records:
        k = int(r.end - run.t0)
        if 0 <= k < seconds:
            series[r.outcome][k] += 1
    xs = list(range(seconds))
    bottom.stackplot(xs, series["ok"], series["rate_limited"], series["error"],
                     colors=["#6aa84f", "#f6b26b", "#cc0000"], labels=["answered", "rate-limited (429)", "failed"],
                     step="post")
    bottom.set_ylabel("requests/s")
    bottom.set_xlabel("seconds into the run")
    bottom.legend(loc="upper right", fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)

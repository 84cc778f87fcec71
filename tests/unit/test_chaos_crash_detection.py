"""The crash-detection checker (chaos/checkers/crash_detection.py) on made-up runs: what it measures."""

from __future__ import annotations

import types

from chaos.checkers import crash_detection
from chaos.observer import ViewSample
from chaos.run import ExecutedEvent

NAMES = ["n0", "n1", "n2", "n3"]


def run(samples, events):
    return types.SimpleNamespace(node_names=NAMES, events=list(events), samples=samples, t0=100.0)


def view(t, node, **states):
    return ViewSample(100.0 + t, node, {**{name: "alive" for name in NAMES}, **states}, True)


def kill(t, node):
    return ExecutedEvent(100.0 + t, t, f"SIGKILL n{node}", "process", (node,))


def restart(t, node):
    return ExecutedEvent(100.0 + t, t, f"restart n{node}", "heal", (node,))


def test_the_last_of_the_other_nodes_to_list_the_victim_dead_sets_the_time():
    samples = [view(10.5, 0, n3="suspect"), view(11.0, 0, n3="dead"), view(11.5, 1, n3="dead"),
               view(12.5, 2, n3="dead"), view(10.5, 3)]  # n3's own view before the kill read: not an observer
    result = crash_detection.check(run(samples, [kill(10, 3), restart(18, 3)]))
    assert result.passed, result.summary
    assert result.details["per_kill"] == [{"t_s": 10.0, "nodes": ["n3"], "detected_after_s": 2.5}]
    assert result.details["p50_s"] == 2.5


def test_a_kill_not_seen_everywhere_before_the_restart_fails():
    samples = [view(11, 0, n3="dead"), view(11, 1, n3="dead"), view(17, 2, n3="suspect"),
               view(19, 2, n3="dead")]  # after the restart at 18: too late to count
    result = crash_detection.check(run(samples, [kill(10, 3), restart(18, 3)]))
    assert not result.passed and "1 not seen by every node" in result.summary
    assert result.details["per_kill"][0]["detected_after_s"] is None


def test_a_detection_over_the_bound_fails_and_the_figures_cover_every_kill():
    fast = [view(10.5 + 0.1 * i, i, n3="dead") for i in range(3)]
    slow = [view(31 + k, i, n2="dead") for k, i in enumerate((0, 1, 3))]  # the last 8 s after the kill at 25
    result = crash_detection.check(run(fast + slow, [kill(10, 3), restart(18, 3), kill(25, 2), restart(40, 2)]))
    assert not result.passed
    assert [k["detected_after_s"] for k in result.details["per_kill"]] == [0.7, 8.0]
    assert result.details["max_s"] == 8.0


def test_a_machine_of_several_processes_is_dead_when_all_of_them_are():
    names = {**{name: "alive" for name in NAMES}, "n3-w1": "alive"}
    samples = [ViewSample(111.0, 0, {**names, "n3": "dead"}, True),
               ViewSample(112.0, 0, {**names, "n3": "dead", "n3-w1": "dead"}, True)]
    result = crash_detection.check(run(samples, [kill(10, 3)]))
    assert result.details["per_kill"][0]["detected_after_s"] == 2.0


def test_runs_without_a_kill_have_nothing_to_measure():
    pause = ExecutedEvent(110.0, 10.0, "SIGSTOP n1", "process", (1,))
    engine = ExecutedEvent(110.0, 10.0, "SIGKILL prefill engine0", "process", ())
    result = crash_detection.check(run([view(11, 0)], [pause, engine]))
    assert result.passed and result.details["kills"] == 0


def test_a_node_restarted_after_the_kill_that_never_lists_the_victim_does_not_hold_it_alive():
    without_n3 = {name: "alive" for name in NAMES if name != "n3"}
    samples = [view(10.5, 0, n3="dead"), view(11.0, 1, n3="dead"), ViewSample(111.5, 2, without_n3, True)]
    result = crash_detection.check(run(samples, [kill(10, 3), restart(18, 3)]))
    assert result.passed and result.details["per_kill"][0]["detected_after_s"] == 1.5

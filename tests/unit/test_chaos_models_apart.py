"""The models-apart checker (chaos/checkers/models_apart.py) on made-up runs: what it excuses of a model's
outage, and what it does not."""

from __future__ import annotations

import types

from chaos.checkers import lost_requests, models_apart
from chaos.run import ExecutedEvent
from chaos.scenarios import Plan
from chaos.workload import RequestRecord

DEAD, LIVE = "model-b", "model-a"
NAMED = f"InternalServerError [no_healthy_worker]: no healthy worker can serve model '{DEAD}' right now"


def run(records, healed=True):
    events = [ExecutedEvent(10.0, 10.0, "kill", "model", (), DEAD)]
    if healed:
        events.append(ExecutedEvent(20.0, 20.0, "restart", "heal", (), DEAD))
    return types.SimpleNamespace(events=events, records=records, t0=0.0, plan=Plan(events=[], heal_at_s=20.0, faults=0))


def record(model, start, end, outcome="ok", status=None, error=""):
    return RequestRecord("chat", "k", start, end, outcome, error, model=model, status=status)


BASE = [record(LIVE, 12, 12.1), record(DEAD, 25, 25.1),  # the live model during, the dead one after
        record(DEAD, 14, 14.1, "error", 503, NAMED),  # a named 503 during the outage
        record(DEAD, 9.8, 10.4, "error", None, "APIError [None]: stream cut")]  # in flight at the kill


def test_a_named_outage_passes_and_is_excused_from_the_lost_requests_check():
    result = models_apart.check(run(BASE))
    assert result.passed, result.summary
    assert result.details["per_model"][DEAD] == {"ok": 1, "rate_limited": 0, "error": 2}
    assert lost_requests.check(run(BASE)).passed


def test_an_error_of_the_other_model_fails():
    result = models_apart.check(run([*BASE, record(LIVE, 15, 15.2, "error", 502, "BadGateway: nginx")]))
    assert not result.passed and result.details["bystander_errors"] == 1


def test_a_failure_that_does_not_name_the_model_or_is_not_a_503_fails():
    for status, error in ((503, "no healthy worker can serve this model"), (502, NAMED)):
        result = models_apart.check(run([*BASE, record(DEAD, 15, 15.1, "error", status, error)]))
        assert not result.passed and result.details["unnamed_errors"] == 1


def test_a_model_that_never_answers_again_fails():
    result = models_apart.check(run([r for r in BASE if r.start < 20]))
    assert not result.passed and result.details["recovered"] == {DEAD: False}


def test_a_run_without_a_model_fault_reports_its_models():
    result = models_apart.check(types.SimpleNamespace(events=[], records=[record(LIVE, 1, 2)], t0=0.0))
    assert result.passed and "no model outage" in result.summary

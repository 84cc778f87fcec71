"""Subsystems as one registered thing each (gateway/base/subsystem.py, gateway/node/subsystems.py): a subsystem a
test adds with one registration gets its config section, its flag (flag, environment, TOML), its check, its start in
the order its needs give, its metrics, and its place in the request context; the node's own list starts in an
order that gives every subsystem what it declared it needs."""

from __future__ import annotations

import argparse
import dataclasses

import pytest
import trio

from gateway.api.state import GatewayState
from gateway.base.options import Option
from gateway.cluster import SettingsDocument
from gateway.base.subsystem import ConfigProblem, StartContext, Subsystem, start_order
from gateway.node import config as cfg
from gateway.node.server import start_subsystems
from gateway.node.subsystems import NODE_RESOURCES, SUBSYSTEMS
from gateway.observe.metrics import GatewayMetrics


@dataclasses.dataclass(frozen=True)
class EchoConfig:
    greeting: str = "hello"
    times: int = 1


class Echo:
    def __init__(self, config: EchoConfig, catalog) -> None:
        self.config, self.catalog, self.ran = config, catalog, False

    async def run(self, task_status=trio.TASK_STATUS_IGNORED) -> None:
        self.ran = True
        task_status.started()
        await trio.sleep_forever()

    def metric_families(self):
        from gateway.observe.metrics import counter
        yield counter("smg_echo_greetings", "Greetings said", [], [([], float(self.config.times))])


def _check(config) -> None:
    if config.echo.times < 1:
        raise ConfigProblem("--echo-times must be at least 1")


async def _start(context: StartContext) -> Echo:
    echo = Echo(context.config.echo, context.need("catalog"))
    await context.nursery.start(echo.run)
    return echo


ECHO = Subsystem("echo", EchoConfig(), (Option("--echo-greeting", "echo.greeting", str, "what it says", "http"),
                                         Option("--echo-times", "echo.times", int, "how often", "http")),
                 _check, _start, needs=("catalog",))
WITH_ECHO = (*SUBSYSTEMS, ECHO)  # the one registration


def _build(argv: "list[str]", environ: "dict[str, str] | None" = None):
    parser = argparse.ArgumentParser()
    for opt in cfg.all_options(WITH_ECHO):
        parser.add_argument(opt.flag, dest=opt.flag[2:].replace("-", "_"), default=None)
    return cfg.build_config(parser.parse_args(argv), environ or {}, WITH_ECHO)


def test_a_subsystem_added_with_one_registration_has_its_section_flags_and_check():
    assert cfg.config_class(WITH_ECHO)().echo == EchoConfig()
    assert _build(["--echo-greeting", "hi"]).echo == EchoConfig("hi", 1)
    assert _build([], {"SMG_NODE_ECHO_TIMES": "3"}).echo.times == 3  # the environment too
    with pytest.raises(cfg.ConfigError, match="--echo-times must be at least 1"):
        _build(["--echo-times", "0"])
    assert not hasattr(cfg.GatewayConfig(), "echo")  # the node's own list is untouched


async def test_a_subsystem_added_with_one_registration_starts_after_what_it_needs(nursery):
    config = _build(["--echo-times", "2"])
    metrics = GatewayMetrics()
    resources = {"config": config, "metrics": metrics, "cluster": None, "settings": SettingsDocument("local"),
                 "http_client": None, "engine_bridge": None}
    services = await start_subsystems(config, nursery, resources, WITH_ECHO)
    echo = services["echo"]
    assert echo.ran and echo.catalog is services["catalog"]
    assert b"smg_echo_greetings_total 2.0" in metrics.render()
    state = GatewayState(config, services)
    assert state.echo is echo  # in the request context, by its name
    with pytest.raises(AttributeError, match="built once"):
        state.echo = None
    nursery.cancel_scope.cancel()


def test_the_nodes_subsystems_start_in_an_order_that_gives_each_its_needs():
    order = start_order(SUBSYSTEMS, NODE_RESOURCES)
    seen = set(NODE_RESOURCES)
    for subsystem in order:
        assert set(subsystem.needs) <= seen, subsystem.name
        seen.add(subsystem.name)
    names = [s.name for s in SUBSYSTEMS]
    assert len(names) == len(set(names))  # one registration each
    for bad, says in (((Subsystem("a", start=_start, needs=("b",)), Subsystem("b", start=_start, needs=("a",))),
                       "need each other in a cycle"),
                      ((Subsystem("a", start=_start, needs=("nowhere",)),), "needs nowhere, which nothing provides")):
        with pytest.raises(ValueError, match=says):
            start_order(bad, NODE_RESOURCES)

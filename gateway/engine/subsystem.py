"""The engine clients as subsystems of the node (gateway/base/subsystem.py): TLS to engines, the HTTP/2 gRPC
client's settings. The client itself is a resource of the node's
(``engine_bridge``, made before anything starts: gateway/node/server.py), shared by every worker."""

from __future__ import annotations

from typing import Any

from ..base.subsystem import ConfigProblem, Subsystem
from . import engine_tls, h2grpc
from .engine_tls import EngineTlsConfig
from .h2_protocol import H2Config


def _check_h2(config: Any) -> None:
    if config.engine_h2.keepalive_interval_s > 0 and not config.engine_h2.keepalive_timeout_s > 0:
        raise ConfigProblem("--engine-keepalive-timeout-secs must be positive while keepalive is on")


ENGINE_TLS = Subsystem("engine_tls", EngineTlsConfig(), engine_tls.OPTIONS)
ENGINE_H2 = Subsystem("engine_h2", H2Config(), h2grpc.OPTIONS, _check_h2)

"""The engine clients as subsystems of the node (gateway/base/subsystem.py): TLS to engines, the HTTP/2 gRPC
client's settings and TokenSpeed's encode workers. The client itself is a resource of the node's
(``engine_bridge``, made before anything starts: gateway/node/server.py), shared by every worker."""

from __future__ import annotations

from typing import Any

from ..base.subsystem import ConfigProblem, StartContext, Subsystem
from . import encode_workers, engine_tls, h2grpc
from .encode_workers import EncodeConfig, EncodePool
from .engine_tls import EngineTlsConfig
from .h2_protocol import H2Config


def _check_h2(config: Any) -> None:
    if config.engine_h2.keepalive_interval_s > 0 and not config.engine_h2.keepalive_timeout_s > 0:
        raise ConfigProblem("--engine-keepalive-timeout-secs must be positive while keepalive is on")


def _check_encode(config: Any) -> None:
    encode = config.encode
    if not encode.timeout_s > 0:
        raise ConfigProblem("--encode-timeout-secs must be positive")
    for url, _ in encode.workers:
        target = url.removeprefix("grpc://")
        if not url.startswith("grpc://") or ":" not in target or not target.rsplit(":", 1)[1].isdigit():
            raise ConfigProblem(f"--encode {url}: an encode worker is a gRPC engine (grpc://host:port)")


async def _start_encode(context: StartContext) -> "EncodePool | None":
    return EncodePool.from_config(context.need("engine_bridge"), context.config.encode,
                                  context.need("metrics").epd_images_encoded)


ENGINE_TLS = Subsystem("engine_tls", EngineTlsConfig(), engine_tls.OPTIONS)
ENGINE_H2 = Subsystem("engine_h2", H2Config(), h2grpc.OPTIONS, _check_h2)
# None without --encode: prefills encode their own images.
ENCODE = Subsystem("encode", EncodeConfig(), encode_workers.OPTIONS, _check_encode, _start_encode,
                   needs=("engine_bridge", "metrics"))

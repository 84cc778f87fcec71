"""``smg-node serve``: its options, its checks before anything starts, and the node it runs.

Kept apart from ``cli.py`` so that the CLI's other commands do not import what serving needs (the config of
every subsystem, the server and the drivers they pull in).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys

from ..node.config import ConfigError, GatewayConfig, add_serve_arguments, build_config, secrets_on_command_line, \
    with_admin_credentials
from ..node.ports import PortInUse, check_port_free
from ..node.server import run_gateway
from .sim_engines import SimEngineError, SimEngines
from ..node.supervisor import SUPERVISED_ENV, run_supervisor, worker_count


def serve_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="smg-node serve", usage="smg-node serve [options]",
        description="Run a node: OpenAI-compatible HTTP in front, engines behind over gRPC. Every option can also "
                    "come from the environment (SMG_NODE_<OPTION>) or a --config TOML file.")
    add_serve_arguments(parser)
    return parser


def main(serve_argv: "list[str]") -> int:
    """``smg-node serve ARGS``: an unknown or malformed option prints serve's own usage (argparse exits 2)."""
    return serve(serve_parser().parse_args(serve_argv), serve_argv)


def serve(args: argparse.Namespace, serve_argv: "list[str]") -> int:
    try:
        config = with_admin_credentials(build_config(args))
    except ConfigError as e:
        print(f"smg-node serve: {e}", file=sys.stderr)
        return 2
    if not os.environ.get(SUPERVISED_ENV) and not config.http_reuse_port:
        try:
            check_port_free(config.host, config.port)  # a second node on this port would share it
        except PortInUse as e:
            print(f"smg-node serve: {e}", file=sys.stderr)
            return 1
    exposed = secrets_on_command_line(serve_argv)
    if exposed:
        print(f"smg-node serve: warning: {', '.join(exposed)} on the command line can be read by every local user "
              "(ps); give secrets as SMG_NODE_<OPTION> environment variables or in the --config file",
              file=sys.stderr)
    try:
        with SimEngines(config.sim_engines, config.sim_engine_args) as engine_urls:
            if engine_urls:
                # Every process of the node uses the same engines; later flags win, so the
                # processes of --workers N take these over what the command line said.
                serve_argv = [*serve_argv, "--sim-engines", "0", "--worker-urls", *config.worker_urls, *engine_urls]
                config = dataclasses.replace(config, sim_engines=0,
                                             worker_urls=(*config.worker_urls, *engine_urls))
            return run_node(config, serve_argv)
    except SimEngineError as e:
        print(f"smg-node serve: --sim-engines: {e}", file=sys.stderr)
        return 1


def run_node(config: GatewayConfig, serve_argv: "list[str]") -> int:
    if worker_count(config) > 1:
        return run_supervisor(config, serve_argv)
    return run_gateway(config)

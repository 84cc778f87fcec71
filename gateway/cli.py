"""The ``smg-node`` command: where the node is put together.

    smg-node serve [options]        run a node: the tokenizing gateway and its mesh agent (see --help)
    smg-node join SEED...           tell the local node to join a cluster through seeds
    smg-node leave                  make the local node leave gracefully (it then exits)
    smg-node members [--json]       the cluster as the local node sees it, members grouped by node
    smg-node tags KEY=VALUE...      replace the local node's tags (the change propagates)
    smg-node keygen                 a new gossip encryption key
    smg-node keys create|list|revoke   API keys through a node's control plane
    smg-node keyring list|install|use|remove [KEY]
    smg-node sim-engine --port P    run a simulated SGLang/vLLM gRPC engine
    smg-node --version

``serve`` builds the configuration, starts the demo engines of ``--sim-engines``
(``gateway/sim_engines.py``) and hands their URLs on as workers, then runs one
gateway process (``server.run_gateway``) or a supervisor of several
(``supervisor.run_supervisor``). join, leave, members, tags and keyring talk to
the local node's admin endpoint (--rpc-addr, default 127.0.0.1:7373, as in Serf).
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.metadata
import os
import sys

from mesh.admin_client import run_admin_command
from mesh.crypto import generate_key

from . import keys_client
from .config import (
    ConfigError,
    GatewayConfig,
    add_serve_arguments,
    build_config,
    secrets_on_command_line,
    with_admin_credentials,
)
from .ports import PortInUse, check_port_free
from .server import run_gateway
from .sim_engines import SimEngineError, SimEngines
from .supervisor import SUPERVISED_ENV, run_supervisor, worker_count


def version() -> str:
    try:
        return importlib.metadata.version("smg-node")
    except importlib.metadata.PackageNotFoundError:  # run from a checkout that was never installed
        return "unknown"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="smg-node", description="clustered tokenizing LLM gateway")
    parser.add_argument("--version", action="version", version=f"smg-node {version()}")
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", help="run a node", usage="smg-node serve [options]", description="Run a node: OpenAI-compatible HTTP in "
                                "front, engines behind over gRPC. Every option can also come from the environment "
                                "(SMG_NODE_<OPTION>) or a --config TOML file.")
    add_serve_arguments(serve)
    # The simulated engine is the chaos harness's program: its own flags, passed through as they are.
    commands.add_parser("sim-engine", help="run a simulated engine (python -m chaos.sim_engine; see its --help)",
                        add_help=False)
    for name, text in (("join", "join a cluster through seeds"), ("leave", "leave the cluster gracefully"),
                       ("members", "list the members"), ("keyring", "list, install, use or remove gossip keys"),
                       ("tags", "replace the local node's tags")):
        sub = commands.add_parser(name, help=text)
        sub.add_argument("--rpc-addr", default=None, help="admin endpoint (default: $SMG_NODE_RPC_ADDR or "
                                                          "127.0.0.1:7373)")
        sub.add_argument("--rpc-token", default=None, help="bearer token (default: $SMG_NODE_RPC_TOKEN, "
                                                           "$SMG_NODE_ADMIN_TOKEN, else the admin token file)")
        if name == "join":
            sub.add_argument("seeds", nargs="+")
        elif name == "members":
            sub.add_argument("--json", action="store_true", help="a JSON list instead of a table")
        elif name == "tags":
            sub.add_argument("tags", nargs="*", metavar="KEY=VALUE")
        elif name == "keyring":
            sub.add_argument("action", choices=("list", "install", "use", "remove"))
            sub.add_argument("key", nargs="?")
    commands.add_parser("keygen", help="print a new gossip encryption key")
    keys_client.add_arguments(commands.add_parser("keys", help="create, list or revoke API keys"))
    return parser


def main(argv: "list[str] | None" = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["sim-engine"]:
        # A separate program (the gateway does not import the harness): become it.
        os.execv(sys.executable, [sys.executable, "-m", "chaos.sim_engine", *argv[1:]])
    args = build_parser().parse_args(argv)
    if args.command == "serve":
        return serve(args, argv[argv.index("serve") + 1:])
    if args.command == "keys":
        return keys_client.run(args)
    if args.command == "keygen":
        print(generate_key())
        return 0
    return run_admin_command(args)


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


if __name__ == "__main__":
    sys.exit(main())

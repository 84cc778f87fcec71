"""The ``smg-node`` command.

    smg-node serve [options]        run a node: the tokenizing gateway (see --help)
    smg-node sim-engine --port P    run a simulated SGLang/vLLM gRPC engine
"""

from __future__ import annotations

import argparse
import sys


def build_parser() -> argparse.ArgumentParser:
    from chaos.sim_engine.server import add_arguments as add_sim_engine_arguments
    from gateway.config import add_serve_arguments

    parser = argparse.ArgumentParser(prog="smg-node", description="clustered tokenizing LLM gateway")
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", help="run a node", description="Run a node: OpenAI-compatible HTTP in "
                                "front, engines behind over gRPC. Every option can also come from the environment "
                                "(SMG_NODE_<OPTION>) or a --config TOML file.")
    add_serve_arguments(serve)
    sim = commands.add_parser("sim-engine", help="run a simulated engine",
                              description="A gRPC server speaking the SGLang and vLLM services of smg-grpc-proto.")
    add_sim_engine_arguments(sim)
    return parser


def main(argv: "list[str] | None" = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "serve":
        from gateway.config import ConfigError, build_config
        from gateway.server import run_gateway
        try:
            config = build_config(args)
        except ConfigError as e:
            print(f"smg-node serve: {e}", file=sys.stderr)
            return 2
        return run_gateway(config)
    if args.command == "sim-engine":
        from chaos.sim_engine.server import run
        return run(args)
    return 2


if __name__ == "__main__":
    sys.exit(main())

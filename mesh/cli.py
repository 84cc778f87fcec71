"""The ``smg-node`` command.

    smg-node serve [options]        run a node: the tokenizing gateway and its mesh agent (see --help)
    smg-node join SEED...           tell the local node to join a cluster through seeds
    smg-node leave                  make the local node leave gracefully (it then exits)
    smg-node members [--json]       the cluster as the local node sees it
    smg-node tags KEY=VALUE...      replace the local node's tags (the change propagates)
    smg-node keygen                 a new gossip encryption key
    smg-node keys create|list|revoke   API keys through a node's control plane
    smg-node keyring list|install|use|remove [KEY]
    smg-node sim-engine --port P    run a simulated SGLang/vLLM gRPC engine

join, leave, members and keyring talk to the local node's admin endpoint
(--rpc-addr, default 127.0.0.1:7373, as in Serf).
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
    from gateway.keys_client import add_arguments as add_keys_arguments
    add_keys_arguments(commands.add_parser("keys", help="create, list or revoke API keys"))
    return parser


def main(argv: "list[str] | None" = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "serve":
        from gateway.config import ConfigError, build_config, with_admin_credentials
        from gateway.server import run_gateway
        from gateway.supervisor import run_supervisor, worker_count
        try:
            config = with_admin_credentials(build_config(args))
        except ConfigError as e:
            print(f"smg-node serve: {e}", file=sys.stderr)
            return 2
        if worker_count(config) > 1:
            serve_argv = list(sys.argv[1:] if argv is None else argv)
            return run_supervisor(config, serve_argv[serve_argv.index("serve") + 1:])
        return run_gateway(config)
    if args.command == "sim-engine":
        from chaos.sim_engine.server import run
        return run(args)
    if args.command == "keys":
        from gateway.keys_client import run as run_keys
        return run_keys(args)
    if args.command == "keygen":
        from mesh.crypto import generate_key
        print(generate_key())
        return 0
    from mesh.admin_client import run_admin_command
    return run_admin_command(args)


if __name__ == "__main__":
    sys.exit(main())

"""The ``smg-node`` command: where the node is put together.

    smg-node serve [options]        run a node: the tokenizing gateway and its mesh agent (see --help)
    smg-node join SEED...           tell the local node to join a cluster through seeds
    smg-node leave                  make the local node leave gracefully (it then exits)
    smg-node members [--json]       the cluster as the local node sees it, members grouped by node
    smg-node tags KEY=VALUE...      replace the local node's tags (the change propagates)
    smg-node keygen                 a new gossip encryption key
    smg-node keys create|list|revoke   API keys through a node's control plane
    smg-node data status|accept        the node's data directory: what it kept, what it could not read back
    smg-node models                    the routed models, their targets and cooldowns
    smg-node spend                     the cluster's spend by key, tenant, model, target, day (table, CSV, JSON)
    smg-node budgets list|set|remove   budgets per key and tenant
    smg-node adapters list|add|remove|load|unload   LoRA adapters served on the fleet's engines
    smg-node keyring list|install|use|remove|rotate [KEY]   (rotate: on every member)
    smg-node sim-engine --port P    run a simulated SGLang/vLLM gRPC engine
    smg-node --version

``serve`` (``serve.py``) builds the configuration, starts the demo engines of ``--sim-engines``
(``gateway/cli/sim_engines.py``) and hands their URLs on as workers, then runs one
gateway process (``server.run_gateway``) or a supervisor of several
(``supervisor.run_supervisor``). join, leave, members, tags and keyring talk to
the local node's admin endpoint: --rpc-addr, else the one each node records for
the CLI (by its HTTP port: --node picks one when this user runs several), else
127.0.0.1:7373, as in Serf.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import sys

from mesh.admin_client import run_admin_command
from mesh.crypto import generate_key

from . import adapters, data, keys, models, spend, workers

# The CLI's commands other than serve (members, keys, --help...) must start at once: the serving machinery
# (config with every subsystem's settings, the server, the drivers they import) costs ~0.6 s to import and
# is imported by serve alone (``_serve_command``).


def version() -> str:
    try:
        return importlib.metadata.version("smg-node")
    except importlib.metadata.PackageNotFoundError:  # run from a checkout that was never installed
        return "unknown"


def _admin_options(parser: argparse.ArgumentParser, nested: bool) -> None:
    """The admin endpoint's options, accepted before and after the command (the later one wins)."""
    default = argparse.SUPPRESS if nested else None
    parser.add_argument("--rpc-addr", default=default, help="admin endpoint (default: $SMG_NODE_RPC_ADDR, else the "
                        "recorded endpoint of the local node --url or --node names, else of the only local node, "
                        "else 127.0.0.1:7373)")
    parser.add_argument("--node", default=default, metavar="HTTP_PORT", help="which local node, by its HTTP port, "
                        "when this user runs several")
    parser.add_argument("--url", default=default, help="which local node, by its HTTP URL (as the keys, workers "
                        "and models commands take it)")
    parser.add_argument("--admin-token", "--rpc-token", dest="rpc_token", default=default,
                        help="admin credential (default: $SMG_NODE_ADMIN_TOKEN, else the admin token file)")


def build_parser() -> argparse.ArgumentParser:
    """Every command but serve's options (``serve_parser``, built only for serve)."""
    parser = argparse.ArgumentParser(prog="smg-node", description="clustered tokenizing LLM gateway")
    parser.add_argument("--version", action="version", version=f"smg-node {version()}")
    _admin_options(parser, nested=False)
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("serve", help="run a node (smg-node serve --help lists its options)", add_help=False)
    # The simulated engine is the chaos harness's program: its own flags, passed through as they are.
    commands.add_parser("sim-engine", help="run a simulated engine (python -m chaos.sim_engine; see its --help)",
                        add_help=False)
    for name, text in (("join", "join a cluster through seeds"), ("leave", "leave the cluster gracefully"),
                       ("force-leave", "mark a failed member gone for good (it is no longer counted as cut off)"),
                       ("members", "list the members"), ("keyring", "list, install, use or remove gossip keys"),
                       ("tags", "replace the local node's tags")):
        sub = commands.add_parser(name, help=text)
        _admin_options(sub, nested=True)
        if name == "join":
            sub.add_argument("seeds", nargs="+")
        elif name == "force-leave":
            sub.add_argument("member", help="a failed member's name, or a node's (its processes all failed)")
        elif name == "members":
            sub.add_argument("--json", action="store_true", help="a JSON list instead of a table")
        elif name == "tags":
            sub.add_argument("tags", nargs="*", metavar="KEY=VALUE")
        elif name == "keyring":
            sub.add_argument("action", choices=("list", "install", "use", "remove", "rotate"),
                             help="install, use and remove act on this node; rotate: on every member (install the "
                                  "new key, use it, remove the old one)")
            sub.add_argument("key", nargs="?")
    commands.add_parser("keygen", help="print a new gossip encryption key")
    keys.add_arguments(commands.add_parser("keys", help="create, list or revoke API keys"))
    data.add_arguments(commands.add_parser("data", help="the node's data directory: status, or accept what could "
                                                        "not be read back"))
    models.add_arguments(commands.add_parser("models", help="the routed models, their targets and cooldowns"))
    spend.add_spend_arguments(commands.add_parser("spend", help="the cluster's spend by key, tenant, model, target, "
                                                                "day or month (table, CSV or JSON)"))
    spend.add_budget_arguments(commands.add_parser("budgets", help="list, set or remove budgets per key and tenant"))
    workers.add_arguments(commands.add_parser("workers", help="list, add or remove workers (prefill/decode "
                                                                     "roles included)"))
    adapters.add_arguments(commands.add_parser("adapters", help="list, define, remove, load or unload LoRA adapters"))
    return parser


def parse_args(argv: "list[str]") -> argparse.Namespace:
    """The command line as the CLI reads it, serve's options included (tests and deploy checks read it so)."""
    if argv[:1] == ["serve"]:
        from . import serve  # the serving machinery, for serve only (see above)
        args = serve.serve_parser().parse_args(argv[1:])
        args.command = "serve"
        return args
    return build_parser().parse_args(argv)


def main(argv: "list[str] | None" = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["sim-engine"]:
        # A separate program (the gateway does not import the harness): become it.
        os.execv(sys.executable, [sys.executable, "-m", "chaos.sim_engine", *argv[1:]])
    if argv[:1] == ["serve"]:
        from . import serve  # the serving machinery, for serve only (see above)
        return serve.main(argv[1:])
    args = build_parser().parse_args(argv)
    if args.command == "keys":
        return keys.run(args)
    if args.command == "data":
        return data.run(args)
    if args.command == "workers":
        return workers.run(args)
    if args.command == "models":
        return models.run(args)
    if args.command == "adapters":
        return adapters.run(args)
    if args.command == "spend":
        return spend.run_spend(args)
    if args.command == "budgets":
        return spend.run_budgets(args)
    if args.command == "keygen":
        print(generate_key())
        return 0
    return run_admin_command(args)


if __name__ == "__main__":
    sys.exit(main())

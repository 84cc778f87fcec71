"""``smg-node data status|accept``: the node's data directory through its control plane (/admin/data).

``status`` says where the node keeps its state and whether it could read it all back at its last start; ``accept``
is the operator's word, after a start that could not (a torn or corrupt file, a file of another version), that
what was set aside is not needed: a node that knows no key stops refusing inference (gateway/node/data_dir.py).
"""

from __future__ import annotations

import argparse

from .node_client import call_node, node_options


def add_arguments(parser: argparse.ArgumentParser) -> None:
    node_options(parser, nested=False)
    actions = parser.add_subparsers(dest="action", required=True)
    node_options(actions.add_parser("status", help="where the node keeps its state, and what it could not read"),
                 nested=True)
    node_options(actions.add_parser("accept", help="accept what could not be read back: inference reopens where "
                                                   "no key is known"), nested=True)


def run(args: argparse.Namespace) -> int:
    if args.action == "status":
        status = call_node(args, "GET", "/admin/data")
        print(f"data directory: {status['data_dir'] or 'none (nothing is kept across a restart)'}")
        for path in status["set_aside"]:
            print(f"set aside, not accepted: {path}")
        if status["keys_may_be_lost"]:
            print(f"inference refused while no key is known: {status['keys_may_be_lost']}")
        elif not status["set_aside"]:
            print("everything kept was read back")
        return 0
    answer = call_node(args, "POST", "/admin/data/accept", {})
    for path in answer["accepted"]:
        print(f"accepted (kept as): {path}")
    print("inference is open to requests without a key while this node knows none" if answer["data_plane_open"]
          else "inference needs a key")
    return 0

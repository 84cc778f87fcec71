"""The client side of ``smg-node join|leave|force-leave|members|keyring``: calls to the local admin endpoint."""

from __future__ import annotations

import argparse
import json
import os
import sys
from urllib.parse import urlsplit
from typing import Any

import httpx2

from .admin_token import client_token, endpoint_dir, live_endpoints, recorded_endpoints

ADMIN_TIMEOUT_S = 30.0


def call_json(method: str, url: str, token: str | None, body: "dict[str, Any] | None" = None,
              timeout_s: float = ADMIN_TIMEOUT_S, accept: "tuple[int, ...]" = ()) -> Any:
    """One call of a CLI command to a node, with its bearer token; a failure ends the command with a
    message (SystemExit), whether the node is unreachable or answers an error (but for the statuses in
    ``accept``, whose answers the command reads itself)."""
    headers = {"authorization": f"Bearer {token}"} if token else {}
    try:
        r = httpx2.request(method, url, json=body, headers=headers, timeout=timeout_s)
    except httpx2.HTTPError as e:
        raise SystemExit(f"smg-node: cannot reach {url}: {e}") from None
    try:
        value = r.json()
    except ValueError:
        raise SystemExit(f"smg-node: {url} did not answer JSON (status {r.status_code})") from None
    if r.status_code >= 400 and r.status_code not in accept:
        error = value.get("error", r.status_code)
        raise SystemExit(f"smg-node: {error.get('message', error) if isinstance(error, dict) else error}")
    return value


DEFAULT_ADMIN_ADDR = "127.0.0.1:7373"  # Serf's RPC port


def admin_addr(explicit: str | None, node: str | None = None) -> str:
    """The local node's admin endpoint: --rpc-addr, $SMG_NODE_RPC_ADDR, the node of --node (its HTTP port), the
    only live node this user runs (it records its endpoint), else Serf's port. Several live nodes and no choice:
    the command stops and lists them."""
    explicit = explicit or os.environ.get("SMG_NODE_RPC_ADDR")
    if explicit:
        return explicit
    recorded = recorded_endpoints()
    if node is not None:
        if node not in recorded:
            raise SystemExit(f"smg-node: no local node serves HTTP on port {node} (nodes recorded in "
                             f"{endpoint_dir()}: {', '.join(sorted(recorded)) or 'none'})")
        return recorded[node]
    alive = live_endpoints()
    if len(alive) == 1:
        return next(iter(alive.values()))
    if len(alive) > 1:
        choices = "\n".join(f"  --node {port}   (admin endpoint {addr})" for port, addr in sorted(alive.items()))
        raise SystemExit(f"smg-node: {len(alive)} local nodes run; say which, by its HTTP port:\n{choices}\n"
                         "(or --rpc-addr HOST:PORT)")
    return DEFAULT_ADMIN_ADDR


def _call(args: argparse.Namespace, method: str, path: str, body: "dict[str, Any] | None" = None,
          **options: Any) -> Any:
    node = getattr(args, "node", None)
    url = getattr(args, "url", None)
    if node is None and url:  # a local node by its HTTP URL: its port names its recorded endpoint
        try:
            node = str(urlsplit(url).port or "")
        except ValueError:
            raise SystemExit(f"smg-node: --url {url!r} is not a URL") from None
    addr = admin_addr(args.rpc_addr, node or None)
    try:
        return call_json(method, f"http://{addr}{path}", client_token(args.rpc_token), body, **options)
    except SystemExit as e:
        if "cannot reach" in str(e) and not args.rpc_addr:
            raise SystemExit(f"{e}\nsmg-node: no node answers at {addr}. A node runs an admin endpoint when it has "
                             f"a mesh (--mesh-bind) or several processes (--workers; by default one per core less "
                             f"one); it records where in {endpoint_dir()}.") from None
        raise


def node_of(member: "dict[str, Any]") -> str:
    """The node a member is a process of: its ``node`` tag (the processes of --workers N), else itself."""
    return member["tags"].get("node") or member["name"]


def _table(members: "list[dict[str, Any]]") -> str:
    """One row per member, grouped by node: a node's processes follow one another, the node named once."""
    rows = [("NODE", "MEMBER", "ADDRESS", "STATE", "INCARNATION", "TAGS", "LAST CHANGE")]
    previous = None
    for m in sorted(members, key=lambda m: (node_of(m), m["name"] != node_of(m), m["name"])):
        node = node_of(m)
        tags = ",".join(f"{k}={v}" for k, v in sorted(m["tags"].items()) if k != "node")
        rows.append((node if node != previous else "", m["name"], m["address"], m["state"], str(m["incarnation"]),
                     tags, m["last_change"]))
        previous = node
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows)


def run_admin_command(args: argparse.Namespace) -> int:
    if args.command == "members":
        members = _call(args, "GET", "/v1/members")["members"]
        print(json.dumps(members, indent=2) if args.json else _table(members))
        failed = sorted(m["name"] for m in members if m["state"] == "dead")
        if failed and not args.json:
            print(f"\nfailed: {', '.join(failed)}. Each is still counted as possibly cut off (rate-limit shares, "
                  "stored history) for a day after it failed; one gone for good: smg-node force-leave NAME")
    elif args.command == "join":
        print(f"joined through {_call(args, 'POST', '/v1/join', {'seeds': args.seeds})['joined']} seed(s)")
    elif args.command == "leave":
        _call(args, "POST", "/v1/leave")
        print("leaving: the node announces it and stops")
    elif args.command == "force-leave":
        left = _call(args, "POST", "/v1/force-leave", {"member": args.member})["left"]
        print(f"marked left: {', '.join(left)} (the cluster no longer counts {'it' if len(left) == 1 else 'them'} "
              "as possibly cut off)")
    elif args.command == "tags":
        from .options import parse_tags
        try:
            tags = dict(parse_tags(args.tags))
        except ValueError as e:
            print(f"smg-node tags: {e}", file=sys.stderr)
            return 2
        print(json.dumps(_call(args, "POST", "/v1/tags", {"tags": tags})["tags"]))
    elif args.command == "keyring" and args.action == "rotate":
        return _rotate(args)
    elif args.command == "keyring":
        if args.action == "list":
            result = _call(args, "GET", "/v1/keyring")
        else:
            if not args.key:
                print(f"smg-node keyring {args.action}: a KEY is required", file=sys.stderr)
                return 2
            result = _call(args, "POST", f"/v1/keyring/{args.action}", {"key": args.key})
        for i, fingerprint in enumerate(result["keys"]):  # fingerprints: keys never leave the node
            print(f"{fingerprint}{'  (primary)' if i == 0 else ''}")
    return 0



# A rotation asks every member three times, each phase bounded by the agent (ROTATION_PHASE_TIMEOUT_S).
ROTATE_TIMEOUT_S = 60.0


def _rotate(args: argparse.Namespace) -> int:
    """``smg-node keyring rotate NEW``: the new key on every alive member, the old one removed everywhere
    (mesh/keyring_rotation.py); what did not follow is said, and the command fails."""
    if not args.key:
        print("smg-node keyring rotate: the new KEY is required (smg-node keygen makes one)", file=sys.stderr)
        return 2
    report = _call(args, "POST", "/v1/keyring/rotate", {"key": args.key}, timeout_s=ROTATE_TIMEOUT_S,
                   accept=(409,))
    if "completed" not in report:
        print(f"smg-node keyring rotate: {report.get('error')}", file=sys.stderr)
        return 1
    for phase in report["phases_done"]:
        print(f"{phase}: done on {len(report['members'])} members")
    if report["not_asked"]:
        print(f"not asked (suspected or failed): {', '.join(report['not_asked'])}; they need the new key "
              "(--encrypt) to come back")
    if report["completed"]:
        print(f"rotated: every member seals under {report['new']}; {report['old']} is removed")
        return 0
    failed = {name: why for name, why in report["members"].items() if why != "ok"}
    stopped = next(p for p in ("install", "use", "remove") if p not in report["phases_done"])
    print(f"stopped at {stopped}: " + "; ".join(f"{name}: {why}" for name, why in failed.items()), file=sys.stderr)
    print("no member is cut off (the old key is still installed where it matters); run it again once they answer",
          file=sys.stderr)
    return 1

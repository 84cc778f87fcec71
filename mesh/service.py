"""Running a node's mesh: transport, agent, joining seeds, and the local admin endpoint.

``serve_mesh`` runs until cancelled; ``task_status.started`` hands back the
``MeshService`` (agent and admin address). The admin endpoint is a small JSON
API the ``smg-node join|leave|members|keyring`` commands call:

    GET  /v1/members              the member list
    POST /v1/join  {"seeds": []}  join through seeds
    POST /v1/leave                leave gracefully, then stop gossiping
    POST /v1/force-leave {"member": "..."}  mark a failed member (or node) left, cluster-wide
    GET  /v1/keyring              fingerprints of the installed keys (primary first), never the keys
    POST /v1/keyring/{install,use,remove}  {"key": "..."}  (this node only)
    POST /v1/keyring/rotate       {"key": "..."}: install, use, remove the old, on every alive member
                                  (keyring_rotation.py); 409 with the report when a member did not follow
    POST /v1/tags  {"tags": {}}   replace this node's tags

Every call needs ``Authorization: Bearer <token>`` (the node's admin token
unless --rpc-token says otherwise), on loopback too: the gateway can be made
to send requests to loopback addresses (a worker URL, say), and these calls
can make the node leave the cluster or change its keys. A node started
without a token (``rpc_token`` None) refuses every call.
"""

from __future__ import annotations

import dataclasses
import datetime
import hmac
import ipaddress
import logging
import random
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import trio
from hypercorn.config import Config as HypercornConfig
from hypercorn.trio import serve as hypercorn_serve

from .agent import ForceLeaveError, JoinError, MeshAgent, StateHooks
from .asgi import answer_lifespan
from .config import MeshConfig
from .crypto import Keyring, KeyringError
from .faults import maybe_faulty
from .keyring_file import keyring_kept_in
from .members import MemberSnapshot, MemberStatus
from .options import MeshOptions, default_node_name
from .transport import MeshTls, UdpTcpTransport, join_addr

log = logging.getLogger("mesh.service")

ADMIN_BODY_BYTES_MAX = 64 * 1024
JOIN_BACKOFF_MAX_S = 60.0


@dataclasses.dataclass
class MeshService:
    agent: MeshAgent
    keyring: Keyring
    admin_url: str
    left: trio.Event


def member_json(m: MemberSnapshot) -> dict[str, Any]:
    # The core keeps trio's monotonic time; people want the wall-clock time of the change.
    changed = time.time() - (trio.current_time() - m.changed_at)
    return {"name": m.name, "address": m.addr, "state": m.status.name.lower(), "incarnation": m.incarnation,
            "tags": m.tags, "last_change": datetime.datetime.fromtimestamp(changed, datetime.timezone.utc)
            .isoformat(timespec="seconds")}


async def resolve_seeds(seeds: "tuple[str, ...] | list[str]") -> list[str]:
    """host:port as given; dns:NAME:PORT becomes every address NAME resolves to."""
    out: list[str] = []
    for seed in seeds:
        if seed.startswith("dns:"):
            name, _, port = seed[4:].rpartition(":")
            try:
                out += await _resolve(name, port)
            except (OSError, ValueError) as e:
                log.warning("seed %s does not resolve: %s", seed, e)
        else:
            out.append(seed)
    return list(dict.fromkeys(out))


async def _resolve(name: str, port: str) -> list[str]:
    """Every address ``name`` resolves to, as host:port. Raises OSError or ValueError."""
    infos = await trio.socket.getaddrinfo(name, int(port), type=trio.socket.SOCK_DGRAM)
    return [join_addr(info[4][0], port) for info in infos]


async def join_with_retry(agent: MeshAgent, options: MeshOptions) -> bool:
    """Try the seeds until one answers, backing off between rounds (--retry-join)."""
    delay = options.retry_join_interval_s
    attempt = 0
    while True:
        attempt += 1
        seeds = [s for s in await resolve_seeds(options.join) if s != agent.transport.addr]
        if not seeds:
            return True  # we are the only seed: the cluster starts with us
        try:
            answered = await agent.join(seeds)
            log.info("joined the cluster through %d of %d seeds", answered, len(seeds))
            return True
        except JoinError as e:
            if options.retry_join_max and attempt >= options.retry_join_max:
                log.error("giving up joining after %d attempts: %s", attempt, e)
                return False
            log.warning("join attempt %d failed (%s); retrying in %.0fs", attempt, e, delay)
        await trio.sleep(delay * (0.8 + 0.4 * random.random()))
        delay = min(delay * 2, JOIN_BACKOFF_MAX_S)


async def keep_seeds_joined(agent: MeshAgent, seeds: "tuple[str, ...] | list[str]", interval_s: float) -> None:
    """Every ``interval_s`` (jittered), join again the seeds that are not live members; runs until cancelled.

    Why: a member held dead is forgotten ``dead_reap_s`` after (24 h on ``lan``; it was 5 min), or at once by
    ``force-leave``. Until then the reconnect attempts to dead members (``reconnect_interval_s``) heal a
    partition; after a longer one neither side remembers the other, and the halves ran on as two clusters for
    good, each granting the whole of every rate limit and holding its own stored conversations
    (tests/sim/test_partition_heal.py). The seeds are the cluster the
    operator named: one we cannot see alive is joined again, as ``--router-selector`` does with router pods
    (gateway/discovery/seeds.py). A seed that is down costs one failed connection per interval; a live member
    costs nothing (its address is compared, resolved as the join resolves it).
    """
    joined_last: frozenset[str] = frozenset()  # seeds the last join reached
    warned = False
    while True:
        await trio.sleep(interval_s * (0.8 + 0.4 * random.random()))  # jittered: the nodes do not all go at once
        if agent.leaving:
            return
        missing = await seeds_not_alive(agent, seeds)
        try:
            answered = await agent.join(missing) if missing else 0
        except JoinError as e:
            log.debug("seeds not seen alive still do not answer: %s", e)
            answered = 0
        if not answered:
            joined_last, warned = frozenset(), False
        elif joined_last.issuperset(missing):
            # Joined last time too, yet no member has that address: an advertise mismatch; said once.
            if not warned:
                log.warning("seeds %s answer, but no member advertises their address (check --mesh-advertise)",
                            ", ".join(missing))
                warned = True
        else:
            log.info("joined again through %d of the %d seeds not seen alive (%s)", answered, len(missing),
                     ", ".join(missing))
            joined_last, warned = frozenset(missing), False


async def seeds_not_alive(agent: MeshAgent, seeds: "tuple[str, ...] | list[str]") -> list[str]:
    """The seeds (resolved) that are neither this node nor a member it holds alive or suspect."""
    live = {m.addr for m in agent.members() if m.status in (MemberStatus.ALIVE, MemberStatus.SUSPECT)}
    live.add(agent.transport.addr)
    missing = []
    for seed in await resolve_seeds(seeds):
        if seed not in live and not live.intersection(await _addresses_of(seed)):
            missing.append(seed)
    return missing


async def _addresses_of(seed: str) -> list[str]:
    """host:port with the host resolved when it is a name (members are known by the addresses they advertise)."""
    host, _, port = seed.rpartition(":")
    try:
        ipaddress.ip_address(host.strip("[]"))
        return [seed]
    except ValueError:
        pass
    try:
        return await _resolve(host, port)
    except (OSError, ValueError):
        return []


class _AdminApp:
    def __init__(self, service: MeshService, token: str | None, nursery: trio.Nursery) -> None:
        self.service = service
        self.token = token
        self.nursery = nursery

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "lifespan":
            await answer_lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        status, body = await self._route(scope, receive)
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": orjson.dumps(body)})

    async def _body(self, receive) -> dict[str, Any]:
        data = b""
        while True:
            message = await receive()
            data += message.get("body", b"")
            if len(data) > ADMIN_BODY_BYTES_MAX:
                raise ValueError("body too large")
            if not message.get("more_body"):
                break
        value = orjson.loads(data) if data else {}
        if not isinstance(value, dict):
            raise ValueError("body must be a JSON object")
        return value

    async def _route(self, scope, receive) -> tuple[int, Any]:
        auth = dict(scope["headers"]).get(b"authorization", b"")
        if self.token is None or not hmac.compare_digest(auth, b"Bearer " + self.token.encode()):
            return 401, {"error": "missing or wrong bearer token (the node's admin token: smg-node finds it in "
                                  "its token file, or pass --rpc-token)"}
        agent, method, path = self.service.agent, scope["method"], scope["path"]
        try:
            if method == "GET" and path == "/v1/members":
                return 200, {"members": [member_json(m) for m in agent.members()], "self": agent.name}
            if method == "GET" and path == "/v1/keyring":
                return 200, {"keys": self.service.keyring.fingerprints()}
            body = await self._body(receive) if method == "POST" else {}
            if method == "POST" and path == "/v1/join":
                seeds = body.get("seeds")
                if not isinstance(seeds, list) or not seeds or not all(isinstance(s, str) for s in seeds):
                    return 400, {"error": "'seeds' must be a non-empty list of host:port"}
                answered = await agent.join(await resolve_seeds(seeds))
                return 200, {"joined": answered}
            if method == "POST" and path == "/v1/leave":
                self.nursery.start_soon(self._leave)
                return 202, {"leaving": True}
            if method == "POST" and path == "/v1/force-leave":
                member = body.get("member")
                if not isinstance(member, str) or not member:
                    return 400, {"error": "'member' must be a member's (or a node's) name"}
                try:
                    return 200, {"left": agent.force_leave(member)}
                except ForceLeaveError as e:
                    return (404 if e.missing else 409), {"error": str(e)}
            if method == "POST" and path == "/v1/keyring/rotate":
                key = body.get("key")
                if not isinstance(key, str):
                    return 400, {"error": "'key' is required"}
                report = await agent.rotate_keyring(key)
                return (200 if report.completed else 409), report.to_json()
            if method == "POST" and path.startswith("/v1/keyring/"):
                key = body.get("key")
                if not isinstance(key, str):
                    return 400, {"error": "'key' is required"}
                action = path.rsplit("/", 1)[1]
                ops = {"install": self.service.keyring.install, "use": self.service.keyring.use,
                       "remove": self.service.keyring.remove}
                if action not in ops:
                    return 404, {"error": f"no keyring action {action}"}
                ops[action](key)
                return 200, {"keys": self.service.keyring.fingerprints()}
            if method == "POST" and path == "/v1/tags":
                tags = body.get("tags")
                if not isinstance(tags, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                                         for k, v in tags.items()):
                    return 400, {"error": "'tags' must be an object of strings"}
                agent.set_tags(tags)
                return 200, {"tags": tags}
        except (ValueError, orjson.JSONDecodeError) as e:
            return 400, {"error": str(e)}
        except (KeyringError, JoinError) as e:
            return 409, {"error": str(e)}
        return 404, {"error": f"no route {method} {path}"}

    async def _leave(self) -> None:
        await self.service.agent.leave()
        self.service.left.set()


class MeshBindError(Exception):
    """The mesh's ports cannot be bound (another process holds them): the node cannot start."""


def _reason(error: BaseException) -> str:
    """An OSError's own words, from however deep in exception groups it was raised."""
    while isinstance(error, BaseExceptionGroup):
        error = error.exceptions[0]
    return (error.strerror if isinstance(error, OSError) else None) or str(error)


async def serve_mesh(options: MeshOptions, extra_tags: "dict[str, str]", hooks: StateHooks | None = None,
                     name: str | None = None, on_agent: "Callable[[MeshAgent], None] | None" = None,
                     on_joined: "Callable[[], None] | None" = None, *,
                     task_status=trio.TASK_STATUS_IGNORED) -> None:
    """Run this node's mesh member until it leaves or is cancelled.

    ``on_agent`` sees the agent before it joins anyone, so listeners miss no change;
    ``on_joined`` runs once the join succeeded (at once when there is nobody to join).
    """
    config = MeshConfig.local() if options.preset == "local" else MeshConfig.lan()
    tls = MeshTls(options.tls_ca_cert, options.tls_cert, options.tls_key) if options.tls_cert else None
    try:
        transport = UdpTcpTransport(options.bind, options.advertise, config.tcp_state_bytes_max, tls)
    except OSError as e:  # a port another process holds: said as such, not as a traceback
        raise MeshBindError(f"cannot listen for the mesh on {options.bind}: {_reason(e)}") from e
    keyring = keyring_kept_in(Path(options.data_dir), list(options.keys)) if options.data_dir is not None \
        else Keyring(list(options.keys))
    if not keyring.enabled:
        log.warning("--mesh-insecure: the mesh on %s runs in the clear; any process that reaches it can read the "
                    "cluster's state (stored conversations included) and change it. Pass --encrypt KEY (smg-node "
                    "keygen makes one), or drop --mesh-insecure to derive the key from the admin token",
                    options.bind)
    elif options.key_source == "admin-token":
        log.info("gossip sealed with a key derived from the admin token (fingerprint %s): nodes sharing the "
                 "token share the key", keyring.fingerprints()[0])
    name = name or options.node_name or default_node_name(transport.addr)
    transport = maybe_faulty(transport, name)  # the chaos harness's network faults; inert otherwise
    tags = {**dict(options.tags), **extra_tags}
    agent = MeshAgent(config, name, transport, keyring, tags, hooks)
    if on_agent is not None:
        on_agent(agent)
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(agent.run)
            service = MeshService(agent, keyring, "", trio.Event())
            hc = HypercornConfig()
            hc.bind = [options.rpc_bind]
            hc.accesslog = None
            hc.errorlog = logging.getLogger("mesh.admin")
            try:
                binds = await nursery.start(lambda task_status: hypercorn_serve(
                    _AdminApp(service, options.rpc_token, nursery), hc, task_status=task_status))
            except* OSError as e:  # from within hypercorn's own nursery
                raise MeshBindError(f"cannot listen for the mesh's admin API on {options.rpc_bind}: "
                                    f"{_reason(e)}") from e
            service.admin_url = binds[0]
            log.info("mesh member %s at %s (admin %s)", name, transport.addr, service.admin_url)
            task_status.started(service)
            if options.join:
                async def join_then_report() -> None:
                    if not await join_with_retry(agent, options):
                        return
                    if on_joined is not None:
                        on_joined()
                    await keep_seeds_joined(agent, options.join, config.reconnect_interval_s)

                nursery.start_soon(join_then_report)
            elif on_joined is not None:
                on_joined()
            await agent.stopped.wait()
            nursery.cancel_scope.cancel()
    finally:
        transport.close()

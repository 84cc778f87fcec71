"""MCP sessions the node holds open to the servers its tools run on, with the official ``mcp`` SDK (on anyio, so
on trio): streamable HTTP and SSE for URLs, stdio for servers the operator configured.

One session per ``ServerRef.key`` (the server and the credentials it is reached with, and for a client's URL the
client too), opened on first use and reused by the next turns: a handshake and a tool list cost once, not per
call. Each lives in a task of this service's nursery (the SDK's contexts must be entered and left by one task),
at most ``sessions_max`` at once (an unused one makes room; with none unused, the request is told to come back),
closed when unused for ``session_idle_s`` (a janitor that sleeps until the next expiry, not on a tick).

Every wait is bounded: connecting, the handshake and a tool list by ``connect_timeout_s``, a call by
``call_timeout_s``. A server that hangs or dies costs that much and an error (``McpUnavailable`` for a list, an
error outcome for a call), never a stuck request; its session is dropped and the next use reconnects. A client's
URL is reached only through ``PinnedTransport``: every request the SDK makes (redirects and the SSE endpoint it
is sent to included) is checked against ``--mcp-allowed-hosts`` and sent to the address checked.

The SDK (~0.75 s to import) is loaded in a thread the first time it is needed, never on the event loop.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import importlib
import logging
import time
from collections.abc import Iterator
from typing import Any

import httpx2
import trio

from ..base.errors import Overloaded
from ..observe.metrics import counter, gauge
from ..net.outbound import HostPolicy, PinnedTransport
from .answers import GatedTransport, Trip
from .stdio import bounded_stdio
from .config import McpConfig
from .results import CallOutcome, ToolInfo, http_error, outcome_from_sdk, protocol_error, tool_from_sdk
from .servers import ConfiguredServer

log = logging.getLogger("gateway.mcp")

METRIC_LABELS_MAX = 64  # distinct server labels in the metrics; the rest are "other" (clients name servers)
LIST_BYTES_FACTOR = 4  # a tool list may be this many times a tool output's bound
# One owner's (a tenant's, or a key's) sessions to clients' URLs, as a share of sessions_max: a tenant naming many
# servers cannot take every session of the node (its own least recently used make room first).
OWNER_SESSIONS_SHARE = 4


class McpUnavailable(Exception):
    """A server that could not be reached, or did not list its tools (the message says why)."""


@dataclasses.dataclass(frozen=True)
class ServerRef:
    """A server as a request reaches it."""

    label: str  # the request's server_label (or the configured name)
    transport: str  # streamable_http, sse, stdio
    url: str | None = None
    headers: tuple[tuple[str, str], ...] = ()  # credentials: never logged, never stored
    command: str | None = None
    args: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    pinned: bool = True  # a client's URL: every request checked against --mcp-allowed-hosts
    scope: str = ""  # whose session it is: a client's URL gets sessions of its own per owner
    metric_name: str = ""  # for metrics: the configured name, or the URL's host

    @property
    def key(self) -> tuple[Any, ...]:
        return (self.transport, self.url, self.command, self.args, self.env, self.headers, self.scope)

    def __repr__(self) -> str:  # headers and env stay out of logs and tracebacks
        return f"ServerRef({self.label!r}, {self.transport}, {self.url or self.command!r})"


@dataclasses.dataclass(eq=False)
class _Session:
    session: Any  # the SDK's ClientSession
    closing: trio.Event = dataclasses.field(default_factory=trio.Event)
    in_use: int = 0
    last_used: float = 0.0
    dead: bool = False
    tools: "list[ToolInfo] | None" = None  # listed once per session
    trip: Trip = dataclasses.field(default_factory=Trip)  # its answers' bounds (gateway/mcp/answers.py)
    scope: str = ""


class _Sdk:
    """The SDK's parts this module uses, imported once (in a thread)."""

    def __init__(self) -> None:
        mcp = importlib.import_module("mcp")
        self.ClientSession = mcp.ClientSession
        self.McpError = importlib.import_module("mcp.shared.exceptions").MCPError
        self.streamable_http_client = importlib.import_module("mcp.client.streamable_http").streamable_http_client
        self.sse_client = importlib.import_module("mcp.client.sse").sse_client
        stdio = importlib.import_module("mcp.client.stdio")
        self.default_environment = stdio.get_default_environment
        self.SessionMessage = importlib.import_module("mcp.shared.message").SessionMessage
        self.jsonrpc_message_adapter = importlib.import_module("mcp_types").jsonrpc_message_adapter


class McpSessions:
    """The node's MCP service: the configured servers (``servers``), the policy for clients' URLs, the sessions."""

    def __init__(self, config: McpConfig, servers: "dict[str, ConfiguredServer] | None" = None,
                 policy: HostPolicy | None = None) -> None:
        self.config = config
        self.servers = servers or {}
        self.policy = policy or HostPolicy(config.allowed_hosts, "--mcp-allowed-hosts")
        self._sdk: _Sdk | None = None
        self._sdk_lock = trio.Lock()
        self._nursery: trio.Nursery | None = None
        self._sessions: dict[tuple[Any, ...], _Session] = {}
        self._opening: dict[tuple[Any, ...], trio.Lock] = {}
        self._changed = trio.Event()  # a session was added or used: the janitor looks again
        # Metrics, by server name (bounded: METRIC_LABELS_MAX).
        self.calls: collections.Counter[tuple[str, str]] = collections.Counter()  # (server, outcome)
        self.lists: collections.Counter[tuple[str, str]] = collections.Counter()
        self.call_seconds: collections.Counter[str] = collections.Counter()
        self.opened = 0

    # -- the service ----------------------------------------------------------------------------------------

    async def run(self, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        """Hold the sessions (until cancelled: then every one is closed)."""
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            nursery.start_soon(self._close_idle)
            task_status.started()

    async def _close_idle(self) -> None:
        """Close sessions unused for session_idle_s; sleeps until the next one could expire, or a change."""
        idle_s = self.config.session_idle_s
        while True:
            now = trio.current_time()
            waiting = [s for s in self._sessions.values() if not s.in_use and not s.dead]
            for session in waiting:
                if now - session.last_used >= idle_s:
                    session.closing.set()
            upcoming = [s.last_used + idle_s for s in waiting if now - s.last_used < idle_s]
            self._changed = trio.Event()
            with trio.move_on_at(min(upcoming) if upcoming else float("inf")):
                await self._changed.wait()

    # -- what requests ask ----------------------------------------------------------------------------------

    async def list_tools(self, ref: ServerRef) -> list[ToolInfo]:
        """The server's tools (listed once per session); McpUnavailable when it cannot say."""
        name = self._metric_name(ref)
        trip: Trip | None = None
        tools: list[ToolInfo] | None = None
        try:
            with trio.fail_after(self.config.connect_timeout_s):
                async with self._using(ref) as held:
                    trip = held.trip
                    with trip.watching():
                        if held.tools is None:
                            held.tools = await self._listed(held.session)
                        tools = held.tools
        except trio.TooSlowError:
            self.lists[name, "timeout"] += 1
            raise McpUnavailable(f"the MCP server '{ref.label}' did not list its tools within "
                                 f"{self.config.connect_timeout_s:g} s") from None
        except McpUnavailable:
            self.lists[name, "error"] += 1
            raise
        except Overloaded:
            raise
        except Exception as e:
            self.lists[name, "error"] += 1
            reason = trip.reason if trip is not None and trip.reason else _reason(e)
            raise McpUnavailable(f"the MCP server '{ref.label}' did not list its tools: {reason}") from None
        if tools is None:  # the session tripped a bound: cancelled, and dropped
            self.lists[name, "error"] += 1
            raise McpUnavailable(f"the MCP server '{ref.label}' {trip.reason if trip else 'failed'}")
        self.lists[name, "ok"] += 1
        return tools

    async def call(self, ref: ServerRef, tool: str, arguments: dict[str, Any]) -> CallOutcome:
        """One tool call; a server that fails gives an error outcome (never raises but for cancellation)."""
        name = self._metric_name(ref)
        started = time.perf_counter()
        outcome = await self._call(ref, tool, arguments)
        self.call_seconds[name] += time.perf_counter() - started
        self.calls[name, "error" if outcome.failed else "ok"] += 1
        return outcome

    async def _call(self, ref: ServerRef, tool: str, arguments: dict[str, Any]) -> CallOutcome:
        timeout_s = self.config.call_timeout_s
        trip: Trip | None = None
        result = None
        try:
            with trio.fail_after(self.config.connect_timeout_s + timeout_s):
                async with self._using(ref) as held:
                    trip = held.trip
                    with trio.fail_after(timeout_s), trip.watching():
                        result = await held.session.call_tool(tool, arguments)
        except trio.TooSlowError:
            return http_error(504, f"the MCP server '{ref.label}' did not answer within {timeout_s:g} s")
        except McpUnavailable as e:
            return http_error(502, str(e))
        except Exception as e:
            if trip is not None and trip.reason:  # refused by a bound: the SDK saw a stream error, we say why
                return http_error(502, f"the MCP server '{ref.label}' {trip.reason}")
            sdk = self._sdk
            if sdk is not None and isinstance(e, sdk.McpError):
                return protocol_error(e.error.code, e.error.message)
            return http_error(502, f"the MCP server '{ref.label}' failed: {_reason(e)}")
        if result is None:  # the session tripped a bound while the call waited: cancelled, and dropped
            return http_error(502, f"the MCP server '{ref.label}' {trip.reason if trip else 'failed'}")
        return outcome_from_sdk(result, self.config.output_bytes_max)

    async def _listed(self, session: Any) -> list[ToolInfo]:
        tools: list[ToolInfo] = []
        size, cursor = 0, None
        bound = self.config.output_bytes_max * LIST_BYTES_FACTOR
        for _ in range(100):  # pages: a server that pages forever is cut off
            page = await session.list_tools(cursor=cursor) if cursor is not None else await session.list_tools()
            for tool in page.tools:
                info = tool_from_sdk(tool)
                if info is None:
                    continue
                size += len(repr(info.listed()))
                if size > bound:
                    raise McpUnavailable(f"the tool list is longer than {bound} bytes")
                tools.append(info)
            cursor = getattr(page, "next_cursor", None)
            if not cursor:
                break
        return tools

    # -- sessions -------------------------------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def _using(self, ref: ServerRef) -> Any:
        held = await self._session(ref)
        held.in_use += 1
        try:
            yield held
        except Exception as e:
            sdk = self._sdk
            if not (sdk is not None and isinstance(e, sdk.McpError)) or held.trip.reason:
                self._drop(ref.key, held)  # a transport failure or a bound tripped: reconnect next time
            raise
        except BaseException:  # cancelled mid-call (a timeout, a client gone): its answer may still come; drop it
            self._drop(ref.key, held)
            raise
        finally:
            held.in_use -= 1
            held.last_used = trio.current_time()
            if held.trip.reason:
                self._drop(ref.key, held)
            self._changed.set()

    async def _session(self, ref: ServerRef) -> _Session:
        held = self._sessions.get(ref.key)
        if held is not None and not held.dead:
            return held
        async with self._opening.setdefault(ref.key, trio.Lock()):
            held = self._sessions.get(ref.key)
            if held is not None and not held.dead:
                return held
            if self._nursery is None:
                raise McpUnavailable("MCP tools are not running on this node")
            self._make_room(ref.scope)
            sdk = await self._load_sdk()
            try:
                held = await self._nursery.start(self._hold, ref, sdk)
            except Exception as e:
                raise McpUnavailable(f"cannot connect to the MCP server '{ref.label}': {_reason(e)}") from None
            self._sessions[ref.key] = held
            self.opened += 1
            self._changed.set()
            return held

    def _make_room(self, scope: str) -> None:
        """Room for one more session of ``scope``: within the owner's share first (its own least recently used
        unused session closes), then within the node's bound (anyone's)."""
        live = [s for s in self._sessions.values() if not s.dead]
        share = max(1, self.config.sessions_max // OWNER_SESSIONS_SHARE)
        own = [s for s in live if s.scope == scope]
        if scope and len(own) >= share:
            live, bound = own, share
            busy = (f"this tenant's {share} MCP sessions ({self.config.sessions_max} // {OWNER_SESSIONS_SHARE}) "
                    "are all in use: try again shortly")
        elif len(live) < self.config.sessions_max:
            return
        else:
            bound = self.config.sessions_max
            busy = f"all {bound} MCP sessions of this node are in use: try again shortly"
        unused = [s for s in live if not s.in_use]
        if not unused:
            raise Overloaded(busy, code="mcp_sessions_busy", retry_after_s=1)
        oldest = min(unused, key=lambda s: s.last_used)
        oldest.closing.set()
        oldest.dead = True

    def _drop(self, key: tuple[Any, ...], held: _Session) -> None:
        held.dead = True
        held.closing.set()
        if self._sessions.get(key) is held:
            del self._sessions[key]

    async def _hold(self, ref: ServerRef, sdk: _Sdk, task_status: Any) -> None:
        """One session, from connect to close, in one task (the SDK's contexts need it); started once it is
        initialized. A failure after that ends the session, not the service."""
        held: _Session | None = None
        trip = Trip()
        try:
            async with contextlib.AsyncExitStack() as stack:
                streams = await stack.enter_async_context(self._transport(ref, sdk, stack, trip))
                session = await stack.enter_async_context(sdk.ClientSession(streams[0], streams[1]))
                with trip.watching():
                    await session.initialize()
                if trip.reason:
                    raise McpUnavailable(trip.reason)
                held = _Session(session, last_used=trio.current_time(), trip=trip, scope=ref.scope)
                task_status.started(held)
                await held.closing.wait()
        except Exception as e:
            if held is None:
                raise
            log.info("MCP session to '%s' ended: %s", ref.label, _reason(e))
        finally:
            if held is not None:
                held.dead = True
                if self._sessions.get(ref.key) is held:
                    del self._sessions[ref.key]

    def _transport(self, ref: ServerRef, sdk: _Sdk, stack: contextlib.AsyncExitStack, trip: Trip) -> Any:
        config = self.config
        if ref.transport == "stdio":
            return bounded_stdio(sdk, ref.command or "", list(ref.args), {**sdk.default_environment(), **dict(ref.env)},
                                 trip, config.answer_bytes_max, config.answer_items_max)
        headers = dict(ref.headers)
        timeout = httpx2.Timeout(self.config.connect_timeout_s, read=max(300.0, self.config.call_timeout_s))
        if ref.transport == "sse":
            def factory(headers: Any = None, timeout: Any = None, auth: Any = None) -> httpx2.AsyncClient:
                return self._http_client(ref, headers, timeout, trip)
            return sdk.sse_client(ref.url, headers=headers, timeout=self.config.connect_timeout_s,
                                  sse_read_timeout=max(300.0, self.config.call_timeout_s), httpx_client_factory=factory)
        client = self._http_client(ref, headers, timeout, trip)
        stack.push_async_callback(client.aclose)
        return sdk.streamable_http_client(ref.url, http_client=client, max_sse_event_size=self.config.answer_bytes_max)

    def _http_client(self, ref: ServerRef, headers: Any, timeout: Any, trip: Trip) -> httpx2.AsyncClient:
        """The session's HTTP client: every answer through the gate (bounded as it arrives), and a client's URL
        through the pinned transport (every request checked against --mcp-allowed-hosts)."""
        inner = PinnedTransport(self.policy, "MCP server URL") if ref.pinned else \
            httpx2.AsyncHTTPTransport(trust_env=False)
        config = self.config
        transport = GatedTransport(inner, trip, config.answer_bytes_max, config.output_bytes_max * LIST_BYTES_FACTOR,
                                   config.answer_items_max)
        return httpx2.AsyncClient(transport=transport, headers=headers, timeout=timeout, trust_env=False)

    async def _load_sdk(self) -> _Sdk:
        if self._sdk is None:
            async with self._sdk_lock:
                if self._sdk is None:
                    self._sdk = await trio.to_thread.run_sync(_Sdk)
        return self._sdk

    # -- metrics --------------------------------------------------------------------------------------------

    def _metric_name(self, ref: ServerRef) -> str:
        name = ref.metric_name or ref.label
        known = {server for server, _ in self.calls} | {server for server, _ in self.lists}
        return name if name in known or len(known) < METRIC_LABELS_MAX else "other"

    def metric_families(self) -> Iterator[Any]:
        yield counter("smg_mcp_calls", "MCP tool calls, by server and outcome", ["server", "outcome"],
                      [([server, outcome], float(n)) for (server, outcome), n in sorted(self.calls.items())])
        yield counter("smg_mcp_call_seconds", "Time spent in MCP tool calls, by server", ["server"],
                      [([server], seconds) for server, seconds in sorted(self.call_seconds.items())])
        yield counter("smg_mcp_tool_lists", "MCP tool lists asked of servers, by outcome", ["server", "outcome"],
                      [([server, outcome], float(n)) for (server, outcome), n in sorted(self.lists.items())])
        yield gauge("smg_mcp_sessions", "MCP sessions open on this process", [],
                    [([], float(sum(not s.dead for s in self._sessions.values())))])
        yield counter("smg_mcp_sessions_opened", "MCP sessions opened", [], [([], float(self.opened))])


def _reason(error: BaseException) -> str:
    """What went wrong, in a line: the first real cause inside the task groups' exception groups."""
    while isinstance(error, BaseExceptionGroup) and error.exceptions:
        error = error.exceptions[0]
    text = str(error) or type(error).__name__
    return text.splitlines()[0][:300]

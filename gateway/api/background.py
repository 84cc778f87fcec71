"""Work that outlives its request: the Responses API's ``background: true`` runs, and their cancellation.

``BackgroundRuns`` is a service of the node: it owns the nursery its runs go in (cancelled at shutdown,
after the drain), knows which runs are on this node (by response id, with their owner and their live
event log), and counts them per owner (a tenant may have at most its share of the node's slots in
progress). A run is reserved before anything of it is stored, so a cancel that comes at once finds
it; ``cancel`` stops it at once on this node, and on another node of the cluster through a peer
request to every member (mark ``B``): a cancel wakes the run that holds the response, wherever it is,
with no store poll. Cancels are rare and the members few, so the broadcast costs less than the poll
it replaces, and a member that does not hold the run answers "not here".

Only without a mesh, with a store other nodes share (PostgreSQL, Redis), can no event reach the run:
then, and only then, the run reads its status in the store every ``STORE_POLL_S``
(``poll_store``). The peer frame is the response id and its owner, each bounded
(``history.ID_CHARS_MAX``, ``OWNER_CHARS_MAX``); a frame out of bounds is refused and counted, and a
cancel whose owner is not the run's is "not here" (a peer cannot cancel another owner's run by id).
"""

from __future__ import annotations

import collections
import logging
from collections.abc import Awaitable, Callable, Iterator
from typing import TYPE_CHECKING, Any

import trio

from mesh import PeerUnreachable

from ..history.store import ID_CHARS_MAX, OWNER_CHARS_MAX
from ..observe.metrics import counter, gauge

if TYPE_CHECKING:
    from ..cluster import ClusterState
    from .responses.stream_log import StreamLog

log = logging.getLogger("gateway.api")

CANCEL_MARK = b"B"
# A cancel told to another member waits this long for its answer: a member that cannot answer by then is
# dead or cut off, and its runs are shown failed once their bound passes.
PEER_CANCEL_TIMEOUT_S = 2.0
# How often a run reads its status in a shared store when no mesh can tell it of a cancel: how long the
# engine may keep generating after a cancel made on another node of such a deployment.
STORE_POLL_S = 1.0
HERE, NOT_HERE = b"1", b"0"


class BackgroundOut:
    """Where a background response's stream goes when the pipeline runs it (``pipeline.run_streamed``, the same
    runner a client's stream has): nowhere, for its events are in its log as they are made, and there is no client
    to watch (a cancel reaches the run by its own scope). What a client's ``Request`` offers a stream, as no-ops."""

    disconnected = False
    response_started = True

    def cancel_on_disconnect(self) -> "_NoClient":
        return _NoClient()

    def disconnect_watch(self) -> None:
        return None  # no client to go away

    async def start_stream(self, status: int, headers: Any) -> None:
        pass

    async def send_chunk(self, data: bytes) -> None:
        pass

    def can_send_chunk_now(self) -> bool:
        return True  # the events are made where the engine's answers are read: no wake-up of the run's task

    def send_chunk_now(self, data: bytes) -> bool:
        return True

    def can_start_stream_now(self) -> bool:
        return True  # (as can_send_chunk_now)

    def start_stream_now(self, status: int, headers: Any, data: bytes) -> bool:
        return True

    async def flush(self) -> None:
        pass

    async def end_stream(self, data: bytes = b"") -> None:
        pass


class BackgroundRequest(BackgroundOut):
    """A routed background response's stand-in for its request while its route picks a target
    (``gateway/api/routed.py``): who asked is the request's, read through; what a target sends goes nowhere (its
    events are in the log, its final response returned), but marks the answer begun, so a target that fails after
    that is not left for the next one, as for a client's request."""

    def __init__(self, request: Any) -> None:
        self._request = request
        self.response_started = False
        self.target: str | None = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._request, name)

    async def start_stream(self, status: int, headers: Any) -> None:
        self.response_started = True

    def start_stream_now(self, status: int, headers: Any, data: bytes) -> bool:
        self.response_started = True  # (never the client's: its answer is the queued response, sent already)
        return True

    async def send_chunk(self, data: bytes) -> None:
        self.response_started = True

    async def send_bytes(self, status: int, data: bytes, headers: Any = None) -> None:
        self.response_started = True

    async def send_json(self, status: int, value: Any) -> None:
        self.response_started = True

    async def end_stream(self, data: bytes = b"") -> None:
        self.response_started = True


class _NoClient:
    async def __aenter__(self) -> trio.CancelScope:
        self.scope = trio.CancelScope()
        return self.scope.__enter__()

    async def __aexit__(self, *exc: Any) -> bool:
        return self.scope.__exit__(*exc)


class BackgroundRun:
    """One run on this node: its cancel scope (made before the run starts, so a cancel before it starts
    holds), who owns it, its live event log when it streams, and whether a client cancelled it."""

    __slots__ = ("id", "owner", "scope", "log", "cancelled")

    def __init__(self, run_id: str, owner: str, stream_log: "StreamLog | None") -> None:
        self.id = run_id
        self.owner = owner
        self.scope = trio.CancelScope()
        self.log = stream_log
        self.cancelled = False  # by a client's cancel (not by shutdown)

    def cancel(self, source: str, counts: "collections.Counter[str]") -> None:
        if not self.cancelled:
            counts[source] += 1
        self.cancelled = True
        self.scope.cancel()


class BackgroundRuns:
    def __init__(self, cluster: "ClusterState | None", poll_store: bool) -> None:
        self._cluster = cluster
        # No mesh and a store shared with other nodes: a run must look at the store for cancels.
        self.poll_store = poll_store
        self._runs: dict[str, BackgroundRun] = {}
        self._by_owner: collections.Counter[str] = collections.Counter()
        self._nursery: trio.Nursery | None = None
        self.refused_frames = 0  # peers' cancel frames out of bounds
        # Runs stopped by a cancel, by how it reached them: "local" (made on this node), "peer" (told by the
        # member that took it), "store" (read from a shared store without a mesh).
        self.cancels: collections.Counter[str] = collections.Counter()
        if cluster is not None:
            cluster.serve_requests(CANCEL_MARK, self._on_peer_cancel)

    async def serve(self, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            task_status.started()
            await trio.sleep_forever()

    # -- this node's runs ---------------------------------------------------------------------------------

    def in_progress(self, owner: str) -> int:
        return self._by_owner[owner]

    def reserve(self, run_id: str, owner: str, stream_log: "StreamLog | None") -> BackgroundRun:
        """A run, counted and findable from now on; ``start`` it, or ``release`` it if it never starts."""
        run = BackgroundRun(run_id, owner, stream_log)
        self._runs[run_id] = run
        self._by_owner[owner] += 1
        return run

    def start(self, run: BackgroundRun, work: Callable[[BackgroundRun], Awaitable[None]]) -> None:
        """``work(run)`` in the service's nursery, released when it ends."""
        if self._nursery is None:
            raise RuntimeError("BackgroundRuns.serve is not running")
        self._nursery.start_soon(self._run, run, work)

    async def _run(self, run: BackgroundRun, work: Callable[[BackgroundRun], Awaitable[None]]) -> None:
        try:
            await work(run)
        finally:
            self.release(run)

    def release(self, run: BackgroundRun) -> None:
        if self._runs.get(run.id) is run:
            del self._runs[run.id]
            self._by_owner[run.owner] -= 1
            if self._by_owner[run.owner] <= 0:
                del self._by_owner[run.owner]
            if run.log is not None:  # a resume from now on reads the store
                run.log.end()

    def live_log(self, run_id: str) -> "StreamLog | None":
        """The events of a streamed run generating here, as they come."""
        run = self._runs.get(run_id)
        return run.log if run is not None else None

    # -- cancelling, from any node ------------------------------------------------------------------------

    async def cancel(self, run_id: str, owner: str) -> bool:
        """Stop the run wherever it is in the cluster: True when a member (this one or another) held it."""
        if self._cancel_here(run_id, owner, "local"):
            return True
        cluster = self._cluster
        if cluster is None:
            return False
        frame = CANCEL_MARK + _encode(run_id, owner)
        found = False

        async def tell(member: str) -> None:
            nonlocal found
            try:
                if await cluster.request_peer(member, frame, PEER_CANCEL_TIMEOUT_S) == HERE:
                    found = True
            except PeerUnreachable as e:
                log.info("cancel of %s not told to %s: %s", run_id, member, e)

        async with trio.open_nursery() as nursery:
            # The members on the ring (alive or suspected): one held failed would not answer, only hold the
            # cancel for its timeout (for a day after a crash: dead_reap_s); cut off, it cannot be told anyway.
            for member in cluster.ring.members:
                if member != cluster.node_name:
                    nursery.start_soon(tell, member)
        return found

    def _cancel_here(self, run_id: str, owner: str, source: str) -> bool:
        run = self._runs.get(run_id)
        if run is None or run.owner != owner:
            return False
        run.cancel(source, self.cancels)
        return True

    def cancelled_in_store(self, run: BackgroundRun) -> None:
        """The run's status in a shared store says cancelled (or it is gone): no mesh told this node."""
        run.cancel("store", self.cancels)

    async def _on_peer_cancel(self, payload: bytes) -> bytes:
        decoded = _decode(payload)
        if decoded is None:
            self.refused_frames += 1
            return b""
        return HERE if self._cancel_here(*decoded, "peer") else NOT_HERE

    def metric_families(self) -> Iterator[Any]:
        yield gauge("smg_background_responses", "Background responses running on this process", [],
                    [([], float(len(self._runs)))])
        yield counter("smg_background_cancels", "Background runs stopped by a cancel, by how it reached them "
                      "(local, peer: told by the member that took it, store: read from a shared store)", ["source"],
                      [([source], float(self.cancels[source])) for source in ("local", "peer", "store")])
        yield counter("smg_background_refused_frames", "Peers' cancel frames refused as malformed", [],
                      [([], float(self.refused_frames))])


def _encode(run_id: str, owner: str) -> bytes:
    return run_id.encode() + b"\x00" + owner.encode()


def _decode(payload: bytes) -> "tuple[str, str] | None":
    """(run id, owner) of a peer's cancel frame, or None when it is not one (bounds, encoding)."""
    run_id, sep, owner = payload.partition(b"\x00")
    if not sep or not 0 < len(run_id) <= ID_CHARS_MAX or not 0 < len(owner) <= OWNER_CHARS_MAX * 4:
        return None
    try:
        text_id, text_owner = run_id.decode(), owner.decode()
    except UnicodeDecodeError:
        return None
    if len(text_owner) > OWNER_CHARS_MAX or "\x00" in text_owner:
        return None
    return text_id, text_owner

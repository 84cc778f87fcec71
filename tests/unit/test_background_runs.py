"""The service that runs background responses (gateway/api/background.py), on virtual time: a run reserved
before it starts, a cancel that stops it at once wherever it runs (this process, or a peer told over the
mesh's requests), the owner check, the peer frame's bounds, and the counts it keeps."""

from __future__ import annotations

import pytest
import trio

from mesh import PeerUnreachable

from gateway.api.background import CANCEL_MARK, HERE, NOT_HERE, BackgroundRuns
from gateway.api.responses.stream_log import StreamLog


class Net:
    """Members that reach each other's peer-request handlers; ``down`` ones are unreachable, ``failed`` ones too
    and off the ring (held dead by the mesh)."""

    def __init__(self) -> None:
        self.members: dict[str, FakeCluster] = {}
        self.down: set[str] = set()
        self.failed: set[str] = set()


class Ring:
    def __init__(self, members: "list[str]") -> None:
        self.members = members


class FakeCluster:
    def __init__(self, name: str, net: Net) -> None:
        self.node_name = name
        self.net = net
        net.members[name] = self
        self.handler = None
        self.sent: list[tuple[str, bytes]] = []

    def serve_requests(self, mark: bytes, handler) -> None:
        assert mark == CANCEL_MARK
        self.handler = handler

    @property
    def ring(self) -> Ring:
        return Ring(sorted(set(self.net.members) - self.net.failed))

    async def request_peer(self, name: str, payload: bytes, timeout_s: float) -> bytes:
        self.sent.append((name, payload))
        if name in self.net.down | self.net.failed:
            await trio.sleep(timeout_s)
            raise PeerUnreachable(f"{name}: timed out")
        return await self.net.members[name].handler(payload[1:])


async def forever(run) -> None:
    with run.scope:
        await trio.sleep_forever()


async def test_a_local_cancel_stops_the_run_at_once_and_releases_it(autojump_clock):
    runs = BackgroundRuns(None, poll_store=False)
    async with trio.open_nursery() as nursery:
        await nursery.start(runs.serve)
        log = StreamLog(1024)
        run = runs.reserve("resp_1", "tenant:a", log)
        assert runs.in_progress("tenant:a") == 1 and runs.live_log("resp_1") is log
        runs.start(run, forever)
        await trio.sleep(5)
        started = trio.current_time()
        assert not await runs.cancel("resp_1", "tenant:b")  # another owner's id: as if it were not here
        assert await runs.cancel("resp_1", "tenant:a")
        await trio.sleep(0)
        await trio.sleep(0)
        assert trio.current_time() == started  # no poll: the cancel itself stopped it
        assert runs.in_progress("tenant:a") == 0 and runs.live_log("resp_1") is None and log.ended
        assert run.cancelled and runs.cancels["local"] == 1
        nursery.cancel_scope.cancel()


async def test_a_cancel_that_comes_before_the_run_starts_holds(autojump_clock):
    runs = BackgroundRuns(None, poll_store=False)
    ran = []

    async def work(run) -> None:
        with run.scope:
            ran.append("started")
            await trio.sleep(1)
            ran.append("finished")

    async with trio.open_nursery() as nursery:
        await nursery.start(runs.serve)
        run = runs.reserve("resp_2", "k", None)
        assert await runs.cancel("resp_2", "k")
        runs.start(run, work)
        await trio.sleep(2)
        assert ran == ["started"] and runs.in_progress("k") == 0
        nursery.cancel_scope.cancel()


async def test_a_cancel_made_on_another_member_stops_the_run_where_it_is(autojump_clock):
    net = Net()
    a, b, c = (BackgroundRuns(FakeCluster(name, net), poll_store=False) for name in ("a", "b", "c"))
    net.down.add("c")  # a member that cannot answer costs its timeout, nothing more
    async with trio.open_nursery() as nursery:
        for runs in (a, b, c):
            await nursery.start(runs.serve)
        run = a.reserve("resp_3", "tenant:x", None)
        a.start(run, forever)
        await trio.sleep(1)
        assert not await b.cancel("resp_3", "tenant:y")  # the owner is checked where the run is
        assert not run.cancelled
        assert await b.cancel("resp_3", "tenant:x")
        await trio.sleep(0)
        assert run.cancelled and a.in_progress("tenant:x") == 0
        assert (a.cancels["peer"], b.cancels["local"], b.cancels["peer"]) == (1, 0, 0)
        assert not await b.cancel("resp_missing", "tenant:x")  # nobody holds it
        nursery.cancel_scope.cancel()


async def test_a_cancel_does_not_wait_for_a_member_held_failed(autojump_clock):
    """A failed member stays known a day (it may be cut off): asking it would hold every cancel for its timeout."""
    net = Net()
    a, b = (BackgroundRuns(FakeCluster(name, net), poll_store=False) for name in ("a", "b"))
    BackgroundRuns(FakeCluster("dead", net), poll_store=False)
    net.failed.add("dead")
    async with trio.open_nursery() as nursery:
        for runs in (a, b):
            await nursery.start(runs.serve)
        run = a.reserve("resp_4", "tenant:x", None)
        a.start(run, forever)
        started = trio.current_time()
        assert await b.cancel("resp_4", "tenant:x")
        assert trio.current_time() - started < 0.1
        assert [name for name, _ in b._cluster.sent] == ["a"]
        nursery.cancel_scope.cancel()


@pytest.mark.parametrize("frame", [
    b"", b"resp_1", b"\x00owner", b"resp_1\x00", b"r" * 129 + b"\x00o", b"resp_1\x00" + b"o" * 2000,
    b"\xff\xfe\x00owner", b"resp_1\x00\xff", b"resp_1\x00a\x00b",
])
async def test_a_peers_malformed_cancel_frame_is_refused_and_counted(frame):
    net = Net()
    runs = BackgroundRuns(FakeCluster("a", net), poll_store=False)
    assert await net.members["a"].handler(frame) == b""
    assert runs.refused_frames == 1
    assert await net.members["a"].handler(b"resp_1\x00tenant:x") == NOT_HERE  # well formed, nothing here
    assert runs.refused_frames == 1 and HERE != NOT_HERE

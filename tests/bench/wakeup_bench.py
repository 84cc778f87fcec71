"""What one wake-up of the event loop costs: instructions per byte read by a trio task that waits for it.

Not a test: it prints figures. A streamed token from an engine that paces its tokens (a real engine's
decode step, ``instructions.py --token-interval-s``) wakes the node's loop once: trio's run loop
polls epoll, reschedules the reading task, steps it through ``fast_receive.receive_some``, and the
task waits again. This measures exactly that and nothing of the gateway's own per-token work: a
child process writes one byte every ``--interval-ms`` to a socket pair, the parent (under
callgrind, counting switched on after ``--warmup`` reads) reads each with ``receive_some``, either
trying a read first (``read-first``) or waiting first once the last read emptied the socket
(``wait-first``, what the node does). Per-token cost of the node = this + its own work (HTTP/2
frame, protobuf, detokenizing, the SSE event, the write); the difference between
``instructions.py`` with and without ``--token-interval-s``, per token, is their sum.

Two references: the same reads by a plain Python loop on ``select.epoll`` without trio
(``raw-epoll``: poll, read, re-arm; the floor for any Python event loop), and one pass of
trio's scheduler with no I/O at all (``task-step``: a task rescheduling itself with
``cancel_shielded_checkpoint``).

And the engine side off trio's scheduler, as issue 65 allows it: the same reads by a thread of its own on
``select.epoll`` calling a callback per read while trio's loop waits (``reader-thread``: what the thread costs in
instructions, its GIL taken and given back each read), and, in wall time with no valgrind, how long such a read
waits for the GIL when the loop's thread is busy running Python (``--gil-latency``: the interpreter hands the GIL
over at its switch interval, 5 ms by default).

    python tests/bench/wakeup_bench.py [--reads 1000] [--interval-ms 2]
    python tests/bench/wakeup_bench.py --loop-latency [--reads 500 --interval-ms 20 --busy-ms 2]

``--loop-latency`` compares the node's two ways of reading an engine in wall time, the loop busy half its
time: a task waiting on the socket against the reader thread (``gateway/engine/off_loop.py``), which runs
only while the loop waits for I/O.

Needs valgrind. User-space instructions only: the system calls' kernel time is not in them.
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

WARMUP_READS = 50


def child_writes(sock: socket.socket, count: int, interval_s: float) -> None:
    time.sleep(1.0)  # the parent is under valgrind: let it reach its first wait
    for _ in range(count):
        sock.send(b"x")
        time.sleep(interval_s)


MODES = ("read-first", "wait-first", "raw-epoll", "task-step", "reader-thread")


def measured(reads: int, mode: str) -> None:
    """The parent's side, run under callgrind: read ``reads`` bytes one wake-up each."""
    import trio

    from gateway.net.fast_receive import receive_some

    parent, child = socket.socketpair()
    pid = os.fork()
    if pid == 0:
        parent.close()
        child_writes(child, reads + WARMUP_READS, float(os.environ["WAKEUP_INTERVAL_S"]))
        os._exit(0)
    child.close()
    if mode == "raw-epoll":
        measured_raw_epoll(parent, reads)
        os.waitpid(pid, 0)
        return
    if mode == "reader-thread":
        measured_reader_thread(parent, reads)
        os.waitpid(pid, 0)
        return
    wait_first = mode == "wait-first"

    async def main() -> None:
        stream = trio.SocketStream(trio.socket.from_stdlib_socket(parent))
        for _ in range(WARMUP_READS):
            await receive_some(stream, 65536)
        subprocess.run(["callgrind_control", "-i", "on", str(os.getpid())], check=True, capture_output=True)
        drained = False
        for _ in range(reads):
            if mode == "task-step":
                await trio.lowlevel.cancel_shielded_checkpoint()
                continue
            data = await receive_some(stream, 65536, drained and wait_first)
            drained = len(data) < 65536
        subprocess.run(["callgrind_control", "-d", str(os.getpid())], check=True, capture_output=True)

    trio.run(main)
    if mode == "task-step":  # nothing read its bytes: the writer blocks once the socket's buffer is full
        os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)


def measured_raw_epoll(sock: socket.socket, reads: int) -> None:
    """The same reads without trio: epoll.poll, os.read, re-arm (one-shot, as trio registers)."""
    ignore = len
    epoll_reads(sock, WARMUP_READS, ignore)
    subprocess.run(["callgrind_control", "-i", "on", str(os.getpid())], check=True, capture_output=True)
    epoll_reads(sock, reads, ignore)
    subprocess.run(["callgrind_control", "-d", str(os.getpid())], check=True, capture_output=True)


def epoll_reads(sock: socket.socket, count: int, on_read) -> None:
    """``count`` reads of ``sock`` on a plain one-shot epoll, ``on_read(data)`` after each."""
    import select

    sock.setblocking(False)
    fd, epoll = sock.fileno(), select.epoll()
    epoll.register(fd, select.EPOLLIN | select.EPOLLONESHOT)
    for _ in range(count):
        epoll.poll()
        on_read(os.read(fd, 65536))
        epoll.modify(fd, select.EPOLLIN | select.EPOLLONESHOT)
    epoll.close()


def measured_reader_thread(sock: socket.socket, reads: int) -> None:
    """The reads by a thread of their own calling a callback each, while trio's loop (this thread) waits for the
    thread's end (handed back with ``run_sync_soon``, once)."""
    import threading

    import trio

    taken: list[bytes] = []

    async def main() -> None:
        token, done = trio.lowlevel.current_trio_token(), trio.Event()

        def reader() -> None:
            epoll_reads(sock, WARMUP_READS, taken.append)
            subprocess.run(["callgrind_control", "-i", "on", str(os.getpid())], check=True, capture_output=True)
            epoll_reads(sock, reads, taken.append)
            subprocess.run(["callgrind_control", "-d", str(os.getpid())], check=True, capture_output=True)
            token.run_sync_soon(done.set)

        threading.Thread(target=reader, daemon=True).start()
        await done.wait()

    trio.run(main)


def fork_timestamp_writer(parent: socket.socket, child: socket.socket, reads: int, interval_ms: float) -> int:
    """A child process writing its clock (8 bytes) to ``child`` every ``interval_ms``; its pid."""
    pid = os.fork()
    if pid == 0:
        parent.close()
        time.sleep(0.2)
        for _ in range(reads):
            child.send(time.monotonic_ns().to_bytes(8, "little"))
            time.sleep(interval_ms / 1000)
        os._exit(0)
    child.close()
    return pid


def delays_ms(data: bytes) -> "list[float]":
    """Each timestamp's age in ms (fork_timestamp_writer's)."""
    now = time.monotonic_ns()
    return [(now - int.from_bytes(data[i:i + 8], "little")) / 1e6 for i in range(0, len(data) - 7, 8)]


def gil_latency(reads: int, interval_ms: float) -> "tuple[float, float, float]":
    """(p50, p99, max) ms from a byte's write to a reader thread's callback, while this process's main thread
    runs Python without pause (a loop busy with requests), in wall time."""
    import threading

    parent, child = socket.socketpair()
    pid = fork_timestamp_writer(parent, child, reads, interval_ms)
    delays: list[float] = []

    def on_read(data: bytes) -> None:
        delays.extend(delays_ms(data))

    reader = threading.Thread(target=epoll_reads, args=(parent, reads, on_read), daemon=True)
    reader.start()
    busy = 0
    while reader.is_alive():
        for _ in range(10_000):  # pure Python work, as a loaded event loop's
            busy += 1
    os.waitpid(pid, 0)
    delays.sort()
    return delays[len(delays) // 2], delays[int(len(delays) * 0.99)], delays[-1]


def loop_latency(reads: int, interval_ms: float, busy_ms: float, off_loop: bool,
                 seed: int) -> "tuple[float, float, float]":
    """Wall time from a write to its handling, trio's loop kept busy (runs of Python of ``busy_ms`` on average
    between checkpoints, half its time): by a task waiting on the socket (``off_loop`` False), or by the node's
    reader thread (gateway/engine/off_loop.py), which runs only while the loop waits for I/O."""
    import trio

    from gateway.engine.off_loop import OffLoopReader
    from gateway.net.fast_receive import receive_some

    parent, child = socket.socketpair()
    delays: list[float] = []
    busy_now = [False]
    overlaps = [0]  # reads handled while the busy task ran: must stay 0 (the reader runs only while the loop waits)
    randomness = random.Random(seed)  # the busy and idle runs' lengths, so that they do not lock to the writes' phase

    def on_data(data: bytes) -> None:
        overlaps[0] += busy_now[0]
        delays.extend(delays_ms(data))

    async def main() -> None:
        pid = fork_timestamp_writer(parent, child, reads, interval_ms)
        parent.setblocking(False)
        done = trio.Event()
        async with trio.open_nursery() as nursery:
            async def busy() -> None:
                while not done.is_set():
                    until = time.perf_counter() + randomness.uniform(0, 2 * busy_ms) / 1000
                    busy_now[0] = True
                    while time.perf_counter() < until:  # pure Python work, as a loaded loop's
                        pass
                    busy_now[0] = False
                    await trio.sleep(randomness.uniform(0, 2 * busy_ms) / 1000)  # idle as long on average

            nursery.start_soon(busy)
            if off_loop:
                reader = OffLoopReader.acquire()

                def on_readable() -> None:
                    data = os.read(parent.fileno(), 65536)
                    on_data(data)
                    if not data:
                        reader.unregister(parent.fileno())
                        done.set()

                reader.register(parent.fileno(), on_readable)
                await done.wait()
                reader.release()
            else:
                stream = trio.SocketStream(trio.socket.from_stdlib_socket(parent))
                while data := await receive_some(stream, 65536):
                    on_data(data)
                done.set()
        os.waitpid(pid, 0)

    trio.run(main)
    if overlaps[0]:
        raise AssertionError(f"{overlaps[0]} reads were handled while the loop's thread was busy")
    delays.sort()
    return delays[len(delays) // 2], delays[int(len(delays) * 0.99)], delays[-1]


def count(reads: int, mode: str, interval_ms: float, out_dir: Path) -> float:
    """Instructions per wake-up (a fresh process under callgrind)."""
    prefix = out_dir / f"callgrind.{mode}"
    subprocess.run(["valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={prefix}.%p",
                    sys.executable, __file__, "--child", mode, "--reads", str(reads)], check=True, capture_output=True,
                   env={**os.environ, "WAKEUP_INTERVAL_S": str(interval_ms / 1000)})
    totals = [int(line.split()[1]) for path in out_dir.glob(f"{prefix.name}.*.1")
              for line in path.read_text().splitlines() if line.startswith("totals:")]
    if not totals:
        raise RuntimeError("callgrind counted nothing")
    return totals[0] / reads


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reads", type=int, default=1000)
    parser.add_argument("--interval-ms", type=float, default=2.0)
    parser.add_argument("--gil-latency", action="store_true", help="only the reader thread's wait for the GIL "
                        "while the loop's thread is busy, in wall time")
    parser.add_argument("--switch-interval-ms", type=float, default=None, help="the interpreter's switch interval "
                        "for --gil-latency (default: Python's, 5 ms)")
    parser.add_argument("--loop-latency", action="store_true", help="a read's wait, trio's loop busy half its "
                        "time in --busy-ms runs, by a task and by the node's reader thread, in wall time")
    parser.add_argument("--busy-ms", type=float, default=2.0)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--child", choices=MODES, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.switch_interval_ms is not None:
        sys.setswitchinterval(args.switch_interval_ms / 1000)
    if args.child:
        measured(args.reads, args.child)
        return
    if args.loop_latency:
        print(f"A read's wait from the write to its handling, trio's loop busy half its time in runs of "
              f"{args.busy_ms:g} ms on average (seed {args.seed}), {args.reads} reads every {args.interval_ms:g} ms "
              f"(switch interval {sys.getswitchinterval() * 1000:g} ms):\n")
        print("| read by | p50 ms | p99 ms | max ms |\n|---|---|---|---|")
        for off_loop in (False, True):
            p50, p99, worst = loop_latency(args.reads, args.interval_ms, args.busy_ms, off_loop, args.seed)
            print(f"| {'the reader thread (off_loop.py)' if off_loop else 'a task (receive_some)'} | {p50:.2f} | "
                  f"{p99:.2f} | {worst:.2f} |")
        return
    if args.gil_latency:
        p50, p99, worst = gil_latency(args.reads, args.interval_ms)
        print(f"A reader thread's wait for the GIL, the main thread busy (switch interval "
              f"{sys.getswitchinterval() * 1000:g} ms), {args.reads} reads every {args.interval_ms:g} ms: "
              f"p50 {p50:.2f} ms, p99 {p99:.2f} ms, max {worst:.2f} ms")
        return
    out_dir = Path(tempfile.mkdtemp(prefix="smg-node-wakeup-"))
    print(f"\nInstructions per wake-up (callgrind), {args.reads} reads of one byte every {args.interval_ms:g} ms, "
          f"Python {sys.version.split()[0]}. Files: {out_dir}\n")
    names = {"read-first": "trio, receive_some reading first", "wait-first": "trio, waiting first once drained "
             "(the node)", "raw-epoll": "no trio: epoll.poll, os.read, re-arm", "task-step": "trio, one task step "
             "without I/O", "reader-thread": "a thread of its own on epoll, a callback each read, trio's loop "
             "waiting (the GIL taken and given back)"}
    print("| wake-up | instructions each |")
    print("|---|---|")
    for mode in MODES:
        print(f"| {names[mode]} | {count(args.reads, mode, args.interval_ms, out_dir) / 1000:.1f} k |")


if __name__ == "__main__":
    main()

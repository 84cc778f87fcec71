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

Needs valgrind. User-space instructions only: the system calls' kernel time is not in them.
"""

from __future__ import annotations

import argparse
import os
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


def gil_latency(reads: int, interval_ms: float) -> "tuple[float, float, float]":
    """(p50, p99, max) ms from a byte's write to a reader thread's callback, while this process's main thread
    runs Python without pause (a loop busy with requests), in wall time."""
    import threading

    parent, child = socket.socketpair()
    pid = os.fork()
    if pid == 0:
        parent.close()
        time.sleep(0.2)
        for _ in range(reads):
            child.send(time.monotonic_ns().to_bytes(8, "little"))
            time.sleep(interval_ms / 1000)
        os._exit(0)
    child.close()
    delays: list[float] = []

    def on_read(data: bytes) -> None:
        now = time.monotonic_ns()
        delays.extend((now - int.from_bytes(data[i:i + 8], "little")) / 1e6 for i in range(0, len(data) - 7, 8))

    reader = threading.Thread(target=epoll_reads, args=(parent, reads, on_read), daemon=True)
    reader.start()
    busy = 0
    while reader.is_alive():
        for _ in range(10_000):  # pure Python work, as a loaded event loop's
            busy += 1
    os.waitpid(pid, 0)
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
    parser.add_argument("--child", choices=MODES, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.switch_interval_ms is not None:
        sys.setswitchinterval(args.switch_interval_ms / 1000)
    if args.child:
        measured(args.reads, args.child)
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

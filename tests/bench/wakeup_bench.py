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

    python tests/bench/wakeup_bench.py [--reads 1000] [--interval-ms 2]

Needs valgrind. User-space instructions only: the system calls' kernel time is not in them.
"""

from __future__ import annotations

import argparse
import os
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


def measured(reads: int, wait_first: bool) -> None:
    """The parent's side, run under callgrind: read ``reads`` bytes one wake-up each."""
    import trio

    from gateway.fast_receive import receive_some

    parent, child = socket.socketpair()
    pid = os.fork()
    if pid == 0:
        parent.close()
        child_writes(child, reads + WARMUP_READS, float(os.environ["WAKEUP_INTERVAL_S"]))
        os._exit(0)
    child.close()

    async def main() -> None:
        stream = trio.SocketStream(trio.socket.from_stdlib_socket(parent))
        for _ in range(WARMUP_READS):
            await receive_some(stream, 65536)
        subprocess.run(["callgrind_control", "-i", "on", str(os.getpid())], check=True, capture_output=True)
        drained = False
        for _ in range(reads):
            data = await receive_some(stream, 65536, drained and wait_first)
            drained = len(data) < 65536
        subprocess.run(["callgrind_control", "-d", str(os.getpid())], check=True, capture_output=True)

    trio.run(main)
    os.waitpid(pid, 0)


def count(reads: int, wait_first: bool, interval_ms: float, out_dir: Path) -> float:
    """Instructions per wake-up (a fresh process under callgrind)."""
    prefix = out_dir / f"callgrind.{'wait' if wait_first else 'read'}"
    subprocess.run(["valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={prefix}.%p",
                    sys.executable, __file__, "--child", "wait-first" if wait_first else "read-first",
                    "--reads", str(reads)], check=True, capture_output=True,
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
    parser.add_argument("--child", choices=("read-first", "wait-first"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        measured(args.reads, args.child == "wait-first")
        return
    out_dir = Path(tempfile.mkdtemp(prefix="smg-node-wakeup-"))
    print(f"\nInstructions per wake-up (callgrind), {args.reads} reads of one byte every {args.interval_ms:g} ms, "
          f"Python {sys.version.split()[0]}. Files: {out_dir}\n")
    print("| receive_some | instructions per wake-up |")
    print("|---|---|")
    for wait_first in (False, True):
        per_wakeup = count(args.reads, wait_first, args.interval_ms, out_dir)
        print(f"| {'wait first once drained' if wait_first else 'read first'} | {per_wakeup / 1000:.1f} k |")


if __name__ == "__main__":
    main()

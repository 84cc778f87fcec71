"""Is the HTTP port ours to take? Checked once at start, before anything binds it for real.

A node's processes bind the HTTP port with SO_REUSEPORT so that they can share it; so could a second
node started by the same user on the same port, and the kernel would then split clients between two
unrelated nodes (a stored response read back: 200, 404, 200, 404...). So the node first binds the port
alone, without SO_REUSEPORT: that fails while anything holds it, a listener or a reserved socket, ours or
another program's. The error names the port and, where this user may see it, the process that holds it.
"""

from __future__ import annotations

import errno
import os
import socket
from pathlib import Path


class PortInUse(Exception):
    """The port cannot be taken: its message is the one line to print."""


def check_port_free(host: str, port: int) -> None:
    """Raises PortInUse when ``host:port`` is held by anything (port 0, the kernel's choice, is always free)."""
    if port == 0:
        return
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    probe = socket.socket(family, socket.SOCK_STREAM)
    try:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a connection in TIME_WAIT holds nothing
        probe.bind((host, port))
    except OSError as e:
        if e.errno == errno.EADDRINUSE:
            holder = port_holder(port)
            raise PortInUse(f"port {port} on {host} is in use" + (f" by {holder}" if holder else "") +
                            ": stop it, or pick another --port") from None
        raise PortInUse(f"cannot bind {host}:{port}: {e.strerror}") from None
    finally:
        probe.close()


def port_holder(port: int) -> str | None:
    """``pid N (command line)`` of a process holding a TCP socket on ``port``, when this user can see it."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) > 9 and int(fields[1].rpartition(":")[2], 16) == port and fields[2].endswith(":0000"):
                inodes.add(fields[9])  # a local socket on the port with no peer: listening or reserved
    inodes.discard("0")
    if not inodes:
        return None
    wanted = {f"socket:[{inode}]" for inode in inodes}
    for pid in sorted((p for p in os.listdir("/proc") if p.isdigit()), key=int):
        try:
            if any(os.readlink(f"/proc/{pid}/fd/{fd}") in wanted for fd in os.listdir(f"/proc/{pid}/fd")):
                command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                return f"pid {pid} ({_short(command.strip())})"
        except OSError:
            continue  # another user's process, or gone meanwhile
    return None


def _short(command: str, chars_max: int = 120) -> str:
    command = " ".join(command.split())
    return command if len(command) <= chars_max else command[:chars_max - 3] + "..."

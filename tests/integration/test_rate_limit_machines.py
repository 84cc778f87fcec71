"""A rate-limit key's owner machine killed with --workers N: its counts survive on another machine (issue 36).

Two machines (nodes) of three processes each. The limit's name is chosen so that the plain ring order would put
all three copies of its key (owner and two replicas) on the owner's machine: placed so, the counts die with the
machine and the survivor admits the whole allowance again. Placed by machine (HashRing.placement), a copy is on
the other machine, and the survivor refuses what was already spent.
"""

from __future__ import annotations

import re

import httpx2

from chaos.processes import EngineProcess, NodeProcess
from mesh.crypto import generate_key
from mesh.ring import HashRing

from tests.support.nodes import MODEL
from tests.support.waiting import eventually

PROCESSES = 3
ALLOWANCE = 10  # requests per hour: nothing comes back during the test


def _machine(member: str) -> str:
    return member.split("-w")[0]


def _members(machine: str) -> "list[str]":
    return [machine] + [f"{machine}-w{i}" for i in range(1, PROCESSES)]


def _limit_name() -> str:
    """A limit whose key the plain ring order places wholly on one machine (three copies, three processes)."""
    ring = HashRing.build(_members("m0") + _members("m1"))
    for i in range(1000):
        name = f"hot{i}"
        if len({_machine(m) for m in ring.owners(f"{name}:*", 3)}) == 1:
            return name
    raise AssertionError("no such name")


def _metric(port: int, name: str) -> float:
    text = httpx2.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
    match = re.search(rf"^{re.escape(name)} (\S+)$", text, re.M)
    return float(match.group(1)) if match else -1.0


def _wait(check, what: str, timeout_s: float = 60.0) -> None:
    eventually(check, timeout_s, what)


def test_the_owner_machines_kill_keeps_the_counts_on_the_other_machine(log_dir, tmp_path):
    name = _limit_name()
    key = f"{name}:*"
    ring = HashRing.build(_members("m0") + _members("m1"))
    placed = ring.placement(key, 3, _machine)
    assert {_machine(m) for m in placed} == {"m0", "m1"} and placed[0] == ring.owner(key)
    limits = tmp_path / "limits.toml"
    limits.write_text(f'[[limits]]\nname = "{name}"\nscope = "global"\nlimit = {ALLOWANCE}\nwindow_s = 3600\n'
                      'algorithm = "sliding_window"\n')
    engine = EngineProcess(["--zero-cost"], log_dir, "rlm-engine")
    key_ = generate_key()
    # Fixed, below the kernel's range for outgoing connections; each process takes port + its index.
    mesh = {"m0": 26946, "m1": 26966}  # (--rpc-addr: these + 10)
    metrics = {"m0": 31500, "m1": 31600}
    nodes: dict[str, NodeProcess] = {}
    try:
        for machine in ("m0", "m1"):
            nodes[machine] = NodeProcess([
                "--workers", str(PROCESSES), "--worker-urls", engine.url, "--node-name", machine,
                "--mesh-bind", f"127.0.0.1:{mesh[machine]}", "--join", f"127.0.0.1:{mesh['m0']}", "--encrypt", key_,
                "--mesh-preset", "local", "--rpc-addr", f"127.0.0.1:{mesh[machine] + 10}",
                "--prometheus-host", "127.0.0.1", "--prometheus-port", str(metrics[machine]),
                "--rate-limits", str(limits), "--log-level", "warning"], log_dir, f"rlm-{machine}")
        ports = [metrics[m] + i for m in ("m0", "m1") for i in range(PROCESSES)]
        _wait(lambda: all(_metric(p, 'smg_mesh_members{state="alive"}') == 2 * PROCESSES for p in ports),
              "six members seen by every process")
        owner = ring.owner(key)
        doomed, survivor = _machine(owner), "m1" if _machine(owner) == "m0" else "m0"
        owner_port = metrics[doomed] + (int(owner.rsplit("-w", 1)[1]) if "-w" in owner else 0)
        url = nodes[survivor].url
        body = {"model": MODEL, "prompt": "hi", "max_tokens": 1}
        codes = [httpx2.post(url + "/v1/completions", json=body, timeout=30).status_code
                 for _ in range(ALLOWANCE + 1)]
        assert codes == [200] * ALLOWANCE + [429], codes
        # Every change the owner made is on its replicas (acknowledged) before its machine goes.
        _wait(lambda: _metric(owner_port, "smg_rate_limit_replication_pending") == 0, "replicated")
        assert len(nodes[doomed].children()) == PROCESSES
        nodes[doomed].kill_machine()  # processes and supervisor at once: nothing leaves the mesh or hands over
        # Declared dead, not merely suspected (a suspect stays on the ring, and its keys' requests go to the
        # failure policy meanwhile): then the ring is the survivor's own.
        _wait(lambda: all(_metric(metrics[survivor] + i, 'smg_mesh_members{state="alive"}') == PROCESSES
                          and _metric(metrics[survivor] + i, 'smg_mesh_members{state="suspect"}') == 0
                          for i in range(PROCESSES)), "the survivor's processes declared the machine dead")
        after = [httpx2.post(url + "/v1/completions", json=body, timeout=30).status_code for _ in range(5)]
        assert after == [429] * 5, f"the survivor admitted again what was spent: {after}"
    finally:
        for n in nodes.values():
            n.kill()
        engine.kill()

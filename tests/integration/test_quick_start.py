"""The README's quick start, followed as a new user would: its command, its curl body, its Python
snippet with the real openai SDK, `smg-node members` with no flags, and nothing left after SIGTERM.

The command and the snippet are read from README.md, so the test follows what the README says.
It runs the installed project (not a fresh clone: the suite's environment is one), in a home
directory of its own, so the admin token and the recorded admin endpoint are the defaults a new
user gets.
"""

from __future__ import annotations

import os
import pathlib
import re
import select
import shlex
import signal
import subprocess
import sys
import time

import httpx2
import pytest

from gateway.node.supervisor import available_cores, default_worker_count
from tests.support.waiting import eventually

ROOT = pathlib.Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
START_TIMEOUT_S = 120.0
STOP_TIMEOUT_S = 30.0


def quick_start_section() -> str:
    return README.split("## Quick start", 1)[1].split("\n## ", 1)[0]


def code_blocks(text: str) -> "list[tuple[str, str]]":
    return re.findall(r"```(\w*)\n(.*?)```", text, re.S)


def descendants(pid: int) -> set[int]:
    """Every process below ``pid`` (Linux: /proc/PID/task/TID/children)."""
    found: set[int] = set()
    stack = [pid]
    while stack:
        for task in pathlib.Path(f"/proc/{stack.pop()}/task").glob("*"):
            try:
                children = [int(c) for c in (task / "children").read_text().split()]
            except OSError:
                continue
            for child in children:
                if child not in found:
                    found.add(child)
                    stack.append(child)
    return found


def alive(pid: int) -> bool:
    try:
        state = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.fixture
def new_user_env(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("SMG_NODE_") and k != "XDG_STATE_HOME"}
    env["HOME"] = str(tmp_path)
    return env


def test_the_readme_quick_start_works_and_leaves_nothing_behind(new_user_env, tmp_path):
    section = quick_start_section()
    shell, curl, snippet = (body for _, body in code_blocks(section))
    install, _, serve = shell.strip().rpartition(" && ")
    assert "openai" in install.split("pip install", 1)[1], "the quick start must install what its snippets need"
    argv = shlex.split(serve)
    assert argv[:2] == ["smg-node", "serve"]
    smg_node = str(pathlib.Path(sys.executable).with_name("smg-node"))
    node = subprocess.Popen([smg_node, *argv[1:]], env=new_user_env, cwd=tmp_path, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        url = _wait_ready(node)
        assert url == "http://127.0.0.1:30000"  # what the README's snippets use

        # The curl line's body, sent as it is.
        body = re.search(r"-d '(.*?)'", curl, re.S).group(1)
        r = httpx2.post(f"{url}/v1/chat/completions", content=body, headers={"content-type": "application/json"},
                        timeout=60)
        assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"], r.text

        # The Python snippet, with the real openai SDK.
        ran = subprocess.run([sys.executable, "-c", snippet], env=new_user_env, capture_output=True, text=True,
                             timeout=120)
        assert ran.returncode == 0 and ran.stdout.strip(), ran.stderr

        # The API docs' weather examples (a tool call with its reasoning, a Responses chain through the tool's
        # result, Anthropic's tool_use), each as written after the docs' client: the quick start's engines ship
        # the answers they need (--demo-answers).
        for example in docs_weather_examples():
            ran = subprocess.run([sys.executable, "-c", example], env=new_user_env, capture_output=True, text=True,
                                 timeout=120)
            assert ran.returncode == 0, (example, ran.stderr)
            said = ran.stdout
            assert 'get_weather {"city": "Oslo"}' in said or "It is 14 degrees in Oslo" in said or \
                "tool_use ['thinking', 'tool_use']" in said, (example, said)

        # `smg-node members` finds the local node with no flags, and shows the node with its processes.
        members = subprocess.run([smg_node, "members"], env=new_user_env, capture_output=True, text=True,
                                 timeout=60)
        processes = default_worker_count(available_cores())
        if processes == 1:  # one process and no mesh: nothing to list, and the CLI says why
            assert members.returncode != 0 and "--mesh-bind" in members.stderr, members.stderr
        else:
            assert members.returncode == 0, members.stderr
            lines = members.stdout.strip().splitlines()
            assert lines[0].split()[:2] == ["NODE", "MEMBER"]
            assert len(lines) - 1 == processes and lines[1].split()[0] != "", members.stdout
            assert all(line.startswith(" ") for line in lines[2:]), "a node's processes are grouped under it"
            assert all(" alive " in f" {line.lower()} " for line in lines[1:]), members.stdout

        family = descendants(node.pid)
        assert len(family) >= 2  # the simulated engines at least
        node.send_signal(signal.SIGTERM)
        node.wait(STOP_TIMEOUT_S)
        eventually(lambda: not any(alive(p) for p in family), STOP_TIMEOUT_S,
                   lambda: f"processes left after SIGTERM: {[p for p in family if alive(p)]}")
    finally:
        if node.poll() is None:
            os.killpg(node.pid, signal.SIGKILL)
            node.wait()


def docs_weather_examples() -> "list[str]":
    """docs/apis.md's Python examples that ask about Oslo's weather, each after the docs' first block (the
    client)."""
    blocks = [body for kind, body in code_blocks((ROOT / "docs" / "apis.md").read_text()) if kind == "python"]
    examples = [blocks[0] + body for body in blocks[1:] if "Weather in Oslo" in body]
    assert len(examples) == 3, "the tool call, the Responses chain and Anthropic's tool_use"
    return examples


def _wait_ready(node: subprocess.Popen) -> str:
    deadline = time.monotonic() + START_TIMEOUT_S
    data = b""
    while b"READY " not in data:
        remaining = deadline - time.monotonic()
        assert remaining > 0, f"no READY line within {START_TIMEOUT_S:.0f} s: {data[-500:]!r}"
        readable, _, _ = select.select([node.stdout], [], [], remaining)
        if readable:
            chunk = os.read(node.stdout.fileno(), 4096)
            assert chunk, f"the node exited ({node.wait()}) before it was ready: {data[-500:]!r}"
            data += chunk
    return data.split(b"READY ", 1)[1].split()[0].decode()


@pytest.mark.parametrize("workers", ["1", "2"])
def test_simulated_engines_end_with_a_killed_node(new_user_env, tmp_path, workers):
    """SIGKILL leaves the node no chance to stop its engines: they see their stdin close and exit."""
    smg_node = str(pathlib.Path(sys.executable).with_name("smg-node"))
    node = subprocess.Popen([smg_node, "serve", "--sim-engines", "2", "--workers", workers, "--port", "0"],
                            env=new_user_env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    family: set[int] = set()
    try:
        _wait_ready(node)
        family = descendants(node.pid)
        assert len(family) >= 2
        node.kill()
        node.wait()
        eventually(lambda: not any(alive(p) for p in family), STOP_TIMEOUT_S,
                   lambda: f"processes left after SIGKILL: {[p for p in family if alive(p)]}")
    finally:
        if node.poll() is None:
            node.kill()
            node.wait()
        for pid in family:  # whatever a failed assertion left
            if alive(pid):
                os.kill(pid, signal.SIGKILL)

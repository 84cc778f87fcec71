"""What a cluster accepted survives a restart of every node at once (issue 62): run-time API keys, the workers, the
gossip keyring after a rotation, stored responses and conversations; a torn log costs its torn tail only, and a
node that may have lost its keys refuses inference until it has them again or an operator accepts the loss.

Every node is SIGKILLed (a power cut: no leave, no flush) and started again on the same data directory."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx2
import pytest
import openai

from chaos.processes import NodeProcess
from mesh.crypto import decode_key, generate_key, key_fingerprint

from tests.support.node_pairs import admin, alive_members
from tests.support.nodes import MODEL

BASE = 23600  # this file's mesh ports: below the kernel's outgoing range, used by no other test


def within(predicate, bound_s: float, what: str) -> None:
    deadline = time.monotonic() + bound_s
    while not predicate():
        assert time.monotonic() < deadline, f"not within {bound_s}s: {what}"
        time.sleep(0.1)


def chat_status(node: NodeProcess, key: str | None) -> int:
    headers = {"authorization": f"Bearer {key}"} if key else {}
    return httpx2.post(node.url + "/v1/chat/completions", headers=headers, timeout=30, json={
        "model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}).status_code


def cli(node: NodeProcess, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gateway.cli", *args, "--url", node.url], capture_output=True,
                          text=True, timeout=60, env={**os.environ, **node.admin_env})


def conversation_texts(node: NodeProcess, key: str, conversation_id: str) -> "list[str] | None":
    try:
        items = openai.OpenAI(base_url=node.url + "/v1", api_key=key, max_retries=0).conversations.items.list(
            conversation_id, order="asc")
    except openai.NotFoundError:
        return None
    return [item.content[0].text for item in items.data]


def truncate_logs(data_dir: Path, name: str, cut_bytes: int) -> None:
    for log in data_dir.glob(f"{name}.log.*"):
        if log.suffix.lstrip(".").isdigit():
            size = log.stat().st_size
            with open(log, "r+b") as f:
                f.truncate(max(6, size - cut_bytes))


# -- a lone node ------------------------------------------------------------------------------------------------------


def test_a_lone_node_keeps_its_keys_limits_and_stored_responses_across_a_sigkill(engines, log_dir):
    args = ["--worker-urls", engines[0].url, "--workers", "1"]
    node = NodeProcess(args, log_dir, "durable-lone")
    try:
        assert chat_status(node, None) == 200  # open: no key yet
        created = admin(node, "POST", "/admin/api-keys", {"name": "app"}).json()
        key = created["key"]
        limits = {"limits": [{"name": "per-key", "scope": "api_key", "limit": 1000, "window_s": 60}]}
        assert admin(node, "PUT", "/admin/rate-limits", limits).status_code == 200
        client = openai.OpenAI(base_url=node.url + "/v1", api_key=key)
        first = client.responses.create(model=MODEL, input="remember me", max_output_tokens=4)
        node.kill_machine()
        node = NodeProcess(args, log_dir, "durable-lone", data_dir=node.data_dir)
        assert chat_status(node, None) == 401, "a key existed: a keyless request must not pass after a restart"
        assert chat_status(node, key) == 200
        assert admin(node, "GET", "/admin/rate-limits").json()["limits"][0]["name"] == "per-key"
        client = openai.OpenAI(base_url=node.url + "/v1", api_key=key)
        assert client.responses.retrieve(first.id).id == first.id
        follow = client.responses.create(model=MODEL, input="and now?", previous_response_id=first.id,
                                          max_output_tokens=4)
        assert follow.previous_response_id == first.id
    finally:
        node.kill()


def test_a_node_that_lost_the_record_of_its_only_key_refuses_inference_until_told(engines, log_dir):
    args = ["--worker-urls", engines[0].url, "--workers", "1"]
    node = NodeProcess(args, log_dir, "durable-torn")
    try:
        key = admin(node, "POST", "/admin/api-keys", {"name": "only"}).json()["key"]
        node.kill_machine()
        # The log cut inside the key's record: what is left has no key (a disk that lost its last writes).
        truncate_logs(node.data_dir, "cluster-doc", 40)
        node = NodeProcess(args, log_dir, "durable-torn", data_dir=node.data_dir)
        refused = httpx2.post(node.url + "/v1/chat/completions", timeout=30, json={
            "model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
        assert refused.status_code == 503, refused.text
        assert refused.json()["error"]["code"] == "keys_unknown"
        assert "smg-node data accept" in refused.json()["error"]["message"]
        assert chat_status(node, key) == 503  # the key's record is gone with the tail: nobody is let in
        assert "could not read back" in node.log_text() or "damaged" in node.log_text()
        status = cli(node, "data", "status")
        assert status.returncode == 0 and "set aside, not accepted" in status.stdout, status.stdout + status.stderr
        # A restart does not forget that something was lost: the set-aside tail is the evidence.
        node.kill_machine()
        node = NodeProcess(args, log_dir, "durable-torn", data_dir=node.data_dir)
        assert chat_status(node, None) == 503
        accepted = cli(node, "data", "accept")
        assert accepted.returncode == 0 and "accepted" in accepted.stdout, accepted.stderr
        assert chat_status(node, None) == 200  # the operator's word: no key known, inference open as before
    finally:
        node.kill()


def test_a_second_node_on_the_same_data_directory_is_refused_in_one_line(engines, log_dir):
    node = NodeProcess(["--worker-urls", engines[0].url, "--workers", "1"], log_dir, "durable-owner")
    try:
        second = subprocess.run([sys.executable, "-m", "gateway.cli", "serve", "--port", "0", "--workers", "1",
                                 "--data-dir", str(node.data_dir)], capture_output=True, text=True, timeout=60)
        assert second.returncode == 1
        assert "is in use by another smg-node process" in second.stderr and "Traceback" not in second.stderr
    finally:
        node.kill()


# -- a cluster ---------------------------------------------------------------------------------------------------------


def cluster_args(i: int, *extra: str, base: int = BASE) -> list[str]:
    return ["--mesh-bind", f"127.0.0.1:{base + i}", "--join", f"127.0.0.1:{base}", f"127.0.0.1:{base + 1}",
            "--node-name", f"d{i}", "--mesh-preset", "local", "--rpc-addr", f"127.0.0.1:{base + 100 + i}",
            "--retry-join-interval-secs", "0.5", "--health-check-interval-secs", "0.5", "--workers", "1", *extra]


def start_cluster(log_dir, env, data_dirs=None) -> list[NodeProcess]:
    nodes = []
    try:
        for i in range(3):
            nodes.append(NodeProcess(cluster_args(i), log_dir, f"durable-d{i}", env=env,
                                     data_dir=data_dirs[i] if data_dirs else None))
        within(lambda: all(alive_members(n) == 3 for n in nodes), 60, "three members alive on every node")
    except BaseException:
        for node in nodes:
            node.kill()
        raise
    return nodes


def kill_all(nodes: list[NodeProcess]) -> None:
    for node in nodes:  # one after the other within milliseconds: nobody has time to notice and leave
        node.signal_machine(signal.SIGKILL)
    for node in nodes:
        node.process.wait(10)


def test_a_cluster_killed_at_once_comes_back_with_its_keys_workers_keyring_and_conversations(engines, log_dir):
    old_key = generate_key()
    env = {"SMG_NODE_ENCRYPT": old_key}
    nodes = start_cluster(log_dir, env)
    try:
        a, b, c = nodes
        # A worker added at run time (not on any node's command line), a key, a rotated gossip key.
        assert admin(a, "POST", "/workers", {"url": engines[0].url}).status_code in (200, 201)
        within(lambda: all(engines[0].url in str(admin(n, "GET", "/workers").json()) for n in nodes), 30,
               "the worker known everywhere")
        key = admin(b, "POST", "/admin/api-keys", {"name": "app"}).json()["key"]
        within(lambda: all(chat_status(n, None) == 401 for n in nodes), 30, "the key required everywhere")
        new_key = generate_key()
        new_fingerprint = key_fingerprint(decode_key(new_key))
        rotated = cli(a, "keyring", "rotate", new_key)
        assert rotated.returncode == 0, rotated.stdout + rotated.stderr
        # A conversation and a response chain, each written through a different node.
        client_b = openai.OpenAI(base_url=b.url + "/v1", api_key=key)
        conversation = client_b.conversations.create(items=[{"type": "message", "role": "user", "content": "one"}])
        client_b.conversations.items.create(conversation.id, items=[
            {"type": "message", "role": "user", "content": "two"}])
        first = openai.OpenAI(base_url=c.url + "/v1", api_key=key).responses.create(
            model=MODEL, input="remember me", max_output_tokens=4)

        for round_ in ("clean", "torn"):
            data_dirs = [n.data_dir for n in nodes]
            kill_all(nodes)
            if round_ == "torn":
                # One node's logs lose their last records: it keeps the intact prefix, the peers hold the rest.
                truncate_logs(data_dirs[1], "cluster-doc", 25)
                truncate_logs(data_dirs[1], "history", 25)
            # The nodes' flags still say the old gossip key: each takes the keyring it kept, or none rejoins.
            nodes[:] = start_cluster(log_dir, env, data_dirs)
            for n in nodes:
                keyring = cli(n, "keyring", "list").stdout.split()
                assert keyring == [new_fingerprint, "(primary)"], f"{round_}: {n.name} came back with {keyring}"
                assert chat_status(n, None) == 401, f"{round_}: a keyless request passed on {n.name}"
                assert chat_status(n, key) == 200
                assert engines[0].url in str(admin(n, "GET", "/workers").json()), f"{round_}: worker lost"
                client = openai.OpenAI(base_url=n.url + "/v1", api_key=key)
                items = client.conversations.items.list(conversation.id, order="asc")
                assert [i.content[0].text for i in items.data] == ["one", "two"], f"{round_}: {items}"
                follow = client.responses.create(model=MODEL, input="and now?", previous_response_id=first.id,
                                                  max_output_tokens=4)
                assert follow.previous_response_id == first.id
            if round_ == "torn":
                assert "damaged" in nodes[1].log_text()
    finally:
        for n in nodes:
            n.kill()


# -- a rolling upgrade -------------------------------------------------------------------------------------------------

# The last version before the data directory (2026-11-29): its nodes kept nothing on disk, so the upgrade from it is
# the one where every node's state must come from its peers of the other version, and then be kept. A later change
# of an on-disk or wire format moves this to the last commit with the previous format.
PREVIOUS_VERSION = "aa2c81c"


def previous_tree(tmp_path: Path) -> Path:
    """The previous version's source, from this repository's history (its packages import from there: ``python -m``
    puts the working directory first)."""
    root = Path(__file__).resolve().parents[2]
    archive = subprocess.run(["git", "-C", str(root), "archive", PREVIOUS_VERSION], capture_output=True)
    if archive.returncode != 0:
        pytest.skip(f"the previous version {PREVIOUS_VERSION} is not in this clone's history: "
                    f"{archive.stderr.decode(errors='replace').strip()}")
    tree = tmp_path / "previous"
    tree.mkdir()
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive.stdout, check=True)
    return tree


def test_a_cluster_upgraded_node_by_node_from_the_previous_version_keeps_serving_and_keeps_its_state(
        engines, log_dir, tmp_path):
    tree = previous_tree(tmp_path)
    env = {"SMG_NODE_ENCRYPT": generate_key()}
    base = BASE + 10
    nodes: list[NodeProcess] = []
    try:
        for i in range(3):
            nodes.append(NodeProcess(cluster_args(i, base=base), log_dir, f"upgrade-old{i}", env=env, cwd=tree,
                                     keep_data=False))
        within(lambda: all(alive_members(n) == 3 for n in nodes), 60, "the previous version's cluster formed")
        assert admin(nodes[0], "POST", "/workers", {"url": engines[0].url}).status_code in (200, 201)
        key = admin(nodes[1], "POST", "/admin/api-keys", {"name": "app"}).json()["key"]
        # The key on every node before the conversation is made: a node that has not heard of it yet still has an
        # open data plane, and stores the conversation as the anonymous caller's, which the key's reads never find
        # (404 on every node: what two clean-clone runs of 2026-11-29 met here, under the suite's load).
        within(lambda: all(chat_status(n, key) == 200 and chat_status(n, None) == 401 for n in nodes), 30,
               "the key and the worker on every node of the previous version")
        conversation = openai.OpenAI(base_url=nodes[2].url + "/v1", api_key=key).conversations.create(
            items=[{"type": "message", "role": "user", "content": "before the upgrade"}])

        for i in range(3):  # as an operator does it: one node at a time, each back before the next goes
            assert nodes[i].stop() == 0  # SIGTERM: it leaves the mesh and drains
            nodes[i] = NodeProcess(cluster_args(i, base=base), log_dir, f"upgrade-new{i}", env=env)
            within(lambda: all(alive_members(n) == 3 for n in nodes), 60, f"node {i} upgraded and back")
            for n in nodes:  # old and new side by side: both versions serve with the cluster's state
                assert chat_status(n, None) == 401 and chat_status(n, key) == 200, f"after node {i}: {n.name}"
            # The new node starts empty (the previous version kept nothing on disk) and takes the conversation from
            # its peers; a read right after the join was once answered 404 under load before the catch-up (the
            # memory store's, seen once in a clean-clone run: the note), so the read is polled, bounded.
            within(lambda: conversation_texts(nodes[i], key, conversation.id) == ["before the upgrade"], 15,
                   f"node {i}, upgraded, serves the conversation")

        # Everything the upgraded nodes took from their peers is on their disks: a power cut now loses nothing.
        data_dirs = [n.data_dir for n in nodes]
        kill_all(nodes)
        for i in range(3):
            nodes[i] = NodeProcess(cluster_args(i, base=base), log_dir, f"upgrade-new{i}", env=env,
                                   data_dir=data_dirs[i])
        within(lambda: all(alive_members(n) == 3 for n in nodes), 60, "the upgraded cluster back after a power cut")
        for n in nodes:
            assert chat_status(n, None) == 401 and chat_status(n, key) == 200
            assert engines[0].url in str(admin(n, "GET", "/workers").json())
        items = openai.OpenAI(base_url=nodes[0].url + "/v1", api_key=key).conversations.items.list(conversation.id)
        assert [item.content[0].text for item in items.data] == ["before the upgrade"]
    finally:
        for n in nodes:
            n.kill()

"""Stored responses and conversations across a cluster behind nginx (the memory backend, replicated on the
mesh): each turn lands on another node, the node owning what the chain needs is killed between turns,
and the next turn still works, through the balancer and on the one node that held no copy. A killed
node restarted with an empty memory gets its copies back from its peers."""

from __future__ import annotations

import shutil

import httpx2
import openai
import pytest

from mesh.ring import HashRing

from tests.support.history_script import MODEL, TOOLS, write_script
from tests.support.waiting import eventually

NODES = 4  # one more than a shard's owners: one node holds no copy of a given response


@pytest.fixture
def cluster(log_dir, tmp_path):
    if shutil.which("nginx") is None:
        pytest.skip("nginx not installed (.ci/run installs it: apt-get install nginx)")
    from chaos.local_cluster import LocalCluster
    script = write_script(tmp_path / "answers.jsonl")
    c = LocalCluster(nodes=NODES, engines=1, port=18180, mesh_base_port=19146, log_dir=log_dir / "history-cluster",
                     engine_args=["--zero-cost", "--script", str(script)], lb="nginx")
    eventually(lambda: all(len(httpx2.get(n.url + "/workers", headers=n.admin_headers).json()["workers"]) == 1
                           for n in c.nodes), 30)
    yield c
    c.stop()


def owners(shard_id: str) -> list[int]:
    ring = HashRing.build([f"node{i}" for i in range(NODES)])
    return [int(name.removeprefix("node")) for name in ring.owners(shard_id, 3)]


def metric(url: str, name: str) -> float:
    for line in httpx2.get(url + "/metrics").text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return 0.0


def client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0, timeout=30)


def test_chains_and_conversations_continue_after_their_owner_is_killed(cluster):
    lb = client(cluster.url)
    direct = [client(n.url) for n in cluster.nodes]
    first = direct[0].responses.create(model=MODEL, input="What is the weather in Oslo?", tools=TOOLS)
    (call,) = [item for item in first.output if item.type == "function_call"]
    conversation = direct[1].conversations.create()
    direct[2].responses.create(model=MODEL, conversation=conversation.id, input="Hello, my name is Ada.")

    primary, *_ = owners(first.id)
    cluster.nodes[primary].kill()
    (outsider,) = set(range(NODES)) - set(owners(first.id))  # holds no copy: must ask the replicas
    with direct[outsider].responses.stream(
            model=MODEL, previous_response_id=first.id, tools=TOOLS,
            input=[{"type": "function_call_output", "call_id": call.call_id, "output": "14 degrees"}]) as stream:
        kinds = [event.type for event in stream]
        second = stream.get_final_response()
    assert kinds[-1] == "response.completed" and second.output_text == "It is 14 degrees in Oslo today."
    third = lb.responses.create(model=MODEL, previous_response_id=second.id, input="What did I ask?")
    assert third.output_text == "You asked about the weather in Oslo."  # the whole chain, through nginx
    assert lb.responses.retrieve(first.id).id == first.id

    survivors = [i for i in range(NODES) if i != primary]
    conversation_owner = next(i for i in owners(conversation.id) if i in survivors)
    cluster.nodes[conversation_owner].kill()  # a second node down: the conversation's first live owner
    last = next(i for i in survivors if i != conversation_owner and i != 2)  # not the node of the first turn
    with direct[last].responses.stream(model=MODEL, conversation=conversation.id, input="What is my name?") as s:
        for _ in s:
            pass
        answer = s.get_final_response()
    assert answer.output_text == "Your name is Ada."
    roles = [item.role for item in lb.conversations.items.list(conversation.id, order="asc")]
    assert roles == ["user", "assistant", "user", "assistant"]


def test_a_restarted_node_gets_its_copies_back(cluster):
    lb = client(cluster.url)
    ids = [lb.responses.create(model=MODEL, input=f"Hello {i}").id for i in range(12)]
    victim = 1
    held = [rid for rid in ids if victim in owners(rid)]
    cluster.nodes[victim].kill()
    again = cluster.restart(victim)
    # Once it caught up with its three peers, the restarted node answers every id it owns from its own
    # copy: with the others stopped, nothing else could.
    eventually(lambda: metric(again.url, "smg_history_peers_synced_total") >= NODES - 1, 30)
    for i in range(NODES):
        if i != victim:
            cluster.nodes[i].kill()
    for rid in held:
        r = httpx2.get(f"{again.url}/v1/responses/{rid}")
        assert r.status_code == 200 and r.json()["id"] == rid

"""Models as routes in a cluster of three nodes (gateway/providers/service.py, quotas.py, overflow.py): a target's
cooldown set by one node is honoured by the others at once; an account's quota is held by the whole cluster, the
requests past it answered by the next target; a models config put on one node is every node's; a Responses
conversation moves from the fleet to a provider on one node and is continued on another; a saturated pool's
requests overflow to the next target and come back when it drains."""

from __future__ import annotations

import concurrent.futures

import httpx2
import openai
import pytest

from chaos.processes import EngineProcess
from tests.support.fake_providers import Failure, FakeOpenAI, started
from tests.support.node_pairs import mesh_args, start_pair
from tests.support.nodes import MODEL
from tests.support.waiting import eventually

KEYS = {"FAKE_KEY": "sk-cluster"}
QUOTA_RPM = 12


@pytest.fixture(scope="module")
def fakes():
    with started({name: FakeOpenAI(name) for name in ("hot", "spare", "metered")}) as servers:
        yield servers


@pytest.fixture(scope="module")
def engine(log_dir):
    # One request at a time, 0.15 s a token: a few long requests fill its queue (GetLoads reports them waiting).
    engine = EngineProcess(["--batch-size-max", "1", "--itl-base-s", "0.15", "--itl-per-running-s", "0"], log_dir,
                           "routes-engine")
    yield engine
    engine.stop()


@pytest.fixture(scope="module")
def nodes(fakes, engine, log_dir, tmp_path_factory):
    config = tmp_path_factory.mktemp("routes") / "models.toml"
    config.write_text(f"""
[targets.hot]
provider = "openai"
model = "gpt-hot"
base_url = "{fakes['hot'].url}/v1"
credential = "env:FAKE_KEY"

[targets.spare]
provider = "openai"
model = "gpt-spare"
base_url = "{fakes['spare'].url}/v1"
credential = "env:FAKE_KEY"

[targets.metered]
provider = "openai"
model = "gpt-metered"
base_url = "{fakes['metered'].url}/v1"
credential = "env:FAKE_KEY"
rpm = {QUOTA_RPM}

[models.hot]
targets = [{{ target = "hot" }}, {{ target = "spare", priority = 1 }}]

[models.metered]
targets = [{{ target = "metered" }}, {{ target = "spare", priority = 1 }}]

[models.elastic]
targets = [{{ pool = "{MODEL}" }}, {{ target = "spare", priority = 1 }}]
overflow = {{ waiting = 1 }}
""")
    group = start_pair(lambda i, ports: ["--worker-urls", engine.url, "--models-config", str(config),
                                         *mesh_args(i, ports, "r")], log_dir, "routes", count=3, env=KEYS)
    yield group
    for node in group:
        node.stop()


def client(node) -> openai.OpenAI:
    return openai.OpenAI(base_url=node.url + "/v1", api_key="client-key", max_retries=0, timeout=30)


def ask(node, model: str) -> str:
    return client(node).chat.completions.create(model=model, messages=[{"role": "user", "content": "Hi"}],
                                                max_tokens=8).choices[0].message.content


def cooling(node, target: str) -> float:
    """The seconds of ``target``'s cooldown ``node`` knows of (its admin API, as ``smg-node models`` shows it)."""
    return httpx2.get(node.url + "/admin/models", headers=node.admin_headers).json()["targets"][target]["cooldown_s"]


def test_a_cooldown_one_node_starts_is_honoured_by_the_others(nodes, fakes):
    fakes["hot"].failures.append(Failure(429, "slow down", {"retry-after": "60"}))
    assert ask(nodes[0], "hot") == "Hello from spare."  # node 0 met the 429 and fell back
    # The cooldown reaches nodes 1 and 2 (the cluster's document, gossiped), which then skip the target.
    for node in nodes[1:]:
        eventually(lambda node=node: cooling(node, "hot") > 50, 10, "the cooldown did not reach every node")
        assert ask(node, "hot") == "Hello from spare."
    assert len(fakes["hot"].requests) == 1
    metrics = httpx2.get(nodes[2].url + "/metrics").text
    assert 'smg_route_events_total{event="cooling",route="hot",target="hot"}' in metrics


def test_an_accounts_quota_is_held_by_the_whole_cluster(nodes, fakes):
    asked = 3 * QUOTA_RPM
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda i: ask(nodes[i % 3], "metered"), range(asked)))
    # The quota's owner decides every node's requests: the account gets its minute's quota, the rest the spare.
    # A node whose decision did not come back in time (the limiter's forward timeout: a loaded machine) admits
    # from its own share instead, the proportional policy's bound (gateway/providers/quotas.py): at most the
    # other nodes' shares over the quota.
    fallbacks = sum(httpx2.get(node.url + "/admin/rate-limits", headers=node.admin_headers).json()["node"]
                    ["fallback_units"] for node in nodes)
    bound = QUOTA_RPM if fallbacks == 0 else QUOTA_RPM + QUOTA_RPM * (len(nodes) - 1) / len(nodes)
    assert QUOTA_RPM <= len(fakes["metered"].requests) <= bound, (len(fakes["metered"].requests), fallbacks)
    assert answers.count("Hello from metered.") == len(fakes["metered"].requests)
    assert answers.count("Hello from spare.") == asked - len(fakes["metered"].requests)


def test_a_models_config_put_on_one_node_is_every_nodes(nodes, fakes):
    admin = nodes[0].admin_headers
    config = httpx2.get(nodes[0].url + "/admin/models", headers=admin).json()
    assert config["targets"]["hot"]["credential"] == "env:FAKE_KEY" and "sk-cluster" not in str(config)
    new = {"targets": {"spare": {"provider": "openai", "model": "gpt-spare", "base_url": fakes["spare"].url + "/v1",
                                 "credential": "env:FAKE_KEY"}},
           "models": {"brand-new": {"targets": ["spare"]}, "hot": {"targets": ["spare"]},
                      "metered": {"targets": ["spare"]},
                      "elastic": {"targets": [{"pool": MODEL}, {"target": "spare", "priority": 1}],
                                  "overflow": {"waiting": 1}}}}
    refused = httpx2.put(nodes[0].url + "/admin/models", headers=admin, json={"models": {"x": {"targets": ["nope"]}}})
    assert refused.status_code == 400 and "no target named 'nope'" in refused.text
    assert httpx2.put(nodes[0].url + "/admin/models", headers=admin, json=new).status_code == 200
    for node in nodes[1:]:
        eventually(lambda node=node: "brand-new" in {m.id for m in client(node).models.list().data}, 10,
                   "the models config did not reach every node")
    listed = {m.id: m for m in client(nodes[2]).models.list().data}
    assert listed["brand-new"].model_extra["served_by"] == [{"target": "spare", "provider": "openai",
                                                            "model": "gpt-spare"}]
    assert ask(nodes[2], "brand-new") == "Hello from spare."


def test_a_conversation_moves_to_a_provider_and_is_continued_on_another_node(nodes, fakes):
    first = client(nodes[0]).responses.create(model=MODEL, input="Remember 'plum'.", max_output_tokens=4)
    second = client(nodes[1]).responses.create(model="brand-new", previous_response_id=first.id, input="Which word?")
    assert second.output_text == "Hello from spare."
    third = client(nodes[2]).responses.create(model=MODEL, previous_response_id=second.id, input="Again?",
                                              max_output_tokens=4)
    assert third.output_text
    sent = fakes["spare"].requests[-1][2]["messages"]
    assert [m["role"] for m in sent] == ["user", "assistant", "user"] and sent[1]["content"] == first.output_text


def test_a_saturated_pool_overflows_to_the_next_target_and_comes_back_when_it_drains(nodes, fakes):
    node = nodes[0]
    busy = concurrent.futures.ThreadPoolExecutor(4)
    long_ones = [busy.submit(lambda: client(node).chat.completions.create(
        model="elastic", messages=[{"role": "user", "content": "a long one"}], max_tokens=24)) for _ in range(4)]

    def overflows() -> bool:
        # A look made before the node's load poll has seen the queue goes to the pool and would wait behind the
        # long ones past the saturated window: it is abandoned after 2 s (the node cancels it) and looked again.
        try:
            return openai.OpenAI(base_url=node.url + "/v1", api_key="client-key", max_retries=0,
                                 timeout=2).chat.completions.create(
                model="elastic", messages=[{"role": "user", "content": "Hi"}], max_tokens=2
            ).choices[0].message.content == "Hello from spare."
        except openai.APITimeoutError:
            return False

    # With one running and the others waiting, a new request for the route goes to its next target.
    eventually(overflows, 20, "no request overflowed", interval_s=0.2)
    served = [future.result(60).model for future in long_ones]
    assert MODEL in served and set(served) <= {MODEL, "gpt-spare"}  # the first by the pool, later ones maybe not
    busy.shutdown()
    # Drained: the pool answers again (its next load poll shows nobody waiting).
    eventually(lambda: client(node).chat.completions.create(
        model="elastic", messages=[{"role": "user", "content": "Hi"}], max_tokens=2).model == MODEL, 20,
        "the pool did not take requests again")
    metrics = httpx2.get(node.url + "/metrics").text
    assert f'smg_route_events_total{{event="overflow",route="elastic",target="pool:{MODEL}"}}' in metrics

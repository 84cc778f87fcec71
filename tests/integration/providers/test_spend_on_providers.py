"""Spend on provider targets (issue 63): each answer's cost is its provider's usage times its target's prices
(cached input and reasoning at their own), streamed and not, on OpenAI's and Anthropic's wires, in the ledger by
target and in ``x-smg-cost``; a key's budget reserves and refuses on a provider's price too."""

from __future__ import annotations

import httpx2
import openai
import pytest

from tests.support.fake_providers import FakeAnthropic, FakeOpenAI, Reply, routed_node, started
from tests.support.waiting import eventually

KEYS = {"FAKE_KEY": "sk-fake-secret"}
GPT = {"input": 2.0, "cached_input": 0.5, "output": 10.0, "reasoning": 20.0}  # dollars per million tokens
CLAUDE = {"input": 3.0, "cached_input": 0.3, "output": 15.0}
USAGE = dict(prompt_tokens=1000, completion_tokens=500, cached_tokens=400, reasoning_tokens=200)


@pytest.fixture(scope="module")
def fakes():
    with started({"gpt": FakeOpenAI("gpt"), "claude": FakeAnthropic("claude")}) as servers:
        yield servers


def prices(table: dict) -> str:
    return "{ " + ", ".join(f"{k} = {v}" for k, v in table.items()) + " }"


@pytest.fixture(scope="module")
def node(fakes, log_dir, tmp_path_factory):
    node = routed_node(f"""
[targets.gpt]
provider = "openai"
model = "gpt-fake"
base_url = "{fakes['gpt'].url}/v1"
credential = "env:FAKE_KEY"
price_usd_per_mtok = {prices(GPT)}
price_usd_per_request = 0.001

[targets.claude]
provider = "anthropic"
model = "claude-fake"
base_url = "{fakes['claude'].url}"
credential = "env:FAKE_KEY"
price_usd_per_mtok = {prices(CLAUDE)}

[models.priced]
targets = ["gpt"]

[models.sonnet]
targets = ["claude"]
""", tmp_path_factory.mktemp("spend-routes"), log_dir, "spend-providers-node", KEYS,
                       ("--cost-header", "--spend-push-interval-ms", "100", "--workers", "1"))
    yield node
    node.stop()


def gpt_cost() -> float:
    u = USAGE
    return ((u["prompt_tokens"] - u["cached_tokens"]) * GPT["input"] + u["cached_tokens"] * GPT["cached_input"]
            + (u["completion_tokens"] - u["reasoning_tokens"]) * GPT["output"]
            + u["reasoning_tokens"] * GPT["reasoning"]) / 1e6 + 0.001


def claude_cost() -> float:
    u = USAGE  # Anthropic has no reasoning count apart: all output at the output price
    return ((u["prompt_tokens"] - u["cached_tokens"]) * CLAUDE["input"] + u["cached_tokens"] * CLAUDE["cached_input"]
            + u["completion_tokens"] * CLAUDE["output"]) / 1e6


def by_target(node) -> dict:
    rows = httpx2.get(node.url + "/admin/spend?group_by=target", headers=node.admin_headers, timeout=10).json()
    return {row["target"]: row for row in rows["data"]}


def test_answers_of_provider_targets_cost_their_usage_at_their_targets_prices(node, fakes, oai, ant):
    fakes["gpt"].reply = lambda body: Reply(content="priced answer", **USAGE)
    fakes["claude"].reply = lambda body: Reply(content="priced answer", prompt_tokens=USAGE["prompt_tokens"],
                                               completion_tokens=USAGE["completion_tokens"],
                                               cached_tokens=USAGE["cached_tokens"])
    before = by_target(node)
    raw = oai.chat.completions.with_raw_response.create(model="priced", max_tokens=600,
                                                         messages=[{"role": "user", "content": "hi"}])
    assert float(raw.headers["x-smg-cost"]) == pytest.approx(gpt_cost())
    assert raw.parse().usage.prompt_tokens == 1000
    chunks = list(oai.chat.completions.create(model="priced", max_tokens=600, stream=True,
                                               stream_options={"include_usage": True},
                                               messages=[{"role": "user", "content": "hi"}]))
    assert chunks[-1].usage.completion_tokens == 500
    message = ant.messages.create(model="sonnet", max_tokens=600, messages=[{"role": "user", "content": "hi"}])
    assert message.usage.output_tokens == 500
    with ant.messages.stream(model="sonnet", max_tokens=600, messages=[{"role": "user", "content": "hi"}]) as s:
        s.get_final_message()

    def counted() -> bool:
        after = by_target(node)
        gained = {t: after[t]["cost_usd"] - before.get(t, {}).get("cost_usd", 0.0) for t in ("gpt", "claude")}
        return gained["gpt"] == pytest.approx(2 * gpt_cost()) and gained["claude"] == pytest.approx(2 * claude_cost())

    eventually(counted, 10, "the ledger's cost by target")


def test_a_keys_budget_refuses_a_request_a_provider_would_charge_past_it(node, fakes):
    admin = node.admin_headers
    created = httpx2.post(node.url + "/admin/api-keys", headers=admin, timeout=10, json={
        "name": "capped", "budget": {"amount_usd": 0.01, "period": "day"}}).json()
    client = openai.OpenAI(base_url=node.url + "/v1", api_key=created["key"], max_retries=0)
    fakes["gpt"].reply = lambda body: Reply(content="x", prompt_tokens=10, completion_tokens=5)
    # At most 2 + 4000 * 20 / 1e6 + 0.001 dollars: more than the whole budget.
    with pytest.raises(openai.RateLimitError) as refused:
        client.chat.completions.create(model="priced", max_tokens=4000, messages=[{"role": "user", "content": "hi"}])
    assert refused.value.body["code"] == "budget_exceeded" and "Lower max_tokens" in refused.value.body["message"]
    assert fakes["gpt"].requests == []  # refused before anything was sent
    answer = client.chat.completions.create(model="priced", max_tokens=100, messages=[{"role": "user",
                                                                                       "content": "hi"}])
    assert answer.choices[0].message.content == "x"
    # The key was charged the answer's real cost, not its reservation.
    real = (10 * GPT["input"] + 5 * GPT["output"]) / 1e6 + 0.001

    def charged() -> bool:
        rows = httpx2.get(node.url + f"/admin/spend?group_by=key&key={created['id']}", headers=admin,
                          timeout=10).json()["data"]
        return len(rows) == 1 and rows[0]["cost_usd"] == pytest.approx(real)

    eventually(charged, 10, "the key's real cost in the ledger")
    budgets = httpx2.get(node.url + "/admin/budgets", headers=admin, timeout=10).json()["budgets"]
    # What this node last saw of it: the answered request's reservation (its settlement is not answered back).
    assert 0 < budgets[0]["spent_ratio_seen"] < 1

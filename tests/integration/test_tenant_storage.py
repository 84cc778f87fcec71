"""Issue 33's storage attacks, performed against a real node with the openai SDK and raw HTTP: one tenant flooding
the memory store, chains that repeated themselves, writes that went around the rate limits, background responses
that held every slot. Each test fails on the code before the fixes."""

from __future__ import annotations

import re

import httpx2
import openai
import pytest

from chaos.processes import EngineProcess, NodeProcess

MODEL = "qwen3-sim"
KEY_A, KEY_B, KEY_C = "sk-tenant-a-0123456789abcdef", "sk-tenant-b-0123456789abcdef", "sk-tenant-c-0123456789abcdef"
# Tenant c is rate limited: 6 requests a minute, whatever they are.
LIMITS_TOML = """
[[limits]]
name = "c-requests"
scope = "tenant"
match = "c"
limit = 6
window_s = 60
"""


@pytest.fixture(scope="module")
def node(log_dir, tmp_path_factory):
    limits = tmp_path_factory.mktemp("limits") / "limits.toml"
    limits.write_text(LIMITS_TOML)
    # Slow tokens (50 ms) so that background responses are still running while the test looks at them.
    engine = EngineProcess(["--itl-base-s", "0.05", "--itl-per-running-s", "0", "--prefill-s-per-token", "0.000001"],
                           log_dir, "tenant-storage-engine")
    n = NodeProcess(["--worker-urls", engine.url, "--tenant-api-key", f"a:{KEY_A}", f"b:{KEY_B}", f"c:{KEY_C}",
                     "--history-memory-max-bytes", str(24 * 1024 * 1024), "--history-record-max-bytes", "600000",
                     "--max-concurrent-requests", "4", "--rate-limits", str(limits), "--max-payload-size", "2000000"],
                    log_dir, "tenant-storage-node")
    yield n
    n.stop()
    engine.stop()


def _client(node, key):
    return openai.OpenAI(base_url=node.url + "/v1", api_key=key, max_retries=0, timeout=60)


def _http(node, key):
    return httpx2.Client(base_url=node.url, headers={"authorization": f"Bearer {key}"}, timeout=60)


def _metric(node, name: str, labels: str = "") -> float:
    text = httpx2.get(node.url + "/metrics", timeout=10).text
    match = re.search(rf"^{re.escape(name)}{re.escape(labels)} ([0-9.e+]+)$", text, re.M)
    return float(match.group(1)) if match else 0.0


def _big_items(count: int, chars: int) -> list[dict]:
    return [{"type": "message", "role": "user", "content": "x" * chars} for _ in range(count)]


def test_one_tenant_flooding_the_store_is_refused_and_evicts_nobody(node):
    victim = _client(node, KEY_B)
    kept = victim.responses.create(model=MODEL, input="keep me", max_output_tokens=2)
    conversation = victim.conversations.create(items=[{"type": "message", "role": "user", "content": "mine"}])
    refused = 0
    with _http(node, KEY_A) as flood:
        for _ in range(40):  # ~0.45 MB each: 18 MB offered, against a node of 24 MiB (a tenant: 6 MiB)
            r = flood.post("/v1/conversations", json={"items": _big_items(10, 45_000)})
            if r.status_code == 429:
                refused += 1
                assert r.json()["error"]["type"] == "insufficient_quota"
                assert r.json()["error"]["code"] == "storage_quota_exceeded"
            else:
                assert r.status_code == 200, r.text
    assert refused >= 25
    assert victim.responses.retrieve(kept.id).id == kept.id
    assert victim.conversations.retrieve(conversation.id).id == conversation.id
    assert _metric(node, "smg_history_bytes") <= 24 * 1024 * 1024


def test_a_record_over_its_bound_is_413_before_it_is_stored(node):
    with _http(node, KEY_A) as http:
        r = http.post("/v1/conversations", json={"items": _big_items(2, 400_000)})
    assert r.status_code == 413 and r.json()["error"]["code"] == "record_too_large"


def test_a_chain_is_stored_once_not_repeated_in_every_turn(node):
    """Issue 33: a 12-turn previous_response_id chain grew the store by 81 MB: each turn repeated the chain."""
    client = _client(node, KEY_B)
    before = _metric(node, "smg_history_bytes")
    previous, turn_chars, first_input_tokens = None, 8_000, None
    for turn in range(12):
        response = client.responses.create(model=MODEL, input=f"turn {turn} " + "word " * (turn_chars // 5),
                                           previous_response_id=previous, max_output_tokens=2)
        first_input_tokens = first_input_tokens or response.usage.input_tokens
        previous = response.id
    grown = _metric(node, "smg_history_bytes") - before
    assert grown < 2 * 12 * turn_chars  # each turn once (it was 6.5x that: the sum of every prefix)
    assert response.usage.input_tokens > 11 * first_input_tokens  # and the whole chain still reached the model


def test_conversation_writes_count_against_the_rate_limits(node):
    with _http(node, KEY_C) as http:
        statuses = [http.post("/v1/conversations", json={}).status_code for _ in range(8)]
        assert statuses[:6] == [200] * 6 and statuses[6:] == [429, 429]
        # A background response past the limit is refused before it is stored (it was stored, then refused).
        stored_before = _metric(node, "smg_history_records", '{kind="response"}')
        r = http.post("/v1/responses", json={"model": MODEL, "input": "hi", "background": True})
        assert r.status_code == 429 and r.json()["error"]["code"] == "rate_limit_exceeded"
        assert _metric(node, "smg_history_records", '{kind="response"}') == stored_before


def test_background_responses_hold_at_most_their_tenants_share_of_the_slots(node):
    """Issue 33: a tenant filled every generation slot with background POSTs; others got 429 queue_full."""
    flood = _client(node, KEY_A)
    accepted, refused = [], 0
    for _ in range(6):
        try:
            accepted.append(flood.responses.create(model=MODEL, input="long", background=True,
                                                   max_output_tokens=200).id)
        except openai.RateLimitError as e:
            refused += 1
            assert e.code == "too_many_background_responses"
    # --max-concurrent-requests 4: a tenant's share is 2 running; at most that many in progress.
    assert len(accepted) == 2 and refused == 4
    other = _client(node, KEY_B).chat.completions.create(
        model=MODEL, max_tokens=2, messages=[{"role": "user", "content": "still served"}])
    assert other.choices[0].finish_reason == "length"
    for response_id in accepted:
        flood.responses.cancel(response_id)


def test_a_single_user_node_without_keys_keeps_its_newest_responses_rather_than_refusing(log_dir):
    """No key required: every client is the same owner. A quarter of the node for it refused every stored write
    past 2,500 responses (here 2 of 8) with 429; now the node's bound applies and its oldest responses go."""
    engine = EngineProcess([], log_dir, "open-plane-engine")
    n = NodeProcess(["--worker-urls", engine.url, "--history-memory-max-responses", "8"], log_dir, "open-plane-node")
    try:
        client = openai.OpenAI(base_url=n.url + "/v1", api_key="unused", max_retries=0, timeout=60)
        made = [client.responses.create(model=MODEL, input=f"turn {i}", max_output_tokens=2) for i in range(12)]
        follow_up = client.responses.create(model=MODEL, input="and then?", max_output_tokens=2,
                                            previous_response_id=made[-1].id)
        assert follow_up.previous_response_id == made[-1].id and follow_up.output  # its chain was found
        for old in made[:5]:  # 13 stored against a bound of 8: the 5 least recently used went
            with pytest.raises(openai.NotFoundError):
                client.responses.retrieve(old.id)
        assert [client.responses.retrieve(r.id).id for r in made[5:]] == [r.id for r in made[5:]]
    finally:
        n.stop()
        engine.stop()

"""Client authentication end to end with the openai SDK: API keys, tenants, roles, the audit log."""

from __future__ import annotations

import json

import httpx2
import openai
import pytest

from chaos.processes import NodeProcess

from tests.support.nodes import MODEL
from tests.support.waiting import eventually

USER_KEY = "sk-user-0123456789"
TENANT_KEY = "sk-acme-0123456789"
OPS_KEY = "sk-ops-admin-0123456789"
READER_KEY = "sk-reader-0123456789"


@pytest.fixture(scope="module")
def keyed_node(engines, log_dir):
    n = NodeProcess(["--worker-urls", engines[0].url, "--api-key", USER_KEY, "--tenant-api-key", f"acme:{TENANT_KEY}",
                     "--control-plane-api-keys", f"ops:Operations:admin:{OPS_KEY}", f"ro:Reader:user:{READER_KEY}",
                     "--control-plane-audit-enabled", "--log-json"], log_dir, "keyed-node")
    yield n
    n.stop()


def sdk(node, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=node.url + "/v1", api_key=key, max_retries=0, timeout=30)


def ask(client: openai.OpenAI) -> str:
    return client.chat.completions.create(model=MODEL, max_tokens=3,
                                          messages=[{"role": "user", "content": "hi"}]).choices[0].message.content


def test_inference_needs_a_known_key(keyed_node):
    with pytest.raises(openai.AuthenticationError) as e:
        ask(sdk(keyed_node, "sk-guessed-0123456789"))
    assert e.value.code == "invalid_api_key"
    assert e.value.response.headers["www-authenticate"] == 'Bearer realm="smg-node", error="invalid_token"'
    r = httpx2.post(keyed_node.url + "/v1/chat/completions", json={"model": MODEL, "messages": []})
    assert r.status_code == 401 and r.json()["error"]["code"] == "missing_api_key"
    assert r.headers["www-authenticate"] == 'Bearer realm="smg-node"'
    for key in (USER_KEY, TENANT_KEY, READER_KEY, OPS_KEY):
        assert ask(sdk(keyed_node, key))
    assert [m.id for m in sdk(keyed_node, USER_KEY).models.list().data] == [MODEL]
    # x-api-key (Anthropic's header) is the same credential.
    r = httpx2.post(keyed_node.url + "/v1/tokenize", json={"model": MODEL, "prompt": "x"},
                    headers={"x-api-key": USER_KEY})
    assert r.status_code == 200
    assert httpx2.get(keyed_node.url + "/health").status_code == 200  # probes need no key


def test_the_control_plane_needs_the_admin_role(keyed_node):
    for key in (USER_KEY, TENANT_KEY, READER_KEY):
        r = httpx2.get(keyed_node.url + "/workers", headers={"authorization": f"Bearer {key}"})
        assert r.status_code == 403 and r.json()["error"]["code"] == "insufficient_role", r.text
    assert httpx2.get(keyed_node.url + "/workers", headers={"authorization": f"Bearer {OPS_KEY}"}).status_code == 200


def test_rate_limits_count_the_credential_not_the_headers_it_chose(keyed_node):
    ops = {"authorization": f"Bearer {OPS_KEY}"}
    limits = {"failure_policy": "open", "limits": [
        {"name": "per-tenant", "scope": "tenant", "unit": "requests", "limit": 2, "window_s": 3600}]}
    assert httpx2.put(keyed_node.url + "/admin/rate-limits", json=limits, headers=ops).status_code == 200
    try:
        tenant = sdk(keyed_node, TENANT_KEY)
        ask(tenant)
        ask(tenant)
        # A third request under another tenant's header still counts against acme, the key's tenant.
        spoofing = openai.OpenAI(base_url=keyed_node.url + "/v1", api_key=TENANT_KEY, max_retries=0,
                                 default_headers={"x-smg-tenant": "someone-else"})
        with pytest.raises(openai.RateLimitError):
            ask(spoofing)
        # A key without a tenant is not limited by the tenant limit, whatever header it sends.
        user = openai.OpenAI(base_url=keyed_node.url + "/v1", api_key=USER_KEY, max_retries=0,
                             default_headers={"x-smg-tenant": "acme"})
        for _ in range(3):
            ask(user)
    finally:
        httpx2.put(keyed_node.url + "/admin/rate-limits", json={"limits": []}, headers=ops)


def _audit_entries(node) -> list[dict]:
    entries = []
    for line in node.log_text().splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if record.get("logger") == "gateway.audit":
            entries.append(json.loads(record["msg"]))
    return entries


def test_every_control_plane_change_is_audited(keyed_node):
    httpx2.put(keyed_node.url + "/admin/rate-limits", json={"limits": []},
               headers={"authorization": f"Bearer {OPS_KEY}"})
    httpx2.delete(keyed_node.url + "/workers/w-000000000000", headers={"authorization": f"Bearer {USER_KEY}"})
    # The node's log reaches us through a pipe and a copying thread: the lines come a moment after the
    # answers. Read until both entries are there, for a bounded time.
    def both_logged():
        found = _audit_entries(keyed_node)
        wanted = {"PUT /admin/rate-limits", "DELETE /workers/w-000000000000"}
        return found if wanted <= {e["action"] for e in found} else None

    entries = eventually(both_logged, 10, "both control-plane changes in the audit log")
    done = [e for e in entries if e["action"] == "PUT /admin/rate-limits" and e["who"] == "key:ops"]
    assert done and done[-1]["status"] == 200 and done[-1]["from"].startswith("127.0.0.1:")
    refused = [e for e in entries if e["action"] == "DELETE /workers/w-000000000000"]
    assert refused and refused[-1]["status"] == 403 and refused[-1]["outcome"] == "refused"

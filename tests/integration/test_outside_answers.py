"""Issue 59: an MCP server's answer is bounded as it arrives. Before, a tool call whose server answered with chunked
JSON that never ends took a node from 1.0 to 6.7 GiB and stalled every other request for 45 s; a 400 MiB answer
with a Content-Length, +2.2 GiB; a tool list of 200,000 small tools (~10 MB) stalled every request for 7.4 s.

Each attack is performed by a server of the test's own (tests/integration/hostile_servers.py) against a real node:
the call or the list fails with an error naming the bound, the node's memory stays where it was, and another
tenant's request, sent while the attack runs, is answered at once."""

from __future__ import annotations

import json
import sys
import threading
import time
from pathlib import Path

import httpx2
import openai
import pytest

from chaos.processes import EngineProcess, NodeProcess

from tests.support.hostile_servers import HostileMcpServer
from tests.support.waiting import eventually

MODEL = "qwen3-sim"
HOST = "127.0.0.2"
KEY_A, KEY_B = "sk-tenant-a-0123456789abcdef", "sk-tenant-b-0123456789abcdef"
ANSWER_BYTES = 1024 * 1024  # the default --mcp-max-answer-bytes
GROWTH_MAX = 150 * 2 ** 20  # a node that buffered any of these answers grows by hundreds of MiB to GiB
OTHER_TENANT_S = 3.0  # another tenant's request while the attack runs (45 s before)

RULES = [
    ("(?s)flood it.*<tool_response>", "Done."),
    ("flood it", '<tool_call>\n{"name": "flood", "arguments": {}}\n</tool_call>'),
    ("hello", "Hi."),
]


@pytest.fixture(scope="module")
def hostile():
    server = HostileMcpServer(HOST)
    yield server
    server.close()


STDIO_SCRIPT = Path(__file__).parents[1] / "support" / "hostile_stdio.py"


@pytest.fixture(scope="module")
def node(log_dir, tmp_path_factory):
    folder = tmp_path_factory.mktemp("outside")
    script = folder / "answers.jsonl"
    script.write_text("".join(json.dumps({"match": m, "output": o}) + "\n" for m, o in RULES))
    servers = folder / "mcp.toml"  # the operator's stdio servers, one per way to answer
    servers.write_text("".join(f'[servers.stdio-{mode}]\ntransport = "stdio"\ncommand = "{sys.executable}"\n'
                               f'args = ["{STDIO_SCRIPT}", "{mode}"]\n\n' for mode in ("endless", "parts", "ok")))
    engine = EngineProcess(["--zero-cost", "--script", str(script)], log_dir, "outside-engine")
    n = NodeProcess(["--worker-urls", engine.url, "--mcp-allowed-hosts", f"{HOST}/32", "--mcp-call-timeout-secs",
                     "30", "--mcp-config-path", str(servers), "--tenant-api-key", f"a:{KEY_A}", f"b:{KEY_B}"],
                    log_dir, "outside-node")
    yield n
    n.stop()
    engine.stop()


def _rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        return next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmRSS:"))


def _tools(url: str) -> list[dict]:
    if url.startswith("stdio-"):  # a server the operator configured, by name
        return [{"type": "mcp", "server_label": url, "require_approval": "never"}]
    return [{"type": "mcp", "server_label": "hostile", "server_url": url, "require_approval": "never"}]


def _other_tenant_seconds(node) -> float:
    started = time.monotonic()
    r = httpx2.post(node.url + "/v1/chat/completions", headers={"authorization": f"Bearer {KEY_B}"}, timeout=60,
                    json={"model": MODEL, "messages": [{"role": "user", "content": "hello"}], "max_tokens": 4})
    assert r.status_code == 200, r.text
    return time.monotonic() - started


def _attack(node, hostile, path: str) -> tuple[dict, float, int]:
    """Tenant A's response whose tool runs on ``path``; tenant B's latency while it ran; the node's growth."""
    client = openai.OpenAI(base_url=node.url + "/v1", api_key=KEY_A, max_retries=0, timeout=120)
    _other_tenant_seconds(node)  # warm
    before = _rss_bytes(node.process.pid)
    done: dict = {}
    thread = threading.Thread(target=lambda: done.update(
        response=client.responses.create(model=MODEL, input="Please flood it", tools=_tools(path if path.startswith("stdio-") else hostile.url(path)))))
    thread.start()
    eventually(lambda: hostile.calls[path] or hostile.sent["/tools"] or not thread.is_alive() or "stdio" in path,
               60, "the tool was never called", interval_s=0.01)
    other_s = _other_tenant_seconds(node)
    thread.join(120)
    assert not thread.is_alive(), "the attacked response never ended"
    response = done["response"]
    return {**response.model_dump(), "output_text": response.output_text}, other_s, _rss_bytes(node.process.pid) - before


@pytest.mark.parametrize("path, says", [
    ("/endless", f"sent an answer of more than {ANSWER_BYTES} bytes (--mcp-max-answer-bytes)"),
    ("/huge", f"answered {400 << 20} bytes, more than {ANSWER_BYTES} (--mcp-max-answer-bytes)"),
    ("/sse-endless", f"sent an event of more than {ANSWER_BYTES} bytes (--mcp-max-answer-bytes)"),
    ("/gzip", "sent a gzip-encoded answer"),
    ("/parts", "answered 30000 content items in one message; at most 1024 are read"),
    ("stdio-endless", f"sent a message of more than {ANSWER_BYTES} bytes (--mcp-max-answer-bytes)"),
    ("stdio-parts", "answered 30000 content items in one message; at most 1024 are read"),
])
def test_a_tool_answer_past_its_bound_fails_the_call_without_taking_the_node(node, hostile, path, says):
    response, other_s, grown = _attack(node, hostile, path)
    call = next(item for item in response["output"] if item["type"] == "mcp_call")
    assert call["error"]["type"] == "http_error" and call["error"]["code"] == 502, call["error"]
    label = path if path.startswith("stdio-") else "hostile"
    assert says in call["error"]["message"] and f"'{label}'" in call["error"]["message"]
    assert response["output_text"] == "Done."  # the model was told, and answered
    assert grown < GROWTH_MAX, f"the node grew {grown / 2 ** 20:.0f} MiB"
    assert other_s < OTHER_TENANT_S, f"another tenant waited {other_s:.1f} s"
    # What the node read of an endless answer is about the bound, not what the server could send.
    if path in ("/endless", "/sse-endless"):
        assert hostile.sent[path] < 64 * ANSWER_BYTES


def test_a_tool_list_past_its_bound_is_an_error_item_and_costs_no_stall(node, hostile):
    response, other_s, grown = _attack(node, hostile, "/tools")
    listing = next(item for item in response["output"] if item["type"] == "mcp_list_tools")
    assert "sent an answer of more than 262144 bytes (--mcp-max-output-bytes x 4)" in listing["error"], listing["error"]
    assert hostile.sent["/tools"] < 64 * ANSWER_BYTES
    assert grown < GROWTH_MAX and other_s < OTHER_TENANT_S, (grown, other_s)


@pytest.mark.parametrize("where", ["/ok", "stdio-ok"])
def test_an_honest_server_still_answers(node, hostile, where):
    client = openai.OpenAI(base_url=node.url + "/v1", api_key=KEY_A, max_retries=0, timeout=60)
    url = where if where.startswith("stdio-") else hostile.url(where)
    response = client.responses.create(model=MODEL, input="Please flood it", tools=_tools(url))
    call = next(item for item in response.output if item.type == "mcp_call")
    assert call.output == "fine" and call.error is None and response.output_text == "Done."

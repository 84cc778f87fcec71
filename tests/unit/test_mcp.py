"""MCP tools without sockets: the operator's servers file, a request's tool filters and approvals, outputs bounded,
and the session pool's bounds on virtual time (a fake SDK session stands in for a server: what the pool does with
a server that hangs, dies, or is never used again)."""

from __future__ import annotations

import contextlib
import types

import pytest
import trio

from gateway.api.errors import BadRequest
from gateway.api.mcp_tools import HostedServer, HostedTools, ToolFilter, _approval, _headers, without_secrets
from gateway.base.errors import Overloaded
from gateway.mcp.config import McpConfig
from gateway.mcp.results import CallOutcome, ToolInfo, bounded, content_text
from gateway.mcp.servers import ServerConfigError, parse_servers
from gateway.mcp.sessions import McpSessions, McpUnavailable, ServerRef

# -- the servers file ---------------------------------------------------------------------------------------


def test_servers_parse_with_the_environment_and_keep_their_secrets_out_of_repr():
    document = {"servers": {
        "search": {"url": "https://search.internal/mcp", "headers": {"Authorization": "Bearer ${TOKEN}"},
                   "allowed_tools": ["search"], "tenants": ["a"], "builtin": "web_search_preview"},
        "files": {"transport": "stdio", "command": "python", "args": ["-m", "files"], "env": {"ROOT": "/srv/${WHO}"}}}}
    servers = parse_servers(document, {"TOKEN": "t0k3n", "WHO": "me"})
    search, files = servers["search"], servers["files"]
    assert search.transport == "streamable_http" and search.headers == (("Authorization", "Bearer t0k3n"),)
    assert files.env == (("ROOT", "/srv/me"),) and files.args == ("-m", "files")
    assert search.usable_by("a") and not search.usable_by("b") and not search.usable_by(None)
    assert files.usable_by(None) and files.usable_by("b")
    assert "t0k3n" not in repr(search) and "t0k3n" not in repr(servers)


@pytest.mark.parametrize("servers, message", [
    ({"x": {"url": "https://a/mcp", "color": "red"}}, "unknown keys color"),
    ({"x": {"url": "https://a/mcp", "headers": {"A": "${MISSING}"}}}, "MISSING., which is not set"),
    ({"x": {"transport": "stdio"}}, "a stdio server has a command"),
    ({"x": {"transport": "stdio", "command": "p", "url": "https://a"}}, "a stdio server has a command"),
    ({"x": {"url": "ftp://a/mcp"}}, "an http(s) url"),
    ({"x": {"transport": "carrier-pigeon", "url": "https://a"}}, "transport is one of"),
    ({"x": {"url": "https://a", "builtin": "web_search"}, "y": {"url": "https://b", "builtin": "web_search"}},
     "served by x already"),
    ({"x": {"url": "https://a", "builtin": "code_interpreter"}}, "builtin is one of"),
    ({"bad name!": {"url": "https://a"}}, "1-64 letters"),
    ({"x": {"url": "https://a", "tenants": "a"}}, "tenants must be a list"),
])
def test_a_bad_servers_file_says_what_is_wrong(servers, message):
    with pytest.raises(ServerConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        parse_servers({"servers": servers}, {})
    with pytest.raises(ServerConfigError, match="one table 'servers'"):
        parse_servers({"server": {}}, {})


# -- a request's tools ---------------------------------------------------------------------------------------

ADD = ToolInfo("add", "Add", {"type": "object"}, {"readOnlyHint": True})
DROP = ToolInfo("drop_table", "Drop", {"type": "object"})


def server(label: str = "db", **fields) -> HostedServer:
    return HostedServer(label, ServerRef(label, "streamable_http", "https://db.example.com/mcp"), **fields)


def test_filters_and_approvals_as_openai_defines_them():
    assert ToolFilter(frozenset({"add"})).matches(ADD) and not ToolFilter(frozenset({"add"})).matches(DROP)
    assert ToolFilter(read_only=True).matches(ADD) and not ToolFilter(read_only=True).matches(DROP)
    assert server().needs_approval(ADD)  # OpenAI's default: ask
    assert not server(approval="never").needs_approval(DROP)
    approval, always, never = _approval({"never": {"read_only": True}}, "tools[0].require_approval")
    filtered = server(approval=approval, always=always, never=never)
    assert not filtered.needs_approval(ADD) and filtered.needs_approval(DROP)  # neither filter: ask
    approval, always, never = _approval({"always": {"tool_names": ["drop_table"]}}, "r")
    assert server(approval=approval, always=always, never=never).needs_approval(ADD)  # still asked by default
    for bad in ("sometimes", {"maybe": {}}, {"always": "x"}, {"never": {"tool_names": "add"}}):
        with pytest.raises(BadRequest):
            _approval(bad, "tools[0].require_approval")


def test_which_tools_the_model_sees_and_names_that_clash():
    hosted = HostedTools([server("db", allowed=ToolFilter(frozenset({"add"}))), server("ops")])
    hosted.add(hosted.servers[0], [ADD, DROP], set())
    assert list(hosted.tools) == ["add"]  # allowed_tools
    with pytest.raises(BadRequest, match="offered by the MCP server 'ops' and by 'db'"):
        hosted.add(hosted.servers[1], [ADD], set())
    with pytest.raises(BadRequest, match="and by a function tool"):
        HostedTools([server()]).add(server(), [ADD], {"add"})
    configured = server(configured_tools=frozenset({"drop_table"}), allowed=ToolFilter(frozenset({"add"})))
    assert not configured.offers(ADD) and not configured.offers(DROP)  # the operator's list and the client's
    assert hosted.function_tools() == [{"type": "function", "function": {
        "name": "add", "description": "Add", "parameters": {"type": "object"}}}]


def test_client_headers_are_bounded_and_never_shown():
    assert _headers({"X-Key": "1"}, "tok", "tools[0]") == (("Authorization", "Bearer tok"), ("X-Key", "1"))
    assert _headers({"authorization": "Basic x"}, "tok", "tools[0]") == (("authorization", "Basic x"),)
    for bad in ({"X": "a\r\nInjected: yes"}, {"X": 1}, {f"H{i}": "v" for i in range(40)}, "a=b"):
        with pytest.raises(BadRequest):
            _headers(bad, None, "tools[0]")
    tools = [{"type": "mcp", "server_label": "x", "headers": {"Authorization": "secret"}, "authorization": "t"},
             {"type": "function", "name": "f", "headers": "kept: not an mcp tool"}]
    assert without_secrets(tools) == [{"type": "mcp", "server_label": "x"}, tools[1]]


def test_outputs_are_cut_on_a_character_and_say_so():
    assert bounded("short", 10) == "short"
    cut = bounded("é" * 100, 11)  # two bytes a character: 5 whole characters fit
    assert cut.startswith("é" * 5 + "\n[... ") and "190 more bytes cut" in cut
    assert content_text([{"type": "text", "text": "a"}, {"type": "image", "mimeType": "image/png", "data": "..."},
                         {"type": "resource", "resource": {"uri": "file:///x", "text": "inside"}}], 100) == \
        "a\n[image (image/png)]\ninside"
    assert CallOutcome(error={"type": "http_error", "code": 504, "message": "late"}).for_model() == "Error: late"


# -- the session pool ------------------------------------------------------------------------------------------

class FakeServer:
    """What the fake SDK's sessions answer: tools, and per call a delay (or forever), a failure."""

    def __init__(self) -> None:
        self.opened = 0
        self.closed = 0
        self.hang = False
        self.broken = False

    def sdk(self) -> types.SimpleNamespace:
        fake = self

        class Session:
            def __init__(self, read, write) -> None:
                pass

            async def __aenter__(self):
                return self

            async def __aexit__(self, *exc) -> None:
                fake.closed += 1

            async def initialize(self) -> None:
                fake.opened += 1

            async def list_tools(self, cursor=None):
                tool = types.SimpleNamespace(name="add", description="Add", input_schema={"type": "object"},
                                             annotations=None)
                return types.SimpleNamespace(tools=[tool], next_cursor=None)

            async def call_tool(self, name, arguments):
                if fake.hang:
                    await trio.sleep_forever()
                if fake.broken:
                    raise RuntimeError("connection lost")
                return types.SimpleNamespace(content=[types.SimpleNamespace(
                    model_dump=lambda **_: {"type": "text", "text": str(sum(arguments.values()))})],
                    structured_content=None, is_error=False)

        @contextlib.asynccontextmanager
        async def transport(*args, **kwargs):
            yield None, None

        return types.SimpleNamespace(ClientSession=Session, McpError=type("McpError", (Exception,), {}),
                                     streamable_http_client=transport, sse_client=transport, stdio_client=transport,
                                     StdioServerParameters=dict, default_environment=dict)


def ref(n: int = 0, scope: str = "me") -> ServerRef:
    return ServerRef(f"s{n}", "streamable_http", f"https://s{n}.example.com/mcp", pinned=False, scope=scope)


async def pool(nursery, server: FakeServer, **config) -> McpSessions:
    sessions = McpSessions(McpConfig(**config))
    sessions._sdk = server.sdk()
    await nursery.start(sessions.run)
    return sessions


async def test_a_session_is_reused_then_closed_when_idle(autojump_clock):
    server = FakeServer()
    async with trio.open_nursery() as nursery:
        sessions = await pool(nursery, server, session_idle_s=60)
        assert [t.name for t in await sessions.list_tools(ref())] == ["add"]
        assert (await sessions.call(ref(), "add", {"a": 2, "b": 3})).output == "5"
        assert server.opened == 1  # one handshake for both
        await trio.sleep(59)
        assert server.closed == 0
        await trio.sleep(2)
        assert server.closed == 1  # idle past session_idle_s: closed by the janitor
        assert (await sessions.call(ref(), "add", {"a": 1, "b": 1})).output == "2"
        assert server.opened == 2
        nursery.cancel_scope.cancel()


async def test_a_hanging_call_costs_the_timeout_and_the_session(autojump_clock):
    server = FakeServer()
    async with trio.open_nursery() as nursery:
        sessions = await pool(nursery, server, call_timeout_s=5)
        server.hang = True
        started = trio.current_time()
        outcome = await sessions.call(ref(), "add", {"a": 1})
        assert outcome.error["code"] == 504 and trio.current_time() - started == pytest.approx(5)
        await trio.sleep(0)
        server.hang = False
        assert (await sessions.call(ref(), "add", {"a": 1})).output == "1"
        assert server.opened == 2  # the hung session was dropped: its late answer cannot be read as another's
        server.broken = True
        outcome = await sessions.call(ref(), "add", {"a": 1})
        assert outcome.error == {"type": "http_error", "code": 502,
                                 "message": "the MCP server 's0' failed: connection lost"}
        nursery.cancel_scope.cancel()


async def test_the_pool_is_bounded(autojump_clock):
    server = FakeServer()
    async with trio.open_nursery() as nursery:
        sessions = await pool(nursery, server, sessions_max=2, call_timeout_s=100)
        await sessions.list_tools(ref(0, "a"))
        await sessions.list_tools(ref(1, "b"))
        await sessions.list_tools(ref(2, "c"))  # the least recently used idle one made room
        assert server.closed == 1 and sum(not s.dead for s in sessions._sessions.values()) == 2
        server.hang = True
        async with trio.open_nursery() as calls:  # both sessions busy: a third server must wait its turn
            calls.start_soon(sessions.call, ref(1, "b"), "add", {"a": 1})
            calls.start_soon(sessions.call, ref(2, "c"), "add", {"a": 1})
            await trio.sleep(1)
            with pytest.raises(Overloaded, match="all 2 MCP sessions of this node"):
                await sessions.list_tools(ref(3, "d"))
            calls.cancel_scope.cancel()
        nursery.cancel_scope.cancel()


async def test_one_tenant_holds_at_most_its_share_of_the_sessions(autojump_clock):
    server = FakeServer()
    async with trio.open_nursery() as nursery:
        sessions = await pool(nursery, server, sessions_max=8, call_timeout_s=100)  # a share is 8 // 4 = 2
        for n in range(3):
            await sessions.list_tools(ref(n, "a"))  # the third: a's own least recently used made room
        assert server.closed == 1 and sum(s.scope == "a" and not s.dead for s in sessions._sessions.values()) == 2
        server.hang = True
        async with trio.open_nursery() as calls:  # a's two sessions busy: a waits, b does not
            calls.start_soon(sessions.call, ref(1, "a"), "add", {"a": 1})
            calls.start_soon(sessions.call, ref(2, "a"), "add", {"a": 1})
            await trio.sleep(1)
            with pytest.raises(Overloaded, match="this tenant's 2 MCP sessions"):
                await sessions.list_tools(ref(3, "a"))
            assert [t.name for t in await sessions.list_tools(ref(4, "b"))] == ["add"]
            calls.cancel_scope.cancel()
        nursery.cancel_scope.cancel()


async def test_a_server_that_never_answers_the_handshake(autojump_clock):
    server = FakeServer()
    sdk = server.sdk()

    class Mute(sdk.ClientSession):
        async def initialize(self) -> None:
            await trio.sleep_forever()

    sdk.ClientSession = Mute
    async with trio.open_nursery() as nursery:
        sessions = McpSessions(McpConfig(connect_timeout_s=3))
        sessions._sdk = sdk
        await nursery.start(sessions.run)
        with pytest.raises(McpUnavailable, match="within 3 s"):
            await sessions.list_tools(ref())
        assert (await sessions.call(ref(), "add", {})).error["code"] == 504
        nursery.cancel_scope.cancel()


def test_the_node_checks_its_mcp_flags_at_start(tmp_path):
    import argparse

    from gateway.node.config import ConfigError, add_serve_arguments, build_config

    def parse(argv):
        parser = argparse.ArgumentParser()
        add_serve_arguments(parser)
        return build_config(parser.parse_args(argv), {})

    good = tmp_path / "mcp.yaml"
    good.write_text("servers:\n  calc:\n    transport: stdio\n    command: python\n    args: [-m, calc]\n")
    config = parse(["--mcp-config-path", str(good), "--mcp-allowed-hosts", "mcp.example.com", "10.0.0.0/8",
                    "--mcp-call-timeout-secs", "5"])
    assert config.mcp.allowed_hosts == ("mcp.example.com", "10.0.0.0/8") and config.mcp.call_timeout_s == 5
    bad = tmp_path / "bad.toml"
    bad.write_text('[servers.x]\nurl = "https://a"\nheaders = { A = "${NOT_SET_ANYWHERE}" }\n')
    for argv, message in ((["--mcp-config-path", str(bad)], "NOT_SET_ANYWHERE"),
                          (["--mcp-config-path", str(tmp_path / "none.toml")], "mcp-config-path"),
                          (["--mcp-allowed-hosts", "http://x"], "--mcp-allowed-hosts"),
                          (["--mcp-max-sessions", "0"], "must be positive")):
        with pytest.raises(ConfigError, match=message):
            parse(argv)


async def test_a_call_is_a_span_of_its_own_in_a_traced_request(autojump_clock):
    import random

    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from gateway.api.tool_loop import call_hosted
    from gateway.tracing import TracingConfig
    from gateway.tracing.tracer import Tracing
    exporter = InMemorySpanExporter()
    tracing = Tracing(TracingConfig(enabled=True, sample_ratio=1.0, export_interval_s=0.01), "n1", exporter,
                      random.Random(7))
    server = FakeServer()
    async with trio.open_nursery() as nursery:
        sessions = await pool(nursery, server)
        hosted = HostedTools([HostedServer("calc", ref())])
        hosted.add(hosted.servers[0], [ToolInfo("add", "Add", {"type": "object"})], set())
        state = types.SimpleNamespace(tracing=tracing, mcp=sessions)
        with tracing.request_span("POST /v1/responses", {}, {}):
            outcome = await call_hosted(state, hosted, "add", '{"a": 2, "b": 3}')
        refused = await call_hosted(state, hosted, "add", "[1, 2]")  # no JSON object: the model's error
        nursery.cancel_scope.cancel()
    assert outcome.output == "5" and "not a JSON object" in refused.error["content"][0]["text"]
    tracing.provider.force_flush()
    tracing.shutdown()
    spans = {s.name: s for s in exporter.get_finished_spans()}
    assert spans["mcp.call"].attributes["mcp.server"] == "calc" and spans["mcp.call"].attributes["mcp.tool"] == "add"
    assert spans["mcp.call"].parent.span_id == spans["POST /v1/responses"].context.span_id

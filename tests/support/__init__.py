"""What the tests share, in one place (no test module imports another):

    waiting          eventually / time_until / remains (and their trio forms): bounded waits, no fixed sleeps
    nodes            the simulated engines' MODEL and ENGINE_ARGS, a node's tokens, a three-node registry cluster
    node_pairs       nodes meshed on free ports (pairs and groups), their alive members
    config           a node's config from serve's flags
    tokenizers       a seeded corpus of many scripts, the Llama 3 tokenizer, a Qwen3 tokenizer service
    rendering        a chat answer under OpenAI's renderer, its stream assembled back
    certs            a test CA and loopback TLS contexts
    real_servers     real PostgreSQL and Redis servers started for a test
    kube_api_server  a Kubernetes API server's pods endpoints (list, watch, TLS, tokens)
    history_script   the scripted answers of the history tests, and a poll of a stored response
    mcp_server       a real MCP server (streamable HTTP, SSE, stdio), run as a process
    hostile_servers  MCP servers that attack the node that reaches them; hostile_stdio: one over stdio
    harmony_vocab    gpt-oss's harmony vocabulary, offline
    peer_values      extreme and mutated values for peer payload tests
    vllm             what the real-engine tests ask a vLLM engine directly

Tiers: ``pytest tests/unit -m "not corpus"`` runs the unit tier in well under a minute; the ``corpus`` tests
(tokenizers, parsers and templates over large corpora) and the integration tier run in the full suite.
"""

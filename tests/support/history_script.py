"""The scripted engine's answers and the tool the history flows use (test_history_cluster.py,
test_history_durable_flow.py): each follow-up's rule matches only when the earlier turns reached the
prompt, so a lost response or conversation item shows as a wrong answer."""

from __future__ import annotations

import json
from pathlib import Path
from tests.support.waiting import eventually

MODEL = "qwen3-sim"
TOOLS = [{"type": "function", "name": "get_weather", "description": "Weather",
          "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}]
RULES = [{"match": "(?s)weather in Oslo.*14 degrees.*What did I ask", "output": "You asked about the weather in Oslo."},
         {"match": "14 degrees", "output": "It is 14 degrees in Oslo today."},
         {"match": "weather", "output": '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n'
                                        '</tool_call>'},
         {"match": "(?s)my name is Ada.*What is my name", "output": "Your name is Ada."},
         {"match": "Hello", "output": "Hi! How can I help?"}]


def write_script(path: Path) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in RULES))
    return path


def poll(client, response_id: str, done, timeout_s: float = 20.0):
    """The stored response once ``done(response)``: read until then (another process decides it)."""
    last: list = [None]

    def read():
        last[0] = client.responses.retrieve(response_id)
        return last[0] if done(last[0]) else None

    return eventually(read, timeout_s, lambda: f"{response_id} stayed {last[0].status if last[0] else 'unread'}")

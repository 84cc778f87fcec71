"""A 404 for an unknown model names what the caller may use instead, and never a model it may not
(gateway/api/pipeline.py model_not_found)."""

from __future__ import annotations

import types

from gateway.api.pipeline import NAMES_LISTED_MAX, model_not_found
from gateway.auth.principal import Principal, Role


def _state(names, routes=None):
    catalog = types.SimpleNamespace(names=lambda: list(names))
    providers = None if routes is None else types.SimpleNamespace(routes=types.SimpleNamespace(routes=routes))
    return types.SimpleNamespace(catalog=catalog, providers=providers)


class _Route:
    def __init__(self, tenants):
        self.tenants = tenants

    def allows(self, tenant):
        return self.tenants is None or tenant in self.tenants


def test_the_404_lists_only_what_the_caller_may_use():
    state = _state(["qwen", "llama", "secret-model"], {"smart": _Route(None), "team-b-only": _Route({"b"})})
    limited = Principal("key:1", "k", Role.USER, tenant="a", models=frozenset({"qwen", "smart", "team-b-only"}))
    error = model_not_found(state, "gpt-9", limited)
    assert error.status == 404 and error.code == "model_not_found"
    assert error.message == "The model 'gpt-9' does not exist; the models served here: qwen, smart"
    everyone = Principal("key:2", "k", Role.USER)
    assert "llama, qwen, secret-model, smart" in model_not_found(state, "x", everyone).message


def test_a_long_list_is_cut_and_an_empty_node_says_so():
    names = [f"m{i:03d}" for i in range(NAMES_LISTED_MAX + 5)]
    message = model_not_found(_state(names), "x", Principal("key:1", "k", Role.USER)).message
    assert message.endswith("and 5 more (GET /v1/models)") and "m000" in message and f"m{NAMES_LISTED_MAX:03d}" \
        not in message
    assert model_not_found(_state([]), "x", Principal("key:1", "k", Role.USER)).message.endswith(
        "no model is served here yet")

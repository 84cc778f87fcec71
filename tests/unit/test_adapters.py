"""LoRA adapters without I/O: definitions checked (gateway/adapters/spec.py), names resolved as vLLM's and SGLang's
users write them, where a request goes and what makes room (placement.py), and the service's loads against a fake
engine client: room made by unloading the least recently used, never a pinned one nor one in use."""

from __future__ import annotations

import pytest
import trio

from gateway.adapters.placement import candidates_for, eviction
from gateway.adapters.service import AdapterConfig, AdapterService, AdapterUnavailable
from gateway.adapters.spec import AdapterInvalid, new_spec, spec_of_setting


class _Settings:
    def __init__(self) -> None:
        self.values: dict = {}
        self.callback = None

    def set_setting(self, name, value):
        self.values[name] = value

    def follow_settings(self, callback):
        self.callback = callback


class _Client:
    takes_adapters = True

    def __init__(self) -> None:
        self.loaded: set[str] = set()
        self.calls: list[tuple[str, str]] = []

    async def load_adapter(self, name, path, pinned, adapter_id, timeout_s):
        await trio.sleep(0.01)
        self.calls.append(("load", adapter_id))
        self.loaded.add(adapter_id)
        return frozenset(self.loaded)

    async def unload_adapter(self, name, adapter_id, timeout_s):
        self.calls.append(("unload", adapter_id))
        self.loaded.discard(adapter_id)
        return frozenset(self.loaded)


class _Worker:
    def __init__(self, wid: str, takes: bool = True) -> None:
        self.id, self.adapters, self.models, self.draining, self.healthy = wid, frozenset(), ("base",), False, True
        self.client = _Client()
        self.client.takes_adapters = takes


class _Registry:
    def __init__(self, workers) -> None:
        self.workers = {w.id: w for w in workers}

    def get(self, wid):
        return self.workers.get(wid)

    def all(self):
        return list(self.workers.values())


def test_definitions_are_checked_and_ids_fresh():
    a, b = new_spec("cust-a", "base", "/lora/a"), new_spec("cust-a", "base", "/lora/a")
    assert a.adapter_id != b.adapter_id and a.adapter_id.startswith("cust-a-lora_")
    for bad in (("a:b", "base", "/x"), ("a/b", "base", "/x"), ("", "base", "/x"), ("ok", "", "/x"),
                ("ok", "base", ""), ("ok", "base", "/x\x00"), ("ok", "base", "/x", "yes")):
        with pytest.raises(AdapterInvalid):
            new_spec(*bad)
    again = spec_of_setting("cust-a", a.to_setting())
    assert again == a
    with pytest.raises(AdapterInvalid):
        spec_of_setting("cust-a", {"base": "base", "path": "/x"})  # a peer's setting without its id


def test_names_resolve_as_the_adapter_or_base_colon_adapter():
    settings = _Settings()
    service = AdapterService(AdapterConfig(), settings, _Registry([]), None)
    spec = new_spec("cust-a", "org/model:v1", "/lora/a")
    service.define(spec)
    assert settings.values["adapter:cust-a"]["id"] == spec.adapter_id
    assert service.resolve("cust-a") is spec and service.resolve("org/model:v1:cust-a") is spec
    assert service.resolve("other:cust-a") is None and service.resolve("org/model:v1") is None
    settings.callback("adapter:cust-a", None)  # a peer removed it
    assert service.resolve("cust-a") is None
    settings.callback("adapter:bad", {"base": "b"})  # a peer's bad value: refused, counted
    assert service.refused_settings == 1 and "bad" not in service.specs


def test_placement_prefers_holders_and_evicts_the_least_recently_used_free_one():
    holder, taker, vllm = _Worker("h"), _Worker("t"), _Worker("v", takes=False)
    holder.adapters = frozenset({"x"})
    assert candidates_for([holder, taker, vllm], "x") == [holder]
    assert candidates_for([holder, taker, vllm], "y") == [holder, taker]
    assert candidates_for([vllm], "y") == []
    loaded = frozenset({"a", "b", "c"})
    assert eviction(loaded, 4, set(), {}) is None
    assert eviction(loaded, 3, set(), {"a": 5.0, "b": 1.0, "c": 3.0}) == "b"
    assert eviction(loaded, 3, {"b"}, {"a": 5.0, "b": 1.0, "c": 3.0}) == "c"
    assert eviction(loaded, 3, {"a"}, {"a": 5.0}) == "b"  # never used here: first to go
    assert eviction(loaded, 3, {"a", "b", "c"}, {}) is False


async def test_loads_make_room_and_never_unload_what_a_request_holds(autojump_clock):
    worker = _Worker("w")
    service = AdapterService(AdapterConfig(per_worker=2), _Settings(), _Registry([worker]), None)
    specs = {n: new_spec(n, "base", f"/lora/{n}", pinned=(n == "p")) for n in ("p", "a", "b", "c")}
    for spec in specs.values():
        service.define(spec)
    async with service.ready(worker, specs["p"]):
        pass
    async with service.ready(worker, specs["a"]):
        assert worker.adapters == {specs["p"].adapter_id, specs["a"].adapter_id}
        with pytest.raises(AdapterUnavailable) as full:  # p pinned, a in use: no room for b
            async with service.ready(worker, specs["b"]):
                pass
        assert full.value.code == "adapter_slots_full"
    async with service.ready(worker, specs["b"]):  # a released: unloaded for b
        assert worker.adapters == {specs["p"].adapter_id, specs["b"].adapter_id}
    assert ("unload", specs["a"].adapter_id) in worker.client.calls
    assert service.counts["loads"] == 3 and service.counts["unloads"] == 1

    # Requests for one adapter at once load it once.
    async with trio.open_nursery() as nursery:
        for _ in range(5):
            nursery.start_soon(_use, service, worker, specs["c"])
    assert [c for c in worker.client.calls if c == ("load", specs["c"].adapter_id)] == [("load",
                                                                                          specs["c"].adapter_id)]


async def _use(service, worker, spec) -> None:
    async with service.ready(worker, spec):
        await trio.sleep(0.1)

"""What the supervisor tells each of its --workers processes, and who follows an engine's KV events."""

from __future__ import annotations

import argparse
import dataclasses

import pytest

from gateway.node.config import ConfigError, GatewayConfig, add_serve_arguments, build_config
from gateway.cluster import KvSharing
from gateway.routing.kv_index import KvIndex
from gateway.node.supervisor import default_worker_count, ephemeral_port_low, worker_arguments, worker_count
from mesh.options import MeshOptions
from mesh.ring import HashRing


def flag_value(args: list[str], flag: str) -> str | None:
    """The last value given for a flag (later flags win)."""
    values = [args[i + 1] for i, a in enumerate(args[:-1]) if a == flag]
    return values[-1] if values else None


def test_a_private_mesh_has_one_kv_follower_per_engine():
    per_process, env = worker_arguments(GatewayConfig(), 2, 30000)
    assert [flag_value(args, "--kv-event-followers") for args in per_process] == ["1", "1"]
    assert [flag_value(args, "--mesh-preset") for args in per_process] == ["local", "local"]
    assert env["SMG_NODE_ENCRYPT"]  # the private mesh's key, off the command line


def test_private_mesh_ports_are_below_the_outgoing_connection_range():
    # An outgoing connection can take a port of that range while its process restarts (EADDRINUSE).
    for _ in range(5):  # random picks: a few of them
        per_process, _ = worker_arguments(GatewayConfig(), 2, 30000)
        ports = [int(flag_value(args, "--mesh-bind").rsplit(":", 1)[1]) for args in per_process]
        assert all(1024 <= port < ephemeral_port_low() for port in ports), ports


def test_a_cluster_mesh_keeps_the_configured_followers():
    config = GatewayConfig(mesh=dataclasses.replace(MeshOptions(), bind="127.0.0.1:7946"))
    per_process, _ = worker_arguments(config, 2, 30000)
    assert all(flag_value(args, "--kv-event-followers") is None for args in per_process)


def test_followers_are_the_first_ring_owners():
    class Cluster:
        ring = HashRing.build(["p0", "p1", "p2"])
        node_name = "p0"

        def serve_requests(self, mark, handler):
            pass

        def owners(self, key, count, ring=None):  # every member a machine of its own
            return (ring or self.ring).placement(key, count, lambda member: member)

    def following(followers: int) -> set[str]:
        names = set()
        for name in Cluster.ring.members:
            Cluster.node_name = name
            if KvSharing(Cluster(), KvIndex(), followers).is_owner("engine-a"):
                names.add(name)
        return names

    assert len(following(1)) == 1
    assert len(following(2)) == 2 and following(1) < following(2)


def test_followers_flag_is_checked():
    parser = argparse.ArgumentParser()
    add_serve_arguments(parser)
    assert build_config(parser.parse_args([]), {}).kv_event_followers == 2
    assert build_config(parser.parse_args(["--kv-event-followers", "1"]), {}).kv_event_followers == 1
    with pytest.raises(ConfigError, match="at least 1"):
        build_config(parser.parse_args(["--kv-event-followers", "0"]), {})


def test_each_process_gets_its_share_of_encoder_threads(monkeypatch):
    """N processes with one encoder thread per core each would build N x cores encoders (~56 MB each)."""
    monkeypatch.setattr("gateway.node.supervisor.available_cores", lambda: 8)
    per_process, _ = worker_arguments(GatewayConfig(), 8, 30000)
    assert [flag_value(args, "--encode-threads") for args in per_process] == ["1"] * 8
    per_process, _ = worker_arguments(GatewayConfig(), 3, 30000)
    assert [flag_value(args, "--encode-threads") for args in per_process] == ["3"] * 3
    chosen = GatewayConfig(tokenizer=dataclasses.replace(GatewayConfig().tokenizer, encode_threads=5))
    per_process, _ = worker_arguments(chosen, 8, 30000)
    assert all(flag_value(args, "--encode-threads") is None for args in per_process)  # the user's own stays


def test_the_default_leaves_a_core_to_what_runs_beside_the_event_loops(monkeypatch):
    """One process on 2 cores (a second cost 1.15-1.49x the CPU per request of one: BENCHMARKS), N - 1 on N."""
    assert [default_worker_count(cores) for cores in (1, 2, 3, 4, 16, 64)] == [1, 1, 2, 3, 15, 63]
    monkeypatch.setattr("gateway.node.supervisor.available_cores", lambda: 8)
    assert worker_count(GatewayConfig()) == 7
    assert worker_count(GatewayConfig(workers=2)) == 2  # the user's own count stays


def test_encode_threads_flag_is_checked():
    parser = argparse.ArgumentParser()
    add_serve_arguments(parser)
    assert build_config(parser.parse_args(["--encode-threads", "2"]), {}).tokenizer.encode_threads == 2
    with pytest.raises(ConfigError, match="must not be negative"):
        build_config(parser.parse_args(["--encode-threads", "-1"]), {})

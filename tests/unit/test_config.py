"""Configuration: smg's flag names; flag > environment > TOML file > default."""


import pytest

from gateway.node.config import ConfigError, validate
from tests.support.config import parse


def test_defaults():
    c = parse([])
    assert c.port == 30000 and c.policy.name == "cache_aware" and c.retry.max_retries == 5


def test_smg_flag_names_map_to_the_right_settings():
    c = parse(["--worker-urls", "grpc://a:1", "http://b:2", "--policy", "round_robin", "--cb-failure-threshold", "4",
               "--retry-initial-backoff-ms", "20", "--health-check-interval-secs", "2.5", "--disable-retries",
               "--max-concurrent-requests", "8", "--queue-size", "3", "--request-timeout-secs", "9", "--log-json"])
    assert c.worker_urls == ("grpc://a:1", "http://b:2")
    assert c.policy.name == "round_robin" and c.breaker.failure_threshold == 4
    assert c.retry.initial_backoff_s == 0.02 and not c.retry.enabled
    assert c.health.interval_s == 2.5 and c.admission.max_concurrent_requests == 8
    assert c.admission.queue_size == 3 and c.admission.request_timeout_s == 9.0 and c.log_json


def test_precedence_flag_over_env_over_file(tmp_path):
    toml = tmp_path / "node.toml"
    toml.write_text('port = 1111\nqueue_size = 7\npolicy = "random"\nworker_urls = ["grpc://x:1"]\n')
    c = parse(["--config", str(toml), "--port", "3333"], {"SMG_NODE_PORT": "2222", "SMG_NODE_QUEUE_SIZE": "9"})
    assert c.port == 3333 and c.admission.queue_size == 9 and c.policy.name == "random"
    assert c.worker_urls == ("grpc://x:1",)


@pytest.mark.parametrize("argv, environ", [
    (["--policy", "fastest"], {}),
    (["--port", "70000"], {}),
    ([], {"SMG_NODE_PORT": "abc"}),
    (["--tokenizer-path", "/nonexistent"], {}),
])
def test_bad_values_are_refused(argv, environ):
    with pytest.raises(ConfigError):
        parse(argv, environ)


def test_unknown_file_keys_are_refused(tmp_path):
    toml = tmp_path / "node.toml"
    toml.write_text("prot = 1\n")
    with pytest.raises(ConfigError, match="unknown keys prot"):
        parse(["--config", str(toml)])


def test_history_flags():
    config = parse(["--history-backend", "none", "--history-memory-max-responses", "50",
                  "--history-memory-retention-secs", "3600"])
    assert (config.history_backend, config.history.max_responses, config.history.retention_s) == ("none", 50, 3600.0)
    assert parse([]).history_backend == "memory"
    pg = parse(["--history-backend", "postgres", "--postgres-db-url", "postgres://u@db/x", "--postgres-pool-max-size",
                "4", "--postgres-names", "responses=llm_answers", "owner=tenant_id"])
    assert (pg.postgres.url, pg.postgres.pool_max_size) == ("postgres://u@db/x", 4)
    assert (pg.postgres.names.responses, pg.postgres.names.owner, pg.postgres.names.body) == \
        ("llm_answers", "tenant_id", "body")
    rd = parse(["--history-backend", "redis", "--redis-url", "redis://r:6379/0", "--redis-retention-days", "-1",
                "--redis-key-prefix", "team:"])
    assert (rd.redis.url, rd.redis.retention_days, rd.redis.key_prefix) == ("redis://r:6379/0", -1.0, "team:")
    for bad in (["--history-backend", "postgres"], ["--history-backend", "redis"], ["--history-backend", "oracle"],
                ["--history-memory-max-responses", "0"], ["--history-memory-max-items", "0"],
                ["--history-backend", "postgres", "--postgres-db-url", "x", "--postgres-names", "owner=a;drop"],
                ["--postgres-names", "colour=blue"],
                ["--history-backend", "redis", "--redis-url", "x", "--redis-retention-days", "0"]):
        with pytest.raises(ConfigError):
            validate(parse(bad))

"""Limit files, keys, headers, and the node-local limiter (reservations and settlement)."""

from __future__ import annotations

import math
import pathlib
import tomllib

import pytest
import trio

from gateway.api.ratelimits import format_reset, rate_limit_error, rate_limit_headers
from gateway.node.config import ConfigError, add_serve_arguments, build_config
from gateway.ratelimit import (FailurePolicy, Identity, LimitConfigError, LimitSet, RateLimitConfig, RateLimiter,
                               Scope, Unit, parse_limit_set)

EXAMPLE = """
failure_policy = "closed"

[[limits]]
name = "per-key"
scope = "api_key"
limit = 2

[[limits]]
name = "tokens"
scope = "tenant"
unit = "tokens"
limit = 100
window_s = 60
algorithm = "sliding_window"
"""


def test_a_limit_file_parses_with_its_defaults():
    limits = parse_limit_set(tomllib.loads(EXAMPLE))
    assert limits.failure_policy is FailurePolicy.CLOSED
    per_key, tokens = limits.limits
    assert per_key.scope is Scope.API_KEY and per_key.unit is Unit.REQUESTS
    assert (per_key.rate.limit, per_key.rate.window_s, per_key.rate.burst) == (2, 1.0, 2)
    assert tokens.rate.algorithm.value == "sliding_window" and tokens.rate.window_s == 60
    assert parse_limit_set(limits.to_dict()) == limits  # what the admin endpoint returns, it accepts


@pytest.mark.parametrize("raw, message", [
    ({"limits": [{"name": "a", "limit": 0}]}, "limits[0].limit: must be a positive number"),
    ({"limits": [{"name": "a", "limit": 1, "scope": "planet"}]}, "limits[0].scope: 'planet' is not one of"),
    ({"limits": [{"name": "a:b", "limit": 1}]}, "limits[0].name"),
    ({"limits": [{"name": "a", "limit": 1}, {"name": "a", "limit": 2}]}, "the name 'a' is used twice"),
    ({"limits": [{"name": "a", "limit": 1, "color": "red"}]}, "unknown field(s) color"),
    ({"limits": [{"name": "a", "limit": 1, "match": "x"}]}, "a global limit matches everything"),
    ({"failure_policy": "maybe"}, "failure_policy: 'maybe' is not one of"),
    ({"limits": [{"name": "a", "limit": True}]}, "must be a positive number"),
    ([], "must be a table/object"),
])
def test_bad_limit_configs_say_which_field(raw, message):
    with pytest.raises(LimitConfigError) as info:
        parse_limit_set(raw)
    assert message in str(info.value)


def test_keys_per_scope_and_match():
    limits = parse_limit_set({"limits": [
        {"name": "g", "limit": 1}, {"name": "k", "scope": "api_key", "limit": 1},
        {"name": "t", "scope": "tenant", "limit": 1}, {"name": "m", "scope": "model", "limit": 1, "match": "big"}]})
    g, k, t, m = limits.limits
    who = Identity(Identity.hash_api_key("Bearer sk-123"), None, "big")
    assert g.key_for(who) == "g:*"
    assert k.key_for(who) == f"k:{who.api_key}" and "sk-123" not in k.key_for(who)
    assert t.key_for(who) is None  # no tenant: the tenant limit does not apply
    assert m.key_for(who) == "m:big" and m.key_for(Identity("anonymous", None, "small")) is None
    assert Identity.hash_api_key(None) == Identity.hash_api_key("Bearer ") == "anonymous"


def parse_config(argv: list[str]):
    import argparse
    parser = argparse.ArgumentParser()
    add_serve_arguments(parser)
    return build_config(parser.parse_args(argv), {})


def test_global_rate_limit_flag_and_policy_flag(tmp_path: pathlib.Path):
    config = parse_config(["--global-rate-limit", "100", "--rate-limit-policy", "open"])
    limits = config.limit_set()
    assert limits.failure_policy is FailurePolicy.OPEN
    (spec,) = limits.limits
    assert (spec.name, spec.scope, spec.rate.limit, spec.rate.window_s) == ("global", Scope.GLOBAL, 100, 1.0)
    path = tmp_path / "limits.toml"
    path.write_text(EXAMPLE)
    assert len(parse_config(["--rate-limits", str(path), "--global-rate-limit", "5"]).limit_set().limits) == 3
    path.write_text("[[limits]]\nname = 'x'\n")
    with pytest.raises(ConfigError, match="limits.toml: limits\\[0\\].limit"):
        parse_config(["--rate-limits", str(path)])
    with pytest.raises(ConfigError, match="--global-rate-limit"):
        parse_config(["--global-rate-limit", "-1"])


@pytest.mark.parametrize("seconds, text", [(0.0201, "21ms"), (0.0, "0ms"), (1, "1s"), (1.5, "1.5s"), (360, "6m0s"),
                                           (3723, "1h2m3s")])
def test_reset_durations_read_like_openais(seconds, text):
    assert format_reset(seconds) == text


def _limiter(raw: dict) -> RateLimiter:
    return RateLimiter(RateLimitConfig(), parse_limit_set(raw), clock=trio.current_time)


async def test_token_reservations_are_settled_with_real_usage(autojump_clock):
    limiter = _limiter({"limits": [{"name": "tok", "unit": "tokens", "limit": 1000, "window_s": 60}]})
    who = limiter.identity(None, None, "m")
    first = await limiter.check(who, 600)
    assert first.allowed
    assert not (await limiter.check(who, 600)).allowed  # 600 reserved of 1000
    limiter.settle(first, 100)  # it used 100: 500 come back
    second = await limiter.check(who, 600)
    assert second.allowed and second.outcomes[0].decision.remaining == pytest.approx(300, abs=1)


async def test_when_one_limit_denies_the_others_give_back_what_they_took(autojump_clock):
    limiter = _limiter({"limits": [{"name": "req", "limit": 10}, {"name": "tok", "unit": "tokens", "limit": 50}]})
    who = limiter.identity("Bearer a", None, "m")
    assert (await limiter.check(who, 40)).allowed
    denied = await limiter.check(who, 40)
    assert not denied.allowed and denied.denied_by.spec.name == "tok"
    req = next(o for o in denied.outcomes if o.spec.name == "req")
    assert req.decision.allowed  # it took one request, then gave it back:
    assert (await limiter.check(who, 1)).outcomes[0].decision.remaining == 8


async def test_headers_and_429_body(autojump_clock):
    limiter = _limiter({"limits": [{"name": "req", "limit": 1, "window_s": 60},
                                   {"name": "tok", "unit": "tokens", "limit": 500, "window_s": 60}]})
    who = limiter.identity(None, None, "m")
    ok = await limiter.check(who, 100)
    headers = dict(rate_limit_headers(ok))
    assert headers[b"x-ratelimit-limit-requests"] == b"1" and headers[b"x-ratelimit-remaining-requests"] == b"0"
    assert headers[b"x-ratelimit-limit-tokens"] == b"500" and headers[b"x-ratelimit-remaining-tokens"] == b"400"
    assert headers[b"x-ratelimit-reset-requests"] == b"1m0s"
    denied = await limiter.check(who, 100)
    error = rate_limit_error(denied)
    assert error.status == 429 and error.body()["error"]["code"] == "rate_limit_exceeded"
    assert error.body()["error"]["type"] == "rate_limit_error"
    assert dict(error.headers())[b"retry-after"] == b"60"
    too_big = await limiter.check(who, 10_000)
    assert math.isinf(too_big.denied_by.decision.retry_after_s)
    assert "Request too large" in rate_limit_error(too_big).message
    assert rate_limit_error(too_big).headers() == []


async def test_no_limits_means_no_work(autojump_clock):
    limiter = RateLimiter(RateLimitConfig(), LimitSet(), clock=trio.current_time)
    assert not limiter.active
    verdict = await limiter.check(limiter.identity(None, None, None), 10)
    assert verdict.allowed and verdict.outcomes == []


async def test_the_background_loop_sleeps_while_nothing_is_held(autojump_clock):
    limiter = _limiter({"limits": [{"name": "req", "limit": 10, "window_s": 1}]})
    rounds = []
    sync_once = limiter.sync_once
    limiter.sync_once = lambda nursery: (rounds.append(trio.current_time()), sync_once(nursery))
    async with trio.open_nursery() as nursery:
        await nursery.start(limiter.run)
        await trio.sleep(60)
        assert rounds == []  # nothing held: not one round in a minute
        assert (await limiter.check(limiter.identity(None, None, "m"), 1)).allowed
        await trio.sleep(1)
        assert rounds  # a key is held: rounds run
        # Back to its full allowance after the 1 s window, the key is forgotten at the next
        # forget_idle_interval_s, and the loop sleeps again.
        await trio.sleep(2 * limiter.config.forget_idle_interval_s)
        assert len(limiter.store) == 0 and len(limiter.shares) == 0
        held_rounds = len(rounds)
        await trio.sleep(60)
        assert len(rounds) == held_rounds
        nursery.cancel_scope.cancel()


async def test_a_provider_quota_request_never_sent_is_given_back(autojump_clock):
    from gateway.providers.quotas import counters, take
    from gateway.providers.routes import Quota

    limiter = RateLimiter(RateLimitConfig(), LimitSet(), clock=trio.current_time)
    quota = counters("acct", Quota(2, None))
    first = await take(limiter, quota, 10)
    assert first.allowed
    limiter.refund_requests(first)  # no connection: the provider never saw it
    assert (await take(limiter, quota, 10)).allowed and (await take(limiter, quota, 10)).allowed
    assert not (await take(limiter, quota, 10)).allowed  # two sent: the minute's two are spent

"""Worker URLs are origins (gateway/workers/origin.py): what is accepted, its canonical form, what is refused."""

from __future__ import annotations

import pytest

from gateway.workers.origin import WorkerAllowlist, WorkerNotAllowed, WorkerUrlError, parse_worker_origin


@pytest.mark.parametrize("url, canonical", [
    ("grpc://127.0.0.1:30001", "grpc://127.0.0.1:30001"),
    ("GRPC://Engine.Local:30001", "grpc://engine.local:30001"),
    ("http://h", "http://h:80"),
    ("http://h:8000/", "http://h:8000"),
    ("https://h", "https://h:443"),
    ("grpc://[::1]:5", "grpc://[::1]:5"),
    ("grpcs://Engine:443", "grpcs://engine:443"),
])
def test_origins_and_their_canonical_form(url, canonical):
    assert parse_worker_origin(url).url == canonical


@pytest.mark.parametrize("url", [
    # The attack: a path or query turned a chat request into a call to the node's own admin endpoint.
    "http://127.0.0.1:7373/v1/keyring/install?",
    "http://127.0.0.1:7373/v1/leave?a",
    "http://127.0.0.1:7373?x=1",
    "http://127.0.0.1:7373/#frag",
    "http://127.0.0.1:7373?",
    "http://user:pass@h:80",
    "ftp://h:21",
    "grpc://h",  # gRPC needs a port
    "grpc://h:0",
    "grpc://h:99999",
    "http://:80",
    "not a url",
])
def test_anything_but_an_origin_is_refused(url):
    with pytest.raises(WorkerUrlError):
        parse_worker_origin(url)


def test_the_allowlist_takes_names_and_networks():
    allow = WorkerAllowlist(["engine.internal", "10.0.0.0/8", "::1/128"])
    for url in ("grpc://engine.internal:1", "grpc://10.1.2.3:1", "grpc://[::1]:1"):
        allow.check(parse_worker_origin(url))
    for url in ("grpc://127.0.0.1:7373", "grpc://evil.example:1", "http://11.0.0.1:80"):
        with pytest.raises(WorkerNotAllowed):
            allow.check(parse_worker_origin(url))
    WorkerAllowlist().check(parse_worker_origin("grpc://anything:1"))  # empty: open

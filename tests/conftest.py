"""Settings for the whole suite."""

from __future__ import annotations

import os

import pytest

from mesh.admin_token import FILE_ENV


@pytest.fixture(autouse=True, scope="session")
def admin_token_file(tmp_path_factory):
    """Nodes and CLI calls of the suite keep their admin token in a file of the suite's own, never the
    user's ~/.local/state/smg-node/admin-token."""
    path = tmp_path_factory.mktemp("admin") / "admin-token"
    previous = os.environ.get(FILE_ENV)
    os.environ[FILE_ENV] = str(path)
    yield path
    if previous is None:
        os.environ.pop(FILE_ENV, None)
    else:
        os.environ[FILE_ENV] = previous


@pytest.fixture(autouse=True)
def data_root(tmp_path_factory, monkeypatch):
    """Nodes started by a test keep their data directories (gateway/node/data_dir.py) under a folder of that test's
    own: a node restarted within the test finds its state, and no test finds another's (or the user's)."""
    from gateway.node.data_dir import ROOT_ENV
    root = tmp_path_factory.mktemp("data")
    monkeypatch.setenv(ROOT_ENV, str(root))
    return root

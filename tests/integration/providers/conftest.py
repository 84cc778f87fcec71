"""Hosted providers behind a node: each module starts its fake providers (``fakes``, tests/support/fake_providers.py)
and a node routed to them (``node``); these fixtures reset the fakes around each test and hold every request they got
to their SDK's types, and give the clients."""

from __future__ import annotations

import anthropic
import openai
import pytest

from tests.support.fake_providers import each_test


@pytest.fixture(autouse=True)
def clean(fakes):
    with each_test(fakes):
        yield


@pytest.fixture
def oai(node):
    return openai.OpenAI(base_url=node.url + "/v1", api_key="client-key", max_retries=0, timeout=30)


@pytest.fixture
def ant(node):
    return anthropic.Anthropic(base_url=node.url, api_key="client-key", max_retries=0, timeout=30)

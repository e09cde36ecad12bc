"""Fixtures shared by several test modules (helpers they import live in the *_helpers.py modules)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from gateway_helpers import CountingMock
from redis_helpers import RedisServer


@pytest.fixture(scope="module")
def mock() -> Iterator[CountingMock]:
    """The project's mock OpenAI server answering at once (no delays), shared by one module's tests; a module
    that needs delays defines its own ``mock``."""
    m = CountingMock(itl_ms=0)
    yield m
    m.stop()


@pytest.fixture
def rs(tmp_path: Path) -> Iterator[RedisServer]:
    """A fresh real redis-server for one test, on a free loopback port, in its own folder under tmp_path."""
    (tmp_path / "redis").mkdir()
    server = RedisServer(tmp_path / "redis")
    yield server
    server.stop()

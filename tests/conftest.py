"""Fixtures that hand tests real ZooKeeper and Redis servers.

Servers are expensive-ish JVMs, so the plain ones are shared (session scope)
and each test isolates itself under its own ``zk_root`` path instead, just as
kazoo's harness gives every test its own chroot.  Tests that stop, restart or
kill a server must use ``zk_server_private`` (or the module's ``zk_ensemble``,
which they should heal with ``zk_ensemble.start()`` afterwards).
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator

import pytest
from kazoo.client import KazooClient

from tests.support.helpers import Published
from tests.support.servers import RedisServer, ZooKeeperEnsemble, ZooKeeperServer

# PostgreSQL + Django fixtures of the DatabaseScheduler tests (Django loads only when used).
pytest_plugins = ["tests.support.djangosupport"]


@pytest.fixture(scope="session")
def zk_server() -> Iterator[ZooKeeperServer]:
    """One standalone ZooKeeper shared by the whole run; do not stop it."""
    with ZooKeeperServer() as server:
        yield server


@pytest.fixture
def zk_server_private() -> Iterator[ZooKeeperServer]:
    """A fresh standalone ZooKeeper that the test may stop, kill or restart."""
    with ZooKeeperServer() as server:
        yield server


@pytest.fixture(scope="module")
def zk_ensemble() -> Iterator[ZooKeeperEnsemble]:
    """A 3-member ensemble shared by one test module."""
    with ZooKeeperEnsemble(3) as ensemble:
        yield ensemble


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    """One Redis shared by the whole run."""
    with RedisServer() as server:
        yield server


@pytest.fixture
def zk_root(request: pytest.FixtureRequest) -> str:
    """A base path no other test uses, e.g. ``/t/test_foo_param_-1a2b3c4d``.

    Nothing is created: the code under test should create what it needs.
    """
    name = re.sub(r"[^A-Za-z0-9_.-]", "_", request.node.name)[:60]
    return f"/t/{name}-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def zk_client(zk_server: ZooKeeperServer) -> Iterator[KazooClient]:
    """A connected KazooClient on ``zk_server``, stopped and closed afterwards."""
    client = KazooClient(zk_server.hosts)
    client.start(timeout=15)
    try:
        yield client
    finally:
        client.stop()
        client.close()


@pytest.fixture
def published() -> Iterator[Published]:
    """Every message this test process hands to the broker, with its headers."""
    recorder = Published()
    yield recorder
    recorder.close()

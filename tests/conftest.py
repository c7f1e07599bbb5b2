"""Fixtures that hand tests real ZooKeeper and Redis servers, and the schedulers on them.

Servers are expensive-ish JVMs, so the plain ones are shared (session scope)
and each test isolates itself under its own ``zk_root`` path instead, just as
kazoo's harness gives every test its own chroot.  Tests that stop, restart or
kill a server must use ``zk_server_private`` (or the module's ``zk_ensemble``,
which they should heal with ``zk_ensemble.start()`` afterwards).

``make_scheduler`` builds in-process schedulers, ``make_cluster`` real
``celery beat`` replicas; both run ``beat_scheduler``, which is
``zkbeat.Scheduler`` unless a test is marked otherwise (the Django
modules run ``zkbeat.DatabaseScheduler``).
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from celery import Celery
from celery.utils.imports import symbol_by_name
from kazoo.client import KazooClient

pytest.register_assert_rewrite("tests.support")  # before the imports below: their asserts explain themselves

from tests.support.brokers import BROKERS, TestBroker, make_broker  # noqa: E402
from tests.support.djangosupport import DjangoCluster, replica_env  # noqa: E402
from tests.support.helpers import Published  # noqa: E402
from tests.support.processes import ENTRIES, SESSION, Cluster  # noqa: E402
from tests.support.proxy import TcpProxy  # noqa: E402
from tests.support.servers import RedisServer, ZooKeeperEnsemble, ZooKeeperServer  # noqa: E402

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
def redis_server_private() -> Iterator[RedisServer]:
    """A fresh Redis of the test's own: its queue holds this test's messages alone, for the test to read back."""
    with RedisServer() as server:
        yield server


@pytest.fixture
def proxied_redis() -> Iterator[tuple[RedisServer, TcpProxy]]:
    """A fresh Redis of the test's own and a TcpProxy to it: the replicas go through the proxy (which can cut the
    link), the test reads the queue in Redis itself."""
    server = RedisServer().start()
    proxy = TcpProxy(server.port).start()
    yield server, proxy
    proxy.close()
    server.stop()


@pytest.fixture(params=BROKERS)
def broker(request: pytest.FixtureRequest) -> Iterator[TestBroker]:
    """The broker of one test, once on Redis and once on RabbitMQ (py-amqp): ``url``, ``outage()``, ``restore()``.

    Redis is a private server; RabbitMQ is the machine's own, in a vhost of
    the test's own, behind a proxy (tests/support/brokers.py). Pass
    ``broker=broker.url`` to ``make_cluster``: the record of what was
    published stays in the shared Redis, so an outage never hides it.
    """
    with make_broker(request.param, re.sub(r"[^A-Za-z0-9_]", "_", request.node.originalname)) as made:
        yield made


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


@pytest.fixture
def beat_scheduler(request: pytest.FixtureRequest) -> str:
    """The scheduler ``make_scheduler`` and ``make_cluster`` run, as ``--scheduler`` names it.

    ``zkbeat.Scheduler`` unless the test is marked ``beat_scheduler(name)``
    (the Django modules: tests.support.djangosupport.ON_THE_DATABASE).
    """
    marker = request.node.get_closest_marker("beat_scheduler")
    return marker.args[0] if marker is not None else "zkbeat.Scheduler"


@pytest.fixture
def make_scheduler(
    beat_scheduler: str, zk_server: ZooKeeperServer, redis_server: RedisServer, zk_root: str, zk_client: KazooClient
) -> Iterator[Callable[..., Any]]:
    """Build in-process schedulers on the shared servers; each is closed after the test.

    ``make_scheduler(entries, hosts=..., identity=..., **conf)``: ``entries``
    is the ``beat_schedule`` (a dict, or a callable given the app, for
    schedules bound to it such as ``crontab(app=app)``); ``hosts`` replaces
    the shared ZooKeeper; ``identity`` defaults to ``inproc-<n>``; ``conf``
    is any other setting, and wins over the defaults here.
    """
    scheduler_class = symbol_by_name(beat_scheduler)
    made: list[Any] = []
    # The tests' common parent (/t) is everyone's: never let an ACL test be first to create it.
    zk_client.ensure_path(zk_root.rsplit("/", 1)[0])

    def make(
        entries: dict | Callable[[Celery], dict] | None = None,
        *,
        hosts: str | None = None,
        identity: str | None = None,
        **conf: Any,
    ) -> Any:
        app = Celery("zkbeat-test", set_as_current=False)
        settings = {
            "broker_url": redis_server.url,
            "zkbeat_hosts": hosts or zk_server.hosts,
            "zkbeat_root": zk_root,
            "zkbeat_session_timeout": 4,
            "zkbeat_identity": identity or f"inproc-{len(made)}",
            "beat_max_loop_interval": 0.5,
            **conf,
        }
        settings["beat_schedule"] = (entries(app) if callable(entries) else entries) or {}
        app.conf.update(settings)
        scheduler = scheduler_class(app)
        made.append(scheduler)
        return scheduler

    yield make
    for scheduler in made:
        scheduler.close()


@pytest.fixture
def make_cluster(
    request: pytest.FixtureRequest, beat_scheduler: str, redis_server: RedisServer, zk_root: str, tmp_path: Path
) -> Iterator[Callable[..., Any]]:
    """Build clusters of real ``celery beat`` replicas (not started); each is stopped after the test.

    ``make_cluster(n, hosts=..., schedule=..., broker=..., session_timeout=..., extra_env=...)``:
    ``hosts`` defaults to the shared ZooKeeper (started only when used),
    ``schedule`` ({name: seconds}) to ``ENTRIES``, ``broker`` (a URL, e.g.
    the ``broker`` fixture's) to the shared Redis, which always keeps the
    record of what was published (so a broker the test stops cannot erase
    it). With ``zkbeat.DatabaseScheduler`` the replicas are the example
    project's on ``beat_db``, and its rows are the schedule.
    """
    made: list[Cluster | DjangoCluster] = []

    def make(
        n: int,
        *,
        hosts: str | None = None,
        schedule: dict[str, float] | None = None,
        broker: str | None = None,
        session_timeout: float = SESSION,
        extra_env: dict[str, str] | None = None,
    ) -> Cluster | DjangoCluster:
        hosts = hosts or request.getfixturevalue("zk_server").hosts
        if beat_scheduler == "zkbeat.DatabaseScheduler":
            if schedule is not None:
                raise TypeError("a DatabaseScheduler cluster's schedule is its rows")
            env = replica_env(
                database_url=request.getfixturevalue("beat_db"),
                zk_hosts=hosts,
                broker=broker or redis_server.url,
                record_url=redis_server.url,
                root=zk_root,
                record_key=f"zkbeat-test:{zk_root}",
                session_timeout=session_timeout,
            )
            cluster: Cluster | DjangoCluster = DjangoCluster(n, env, tmp_path, extra_env)
        else:
            cluster = Cluster(
                n,
                zk_hosts=hosts,
                broker=broker or redis_server.url,
                record_url=redis_server.url,
                root=zk_root,
                schedule=ENTRIES if schedule is None else schedule,
                log_dir=tmp_path,
                session_timeout=session_timeout,
                extra_env=extra_env,
            )
        made.append(cluster)
        return cluster

    yield make
    for cluster in made:
        cluster.stop()

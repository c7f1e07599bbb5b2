"""A zkbeat.DatabaseScheduler replica that cannot read its database, among replicas that can (real
``celery beat`` processes of the example project; that replica's DATABASE_URL names a port nobody listens
on): leading, it never announces itself, so `zkbeat health` is not ok on its account; after
zkbeat_stall_timeout it steps out of the line, counted and said once, and a replica that can read the
database leads: every tick once."""

from __future__ import annotations

import signal
import time
import urllib.request
from collections.abc import Callable
from urllib.parse import urlsplit, urlunsplit

import pytest
from kazoo.client import KazooClient

from tests.support.accounting import accounting, assert_clean
from tests.support.djangosupport import ON_THE_DATABASE, DjangoCluster, interval_task
from tests.support.helpers import wait_for
from tests.support.processes import Publish
from tests.support.proxy import TcpProxy
from tests.support.servers import ZooKeeperServer, free_port
from tests.test_cli import zkbeat

pytestmark = [pytest.mark.processes, *ON_THE_DATABASE]

MakeCluster = Callable[..., DjangoCluster]
CANNOT_READ = "cannot read the schedule from the database"
STEPPED_ASIDE = "the schedule has not loaded in 6s as leader"


def published_by(cluster: DjangoCluster, pid: int, entry: str | None = None) -> list[Publish]:
    return [p for p in cluster.publishes(entry) if p.pid == pid]


def unreachable(url: str) -> str:
    """``url`` with a port nobody listens on."""
    parts = urlsplit(url)
    user = f"{parts.username}@" if parts.username else ""
    return urlunsplit(parts._replace(netloc=f"{user}127.0.0.1:{free_port()}"))


def counter(port: int, name: str) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as answer:  # noqa: S310 - loopback
        for line in answer.read().decode().splitlines():
            if line.startswith(name):
                return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} not exported")


def test_a_replica_that_cannot_read_the_database_never_counts_as_leader_and_steps_aside(
    make_cluster: MakeCluster, zk_client: KazooClient, zk_server: ZooKeeperServer, zk_root: str, beat_db: str
) -> None:
    """The replica cut off from the database takes over first: health is not ok while it heads the line, it
    publishes nothing, steps aside within its stall timeout (said once, counted), and the two replicas that
    read the database publish every tick once."""
    interval_task("cleanup", 1)
    interval_task("aggregate", 1, task="jobs.aggregate_analytics")
    port = free_port()
    cluster = make_cluster(0)
    cut_off = cluster.add(
        {
            "DATABASE_URL": unreachable(beat_db),
            "ZKBEAT_STALL_TIMEOUT": "6",
            "ZKBEAT_METRICS_PORT": str(port),
            "ZKBEAT_METRICS_ADDRESS": "127.0.0.1",
        }
    )
    wait_for(lambda: CANNOT_READ in cut_off.log(), timeout=90, message=cut_off.log)
    alone = zkbeat("--hosts", zk_server.hosts, "--root", zk_root, "health")
    assert alone.returncode == 1, alone.stdout + cut_off.log()

    good = [cluster.add(), cluster.add()]
    wait_for(lambda: STEPPED_ASIDE in cut_off.log(), timeout=40, message=cut_off.log)
    wait_for(lambda: sum(len(published_by(cluster, r.pid, "cleanup")) for r in good) >= 5, timeout=90,
             message=cluster.logs)  # fmt: skip
    ok = wait_for(lambda: (h := zkbeat("--hosts", zk_server.hosts, "--root", zk_root, "health")).returncode == 0
                  and h, timeout=30, message=cluster.logs)  # fmt: skip
    assert any(f"ok: {r.identity} leads" in ok.stdout for r in good), ok.stdout
    assert counter(port, "zkbeat_schedule_load_step_downs_total") >= 1
    assert cut_off.log().count(STEPPED_ASIDE) == 1, "said once per episode"
    assert published_by(cluster, cut_off.pid) == []
    report = accounting(cluster, zk_client, intervals={"cleanup": 1, "aggregate": 1})
    assert_clean(report, cluster.logs())


def through(url: str, port: int) -> str:
    """``url`` through a TcpProxy on ``port`` (the user and password kept)."""
    parts = urlsplit(url)
    user = f"{parts.username}:{parts.password}@" if parts.password else (f"{parts.username}@" if parts.username else "")
    return urlunsplit(parts._replace(netloc=f"{user}127.0.0.1:{port}"))


def test_a_leader_keeps_leading_on_its_schedule_through_a_zookeeper_blip_while_the_database_is_down(
    make_cluster: MakeCluster, zk_server: ZooKeeperServer, zk_root: str, beat_db: str
) -> None:
    """A leader whose schedule loaded leads on the schedule it last read when later reads fail; a ZooKeeper
    connection blip its session survives ends and begins its term again under the same candidate (nobody else
    can have led in between), and it goes on leading that schedule: it does not step aside after
    zkbeat_stall_timeout, and `zkbeat health` is ok."""
    interval_task("cleanup", 1)
    pg_port = urlsplit(beat_db).port or 5432
    with TcpProxy(pg_port) as db, TcpProxy(zk_server.port) as zk:
        cluster = make_cluster(0, hosts=zk.hosts, session_timeout=10)
        leader = cluster.add({"DATABASE_URL": through(beat_db, db.port), "ZKBEAT_STALL_TIMEOUT": "6"})

        def published() -> int:
            return len(published_by(cluster, leader.pid, "cleanup"))

        wait_for(lambda: published() >= 3, timeout=60, message=leader.log)
        db.reset()  # the database goes away (connections reset, new ones refused)
        wait_for(lambda: CANNOT_READ in leader.log(), timeout=40, message=leader.log)
        before = published()
        wait_for(lambda: published() >= before + 3, timeout=30, message=leader.log)  # leads on the last schedule

        zk.reset()  # a blip on the ZooKeeper link; the session (10 s) survives it
        time.sleep(0.5)
        zk.heal()
        wait_for(lambda: "as replica-0 again" in leader.log(), timeout=30, message=leader.log)  # the term begins again
        after = published()
        wait_for(lambda: published() >= after + 12, timeout=120, message=leader.log)
        assert STEPPED_ASIDE not in leader.log(), "a leader that had loaded its schedule stepped aside"
        health = zkbeat("--hosts", zk_server.hosts, "--root", zk_root, "health")
        assert health.returncode == 0, health.stdout


def test_a_takeover_that_cannot_read_the_database_publishes_nothing_it_read_when_it_last_led(
    make_cluster: MakeCluster, zk_server: ZooKeeperServer, zk_root: str, beat_db: str
) -> None:
    """A replica that led before, and takes over again after another leader while it cannot read the
    database, does not publish from the schedule it read when it last led (a task disabled since would run):
    it publishes nothing and steps aside after zkbeat_stall_timeout."""
    task = interval_task("cleanup", 1)
    pg_port = urlsplit(beat_db).port or 5432
    with TcpProxy(pg_port) as db:
        cluster = make_cluster(0)
        a = cluster.add({"DATABASE_URL": through(beat_db, db.port), "ZKBEAT_STALL_TIMEOUT": "6"})

        def by_a() -> int:
            return len(published_by(cluster, a.pid, "cleanup"))

        wait_for(lambda: by_a() >= 2, timeout=60, message=a.log)
        b = cluster.add({"ZKBEAT_STALL_TIMEOUT": "6"})
        wait_for(lambda: "joining the election" in b.log(), timeout=60, message=b.log)
        db.reset()  # a's database goes away; b's stays
        wait_for(lambda: CANNOT_READ in a.log(), timeout=40, message=a.log)

        task.enabled = False  # the operator disables the task (as the admin does)
        task.save()
        down = zkbeat("--hosts", zk_server.hosts, "--root", zk_root, "step-down")
        assert down.returncode == 0, down.stdout + down.stderr
        wait_for(lambda: "became leader" in b.log(), timeout=40, message=b.log)
        # b read the rows at its takeover, after the disable: it never publishes cleanup
        disabled_at = by_a()

        b.signal(signal.SIGTERM)  # a, still cut off from its database, takes over again
        wait_for(lambda: a.log().count("became leader") >= 2, timeout=60, message=a.log)
        wait_for(lambda: STEPPED_ASIDE in a.log(), timeout=60, message=a.log)
        assert by_a() == disabled_at, "a task disabled before this takeover was published by it"

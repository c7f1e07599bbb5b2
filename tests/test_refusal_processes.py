"""A replica that refuses to lead steps out of the line, against real ``celery
beat`` replicas: another replica leads at once, and `zkbeat health` is never
ok while nothing is published.

The replica of an older layout is played by this release told that its
layout is 1 (``ZKBEAT_TEST_LAYOUT``), so what is tested is this release's
refusal; its recheck is far off (``ZKBEAT_TEST_LAYOUT_RECHECK``), so a
refusing replica that stayed in line would stall the cluster for the whole
test, not for a moment."""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from kazoo.client import KazooClient

from tests.support.accounting import account
from tests.support.helpers import wait_for
from tests.support.processes import Cluster, Replica
from tests.support.servers import RedisServer, ZooKeeperServer
from tests.test_cli import APP, zkbeat

pytestmark = pytest.mark.processes

SCHEDULE = {"alpha": 1, "beta": 1}
OLDER = {"ZKBEAT_TEST_LAYOUT": "1"}


@pytest.fixture
def cluster(zk_server: ZooKeeperServer, redis_server: RedisServer, zk_root: str, tmp_path: Path) -> Iterator[Cluster]:
    cluster = Cluster(0, zk_hosts=zk_server.hosts, broker=redis_server.url, root=zk_root, schedule=SCHEDULE,
                      log_dir=tmp_path, extra_env={"ZKBEAT_TEST_LAYOUT_RECHECK": "600"})  # fmt: skip
    yield cluster
    cluster.stop()


def health(cluster: Cluster):
    return zkbeat("-A", APP, "health", env=dict(cluster.env))


def refused(replica: Replica, times: int = 1) -> bool:
    return replica.log().count("refusing to lead") >= times


def publishes_by(cluster: Cluster, replica: Replica, since: float = 0.0) -> int:
    return sum(p.pid == replica.pid and p.at > since for p in cluster.publishes())


def test_a_refusing_replica_steps_aside_and_health_tells_the_truth(cluster: Cluster, zk_client: KazooClient,
                                                                   zk_root: str) -> None:  # fmt: skip
    """An older replica at the head of the line refuses (the layout marker) and steps out: health is not ok while
    it is alone, the newer replicas lead as soon as they join and hand over to each other; once every replica
    refuses (a newer marker), health is not ok either."""
    zk_client.ensure_path(f"{zk_root}/v2")
    older = cluster.add(OLDER)
    wait_for(lambda: refused(older), timeout=60, message=cluster.logs)  # a process start on a loaded machine
    alone = health(cluster)
    assert alone.returncode == 1, alone.stdout + cluster.logs()
    assert cluster.publishes() == []

    first, second = cluster.add(), cluster.add()
    wait_for(lambda: publishes_by(cluster, first) + publishes_by(cluster, second) >= 4, timeout=60,
             message=cluster.logs)  # fmt: skip
    leader = cluster.leader()
    assert leader in (first, second)
    ok = wait_for(lambda: (h := health(cluster)).returncode == 0 and h, timeout=20)
    assert f"ok: {leader.identity} leads" in ok.stdout, ok.stdout
    assert publishes_by(cluster, older) == 0

    killed_at = time.time()
    leader.signal(signal.SIGKILL)
    leader.wait()
    other = second if leader is first else first
    wait_for(lambda: publishes_by(cluster, other, killed_at) >= 4, timeout=30, message=cluster.logs)
    assert publishes_by(cluster, older) == 0

    # Now a newer layout is here: the last replica that led refuses too, and nothing publishes.
    zk_client.ensure_path(f"{zk_root}/v3")
    wait_for(lambda: refused(other), timeout=30, message=cluster.logs)
    # It says so first, then ends its term and steps out of the line: health may still find it leading a moment.
    stopped = wait_for(lambda: (h := health(cluster)).returncode != 0 and h, timeout=30,
                       message=lambda: "health stayed ok after every replica refused\n" + cluster.logs())  # fmt: skip
    assert stopped.returncode == 1, stopped.stdout + cluster.logs()
    assert "no leader" in stopped.stderr
    assert all(r.alive for r in cluster.replicas if r is not leader)
    report = account(cluster.publishes(), SCHEDULE, kills=[(leader.pid, killed_at)])
    assert report.twice == 0, report.details()

"""A replica that refuses to lead steps out of the line, against real ``celery
beat`` replicas: another replica leads at once, and `zkbeat health` is never
ok while nothing is published.

The replica of an older layout is played by this release told that its
layout is 1 (``ZKBEAT_TEST_LAYOUT``), so what is tested is this release's
refusal; its recheck is far off (``ZKBEAT_TEST_LAYOUT_RECHECK``), so a
refusing replica that stayed in line would stall the cluster for the whole
test, not for a moment."""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from kazoo.client import KazooClient

from tests.support.accounting import account
from tests.support.faults import candidates
from tests.support.helpers import wait_for
from tests.support.processes import Cluster, Replica
from tests.support.servers import RedisServer, ZooKeeperServer
from tests.test_cli import APP, zkbeat
from tests.test_log_lines import LOG_FORMAT, epoch_of, lines, printed, table

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


def test_a_leader_that_finds_a_newer_layout_hands_over_with_the_documented_line(
    cluster: Cluster, zk_client: KazooClient, zk_root: str
) -> None:
    """docs/operating.md's row "takeover after a newer release's replica": an older replica leads, a newer one is
    behind it, and `<root>/v2` appears (a `pause --force`): the older one refuses and steps out, and the newer one
    takes over saying, at INFO, whom it took over from and why; it publishes on, the older one never again."""
    conf = {"ZKBEAT_TEST_CONF": json.dumps({"worker_log_format": LOG_FORMAT})}
    older = cluster.add({**OLDER, **conf})
    wait_for(lambda: publishes_by(cluster, older) >= 2, timeout=60, message=cluster.logs)
    newer = cluster.add(conf)
    wait_for(lambda: len(candidates(zk_client, zk_root)) == 2, timeout=60, message=cluster.logs)
    epoch = epoch_of(zk_client, zk_root, older.identity)

    zk_client.ensure_path(f"{zk_root}/v2")
    row = table()["takeover after a newer release's replica"]
    took = wait_for(
        lambda: next((line for line in printed(newer, row) if f"after {older.identity} (epoch {epoch}) left" in
                      line.message), None),
        timeout=60,
        # The newer replica's takeover lines at any level first: its log's tail may have scrolled past them.
        message=lambda: "\n".join(f"{line.level} {line.message}" for line in lines(newer)
                                  if "became leader" in line.message) + "\n" + cluster.logs(),
    )  # fmt: skip
    assert took.logger == "zkbeat.events" and f"as {newer.identity} after" in took.message, took
    assert refused(older)
    since = time.time()
    wait_for(lambda: publishes_by(cluster, newer, since) >= 4, timeout=30, message=cluster.logs)
    assert publishes_by(cluster, older, since) == 0
    assert account(cluster.publishes(), SCHEDULE).twice == 0

"""Strangers' unreadable znodes against real ``celery beat`` replicas: another
ZooKeeper user's child of the election, of the trigger inbox or of the ledger,
with an ACL that denies the replicas READ, stops no replica.

The stranger is a kazoo client with a digest identity of its own; each znode
it makes grants only that identity any permission. Handovers after it show
that the election still works around its node, also once that node would
sort first in line."""

from __future__ import annotations

import json
import signal
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from kazoo.client import KazooClient
from kazoo.exceptions import NoAuthError
from kazoo.security import make_digest_acl

from tests.support.accounting import accounting, assert_clean
from tests.support.helpers import wait_for
from tests.support.processes import Cluster
from tests.support.servers import RedisServer, ZooKeeperServer
from tests.test_cli import APP, zkbeat

pytestmark = pytest.mark.processes

SCHEDULE = {f"entry-{i}": 1 for i in range(5)}
STRANGER = [("digest", "stranger:pw")]
STRANGER_ONLY = [make_digest_acl("stranger", "pw", all=True)]


@pytest.fixture
def stranger(zk_server: ZooKeeperServer) -> Iterator[KazooClient]:
    client = KazooClient(zk_server.hosts, auth_data=STRANGER)
    client.start(timeout=15)
    yield client
    client.stop()
    client.close()


@pytest.fixture
def cluster(zk_server: ZooKeeperServer, redis_server: RedisServer, zk_root: str, tmp_path: Path) -> Iterator[Cluster]:
    cluster = Cluster(3, zk_hosts=zk_server.hosts, broker=redis_server.url, root=zk_root, schedule=SCHEDULE,
                      log_dir=tmp_path)  # fmt: skip
    cluster.start()
    wait_for(lambda: set(SCHEDULE) <= {p.entry for p in cluster.publishes()}, timeout=90, message=cluster.logs)
    wait_for(lambda: all("joining the election" in r.log() for r in cluster.replicas), timeout=60)
    yield cluster
    cluster.stop()


def cli(cluster: Cluster, *args: str):
    return zkbeat("-A", APP, *args, env=dict(cluster.env))


def published_since(cluster: Cluster, moment: float) -> dict[str, int]:
    counts = dict.fromkeys(SCHEDULE, 0)
    for p in cluster.publishes():
        if p.at > moment and p.manual is None:
            counts[p.entry] += 1
    return counts


def keeps_publishing(cluster: Cluster, ticks: int = 3) -> None:
    """Every entry publishes ``ticks`` more times from now on."""
    moment = time.time()
    wait_for(lambda: min(published_since(cluster, moment).values()) >= ticks, timeout=30, message=cluster.logs)


def test_unreadable_strangers_stop_no_replica(cluster: Cluster, stranger: KazooClient, zk_client: KazooClient,
                                              zk_root: str) -> None:  # fmt: skip
    """Unreadable children of election/, triggers/ and entries/ made mid-run: every tick once, handovers work,
    run-now requests run, and status/health show the strangers."""
    base = f"{zk_root}/v1"
    # An ephemeral, sequential node nobody can read, named almost as zkbeat names candidates. (One named exactly
    # so is a replica with another zkbeat_auth: it keeps its place, tests/test_credential_rotation.py.)
    lookalike = stranger.create(f"{base}/election/candidate-{uuid.uuid4().hex}-x-", b"{}", acl=STRANGER_ONLY,
                                ephemeral=True, sequence=True)  # fmt: skip
    hidden = stranger.create(f"{base}/election/hidden", b"", acl=STRANGER_ONLY)
    zk_client.ensure_path(f"{base}/triggers")  # as `zkbeat trigger` makes it: the stranger's child is below
    request = stranger.create(f"{base}/triggers/request-", b"{}", acl=STRANGER_ONLY, sequence=True)
    stranger.create(f"{base}/entries/someone-elses", b"{}", acl=STRANGER_ONLY)
    with pytest.raises(NoAuthError):
        zk_client.get(lookalike)  # the replicas' view: no READ
    keeps_publishing(cluster)

    # Two step-downs and a SIGTERM move the stranger's node to the head of the line.
    for _ in range(2):
        moved = cli(cluster, "step-down", "--wait")
        assert moved.returncode == 0, moved.stderr + cluster.logs()
    keeps_publishing(cluster)
    leader = cluster.leader()
    assert leader is not None
    leader.signal(signal.SIGTERM)
    leader.wait()
    line = sorted(zk_client.get_children(f"{base}/election"), key=lambda c: c[-10:])
    assert line[0] == lookalike.rsplit("/", 1)[1], line
    keeps_publishing(cluster)

    health = cli(cluster, "health")
    assert health.returncode == 0, health.stderr
    assert "stranger znode(s) ignored" in health.stdout
    shown = json.loads(cli(cluster, "status", "--json").stdout)
    assert any(lookalike in s and "NoAuth" in s for s in shown["strangers"]), shown["strangers"]
    assert any(hidden in s for s in shown["strangers"]), shown["strangers"]
    assert len(shown["candidates"]) == 2

    triggered = cli(cluster, "trigger", "entry-0", "--json")
    assert triggered.returncode == 0, triggered.stderr + cluster.logs()
    assert stranger.exists(request) is not None, "a request zkbeat may not read was deleted"
    logs = "\n".join(r.log() for r in cluster.replicas)  # whole logs: the lines come at each takeover
    assert f"ignoring {lookalike}" in logs and "may not read it" in logs
    assert f"leaving out the trigger request {request}" in logs
    assert f"ledger znode {base}/entries/someone-elses may not be read by zkbeat" in logs
    assert "stepping down" not in logs, logs
    assert all(r.alive for r in cluster.replicas if r is not leader)
    assert_clean(accounting(cluster, zk_client), cluster.logs())

"""What production throws at a scheduler, each with real processes and servers.

A 3-node ensemble losing the member the leader talks to, losing its quorum,
a leader cut off from ZooKeeper but not from the broker, and a broker
outage. Every test ends with the same accounting (tests/support/accounting.py):
nothing published twice, nothing lost but what the misfire policy skipped
(each skip logged), and who led when.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator

import pytest
from kazoo.client import KazooClient

from tests.support.accounting import accounting, assert_clean
from tests.support.brokers import TestBroker
from tests.support.faults import candidates, leader_session, member_holding
from tests.support.helpers import wait_for
from tests.support.processes import ENTRIES, Cluster, Publish
from tests.support.proxy import TcpProxy
from tests.support.servers import ZooKeeperEnsemble, ZooKeeperServer

pytestmark = pytest.mark.processes

MakeCluster = Callable[..., Cluster]


@pytest.fixture
def ensemble_client(zk_ensemble: ZooKeeperEnsemble) -> Iterator[KazooClient]:
    zk_ensemble.start()  # heal whatever an earlier test in the module broke
    client = KazooClient(zk_ensemble.hosts)
    client.start(timeout=30)
    yield client
    client.stop()
    client.close()


def settle(cluster: Cluster, count: int, since: float, timeout: float = 30) -> list[Publish]:
    """Wait until ``count`` ticks were published after ``since``; return them."""

    def enough() -> list[Publish]:
        rows = [p for p in cluster.publishes() if p.at > since]
        return rows if len(rows) >= count else []

    return wait_for(enough, timeout=timeout, message=lambda: cluster.logs())


def test_ensemble_member_of_the_leader_dies(
    make_cluster: MakeCluster, zk_ensemble: ZooKeeperEnsemble, ensemble_client: KazooClient
) -> None:
    """kill -9 of the ZooKeeper member the leader is connected to: its session moves, it keeps leading, no tick lost."""
    # The replicas know only the two followers, so the member killed is never
    # ZooKeeper's own leader: its session moves without waiting for ZooKeeper
    # to elect one (that stalled past the session once on a loaded machine;
    # an ensemble without a leader is test_quorum_lost_and_back's case).
    zk_leader = zk_ensemble.leader()
    followers = ",".join(m.hosts for m in zk_ensemble.members if m is not zk_leader)
    cluster = make_cluster(3, hosts=followers, session_timeout=6.0).start()
    first = settle(cluster, 6, 0)[0]
    identity, session_id = wait_for(lambda: leader_session(ensemble_client, cluster.root))
    member = wait_for(lambda: member_holding(zk_ensemble, session_id), message="no member holds the leader's session")
    killed_at = time.time()
    member.kill()
    settle(cluster, 3 * 8, killed_at)
    rows = cluster.publishes()
    assert {p.epoch for p in rows} == {first.epoch}, "leadership changed"
    assert {p.identity for p in rows} == {identity}
    assert wait_for(lambda: member_holding(zk_ensemble, session_id)) is not member
    assert_clean(accounting(cluster, ensemble_client), cluster.logs())


QUORUM_OUTAGE = 12.0  # seconds: six session timeouts


def test_quorum_lost_and_back(
    make_cluster: MakeCluster, zk_ensemble: ZooKeeperEnsemble, ensemble_client: KazooClient
) -> None:
    """2 of 3 members down past the session timeout: nobody publishes; then one leader, caught up once or skipped."""
    cluster = make_cluster(
        3,
        hosts=zk_ensemble.hosts,
        extra_env={"ZKBEAT_TEST_ENTRY_OPTIONS": json.dumps({"gamma": {"zkbeat_misfire_grace_time": 2}})},
    ).start()
    settle(cluster, 6, 0)
    lost_members = [m for m in zk_ensemble.members if m is not zk_ensemble.leader()][:1] + [zk_ensemble.leader()]
    for member in lost_members:
        member.kill()
    stopped_at = time.time()
    wait_for(lambda: time.time() - stopped_at > QUORUM_OUTAGE, timeout=QUORUM_OUTAGE + 5)
    restarted_at = time.time()
    zk_ensemble.start()
    settle(cluster, 3 * 6, restarted_at, timeout=60)
    rows = cluster.publishes()
    # kazoo reports SUSPENDED as soon as its member stops serving: allow one in-flight batch.
    assert [p for p in rows if stopped_at + 1 < p.at < restarted_at] == [], "published without a quorum"
    after = [p for p in rows if p.at > restarted_at]
    assert len({p.epoch for p in after}) == 1, "more than one leader after the quorum came back"
    wait_for(lambda: ensemble_client.connected, timeout=30)  # its own session expired too
    report = accounting(cluster, ensemble_client)
    assert_clean(report, cluster.logs())
    # alpha and beta (no grace) catch the outage up once, late; gamma (grace 2 s) skips it, logged.
    late = {entry for entry, _, lateness in report.late if lateness > QUORUM_OUTAGE / 2}
    assert late == {"alpha", "beta"}
    # Past its 2 s grace gamma is skipped once, or again if a loaded machine makes the next pass late too.
    assert {entry for entry, _ in report.skipped} == {"gamma"}


def test_leader_cut_off_from_zookeeper_but_not_from_the_broker(
    make_cluster: MakeCluster, zk_server: ZooKeeperServer, zk_client: KazooClient
) -> None:
    """A partition between the leader and ZooKeeper: it stops, another takes over, and healed it rejoins as follower."""
    with TcpProxy(zk_server.port) as proxy:
        cluster = make_cluster(0, hosts=zk_server.hosts)
        cut = cluster.add({"ZKBEAT_HOSTS": proxy.hosts})
        wait_for(cut.is_leader_by_log, timeout=60, message=cut.log)
        cluster.add()
        cluster.add()
        settle(cluster, 6, 0)
        cut_at = time.time()
        proxy.blackhole()
        heir = settle(cluster, 1, cut_at + 0.5)[0]
        assert heir.identity != cut.identity
        wait_for(lambda: "stopped leading" in cut.log(), timeout=10, message=cut.log)
        assert "connection to ZooKeeper suspended" in cut.log()
        settle(cluster, 3 * 4, heir.at)
        healed_at = time.time()
        proxy.heal()

        def rejoined() -> bool:
            line = candidates(zk_client, cluster.root)
            return any(data.get("identity") == cut.identity for _, data, _ in line[1:])

        wait_for(rejoined, timeout=30, message=lambda: cut.log())
        settle(cluster, 3 * 4, time.time())
    rows = cluster.publishes()
    assert [p for p in rows if p.identity == cut.identity and p.at > cut_at + 0.5] == []
    assert {p.identity for p in rows if p.at > healed_at} == {heir.identity}
    assert cut.alive
    assert_clean(accounting(cluster, zk_client), cluster.logs())


BROKER_OUTAGE = 30.0


def test_broker_outage_under_a_running_leader(
    make_cluster: MakeCluster, zk_server: ZooKeeperServer, zk_client: KazooClient, broker: TestBroker
) -> None:
    """The broker gone for 30 s: beat lives, due ticks go out once when it is back, or are skipped past grace.

    Redis is stopped; RabbitMQ (which the tests never stop) is taken away by
    its proxy: every connection reset, new ones refused.
    """
    cluster = make_cluster(
        2,
        hosts=zk_server.hosts,
        broker=broker.url,
        extra_env={
            "ZKBEAT_TEST_ENTRY_OPTIONS": json.dumps(
                {
                    "alpha": {"zkbeat_misfire_grace_time": BROKER_OUTAGE * 3},
                    "gamma": {"zkbeat_misfire_grace_time": 2},
                }
            )
        },
    ).start()
    first = settle(cluster, 6, 0)[0]
    broker.outage()
    stopped_at = time.time()
    wait_for(lambda: time.time() - stopped_at > BROKER_OUTAGE, timeout=BROKER_OUTAGE + 5)
    restarted_at = time.time()
    broker.restore()
    settle(cluster, 3 * 6, restarted_at, timeout=60)
    assert all(r.alive for r in cluster.replicas), "beat died"
    report = accounting(cluster, zk_client)
    rows = cluster.publishes()
    assert [p for p in rows if stopped_at + 1 < p.at < restarted_at] == []
    assert {p.epoch for p in rows} == {first.epoch}, "the broker outage moved leadership"
    leader = next(r for r in cluster.replicas if r.identity == first.identity).log()
    # kombu's retry policy waited for the broker; claims were not made and
    # withdrawn again every second (at most the batch in flight when it went).
    assert leader.count("it is written back") <= len(ENTRIES), leader
    assert "broker reachable again" in leader
    assert_clean(report, cluster.logs())
    late = {entry for entry, _, lateness in report.late if lateness > BROKER_OUTAGE / 2}
    assert late == {"alpha", "beta"}
    # Past its 2 s grace gamma is skipped once, or again if a loaded machine makes the next pass late too.
    assert {entry for entry, _ in report.skipped} == {"gamma"}

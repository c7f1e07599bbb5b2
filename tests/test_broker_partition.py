"""A leader cut off from the broker but not from ZooKeeper: real beat processes, a TCP proxy on the broker link.

When only the leader's link is black-holed (one node's DNS, route or
NetworkPolicy gone wrong) it hands leadership to a replica that reaches the
broker, within ``zkbeat_broker_handover_timeout`` plus a small constant.
When every replica is cut (a real broker outage) nobody can do better:
leadership stays put, with no rotation, and publishing resumes once the
broker is back. Every scenario ends with the accounting of
tests/support/accounting.py: nothing twice, nothing lost but a publish
logged as sent without an answer.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from kazoo.client import KazooClient

from tests.support.accounting import accounting
from tests.support.faults import candidates
from tests.support.helpers import wait_for
from tests.support.processes import Cluster, Publish, Replica, leader_epochs
from tests.support.proxy import TcpProxy
from tests.support.servers import RedisServer, ZooKeeperServer
from tests.test_controls_upgrade import OldReplica, previous_release  # noqa: F401 - the fixture
from zkbeat.coordination.broker_handover import DATA_KEY

pytestmark = pytest.mark.processes

ENTRIES = {"alpha": 1, "beta": 1}
#: zkbeat_broker_handover_timeout here: short, so the test is short.
HANDOVER = 3.0
#: What a takeover may add to it: the failing publish's reply timeout, a pass's broker wait, a probe, a loaded host.
SLACK = 20.0
#: Beat's Redis reply timeout here (the user's setting wins over zkbeat's 10 s): a cut publish fails sooner.
CONF = {
    "zkbeat_broker_handover_timeout": HANDOVER,
    "broker_transport_options": {"socket_timeout": 2, "socket_connect_timeout": 2},
}
ASKED_LINE = "asking the next replica in line that reaches it"
#: A wait that spans a replica's start (two at once, on a loaded 2-core machine: 10-20 s each is seen).
START = 60


@pytest.fixture
def proxy(redis_server: RedisServer) -> Iterator[TcpProxy]:
    made = TcpProxy(redis_server.port).start()
    yield made
    made.close()


@pytest.fixture
def cluster(zk_server: ZooKeeperServer, redis_server: RedisServer, zk_root: str, tmp_path: Path) -> Iterator[Cluster]:
    made = Cluster(
        0,
        zk_hosts=zk_server.hosts,
        broker=redis_server.url,
        record_url=redis_server.url,  # the record goes straight to Redis, whatever the broker link does
        root=zk_root,
        schedule=ENTRIES,
        log_dir=tmp_path,
        session_timeout=10.0,
        extra_env={"ZKBEAT_TEST_CONF": json.dumps(CONF)},
    )
    yield made
    made.stop()


def publishes_by(cluster: Cluster, pid: int, since: float = 0.0) -> list[Publish]:
    return [p for p in cluster.publishes() if p.pid == pid and p.at > since]


def line(client: KazooClient, root: str) -> list[str]:
    return [name for name, _, _ in candidates(client, root)]


def test_a_leader_cut_off_from_the_broker_hands_over_to_a_replica_that_reaches_it(
    cluster: Cluster, proxy: TcpProxy, zk_client: KazooClient, zk_root: str
) -> None:
    """The leader's broker link black-holed: another replica publishes within the setting plus a constant; once each."""
    cut = cluster.add({"ZKBEAT_TEST_BROKER": f"redis://127.0.0.1:{proxy.port}/0"})
    wait_for(lambda: publishes_by(cluster, cut.pid), timeout=START, message=cluster.logs)
    cluster.add()
    cluster.add()
    wait_for(lambda: len(line(zk_client, zk_root)) == 3, timeout=START, message=cluster.logs)
    wait_for(lambda: len(publishes_by(cluster, cut.pid)) >= 4, timeout=20, message=cluster.logs)
    cut_at = time.time()
    proxy.blackhole()

    def other_publishes() -> Publish | None:
        return next((p for p in cluster.publishes() if p.pid != cut.pid and p.at > cut_at), None)

    taken = wait_for(other_publishes, timeout=HANDOVER + SLACK, message=cluster.logs)
    # The cut leader asked, an answer came, its own probe failed again: it handed over (and says so).
    wait_for(lambda: "handing leadership to replica-" in cut.log(), timeout=30, message=cut.log)
    assert cut.alive and ASKED_LINE in cut.log()
    # The successor says why the leader left (its departure note), not that it crashed.
    heir = next(r for r in cluster.replicas if r.pid == taken.pid)
    became = wait_for(lambda: [ln for ln in heir.log().splitlines() if "became leader" in ln], timeout=10)
    assert "broker unreachable" in became[-1] and "crashed" not in became[-1], became[-1]
    wait_for(lambda: len(publishes_by(cluster, taken.pid)) >= 4, timeout=20, message=cluster.logs)
    proxy.heal()
    healed_at = time.time()
    wait_for(lambda: len(publishes_by(cluster, taken.pid, healed_at)) >= 4, timeout=20, message=cluster.logs)
    # The cut leader published nothing after the takeover; it queues again, at the back.
    assert publishes_by(cluster, cut.pid, taken.at) == []
    assert line(zk_client, zk_root)[-1] in [name for name, data, _ in candidates(zk_client, zk_root)
                                            if data.get("pid") == cut.pid]  # fmt: skip
    report = accounting(cluster, zk_client)
    assert report.twice == 0, report.details()
    assert report.lost_unexplained == [] and report.unpublished_claims == [], report.details() + cluster.logs()
    assert len(report.leaders) == 2, "one handover"


def test_in_a_real_broker_outage_leadership_stays_put(
    cluster: Cluster, proxy: TcpProxy, zk_client: KazooClient, zk_root: str
) -> None:
    """Every replica cut from the broker: the leader asks, nobody can take over, no handover; back, nothing twice."""
    cluster.env["ZKBEAT_TEST_BROKER"] = f"redis://127.0.0.1:{proxy.port}/0"
    leader = cluster.add()
    wait_for(lambda: publishes_by(cluster, leader.pid), timeout=START, message=cluster.logs)
    cluster.add()
    cluster.add()
    wait_for(lambda: len(line(zk_client, zk_root)) == 3, timeout=START, message=cluster.logs)
    wait_for(lambda: len(publishes_by(cluster, leader.pid)) >= 4, timeout=20, message=cluster.logs)
    before = line(zk_client, zk_root)
    last = f"{zk_root}/v1/election/{before[-1]}"
    cut_at = time.time()
    proxy.blackhole()
    # The question went down the whole line twice (the leader asks again while it stays cut):
    # the last replica passed it on twice, writing its own candidate's data each time.
    wait_for(lambda: zk_client.get(last)[1].version >= 2, timeout=4 * HANDOVER + 2 * SLACK, message=cluster.logs)
    assert "neither does this replica" in cluster.logs()
    assert line(zk_client, zk_root) == before, "the line changed in an outage nobody could do better in"
    proxy.heal()
    healed_at = time.time()
    wait_for(lambda: len(publishes_by(cluster, leader.pid, healed_at)) >= 4, timeout=30, message=cluster.logs)
    assert line(zk_client, zk_root) == before
    assert [p for p in cluster.publishes() if p.at > cut_at and p.pid != leader.pid] == []
    report = accounting(cluster, zk_client)
    assert report.twice == 0, report.details()
    assert report.lost_unexplained == [] and report.unpublished_claims == [], report.details() + cluster.logs()
    assert len({p.epoch for p in cluster.publishes()}) == 1, "leadership moved"
    assert len(leader_epochs(r.log() for r in cluster.replicas)) == 1, "someone else became leader"


def _cut_leader_with_two_behind(cluster: Cluster, proxy: TcpProxy, zk_client: KazooClient, zk_root: str,
                                second: Callable[[], Replica]) -> Replica:  # fmt: skip
    """A leader whose broker link goes through ``proxy``, ``second()`` behind it, then a replica of this release."""
    cut = cluster.add({"ZKBEAT_TEST_BROKER": f"redis://127.0.0.1:{proxy.port}/0"})
    wait_for(lambda: publishes_by(cluster, cut.pid), timeout=START, message=cluster.logs)
    made = second()
    wait_for(lambda: "joining the election" in made.log(), timeout=START, message=made.log)
    cluster.add()
    wait_for(lambda: len(line(zk_client, zk_root)) == 3, timeout=START, message=cluster.logs)
    wait_for(lambda: len(publishes_by(cluster, cut.pid)) >= 4, timeout=20, message=cluster.logs)
    return cut


def _stays_put(cluster: Cluster, proxy: TcpProxy, zk_client: KazooClient, zk_root: str, cut: Replica,
               until: Callable[[], object]) -> None:  # fmt: skip
    """Black-hole the leader's link until ``until()``: nobody takes over; healed, it publishes again, nothing twice."""
    before = line(zk_client, zk_root)
    cut_at = time.time()
    proxy.blackhole()
    wait_for(until, timeout=4 * HANDOVER + 2 * SLACK, message=cluster.logs)
    assert line(zk_client, zk_root) == before, "the line changed"
    assert "handing leadership" not in cluster.logs()
    proxy.heal()
    healed_at = time.time()
    wait_for(lambda: len(publishes_by(cluster, cut.pid, healed_at)) >= 4, timeout=30, message=cluster.logs)
    assert [p for p in cluster.publishes() if p.at > cut_at and p.pid != cut.pid] == []
    report = accounting(cluster, zk_client)
    assert report.twice == 0, report.details()
    assert report.lost_unexplained == [] and report.unpublished_claims == [], report.details() + cluster.logs()


def test_a_timeout_of_0_turns_the_broker_handover_off(
    cluster: Cluster, proxy: TcpProxy, zk_client: KazooClient, zk_root: str
) -> None:
    """zkbeat_broker_handover_timeout = 0: the cut leader asks nobody (no question in its candidate) and waits out its
    link, though the replicas behind it reach the broker."""
    cluster.env["ZKBEAT_TEST_CONF"] = json.dumps({**CONF, "zkbeat_broker_handover_timeout": 0})
    cut = _cut_leader_with_two_behind(cluster, proxy, zk_client, zk_root, cluster.add)
    started = time.monotonic()

    def long_past_a_handover() -> bool:
        # As long as the test with the setting on waits for a handover at most.
        return time.monotonic() - started > HANDOVER + SLACK

    _stays_put(cluster, proxy, zk_client, zk_root, cut, long_past_a_handover)
    assert all(DATA_KEY not in data for _, data, _ in candidates(zk_client, zk_root))
    assert ASKED_LINE not in cut.log()


def test_a_replica_of_an_older_release_next_in_line_stops_the_question(
    cluster: Cluster, proxy: TcpProxy, zk_client: KazooClient, zk_root: str, tmp_path: Path,
    previous_release: Path,  # noqa: F811 - the fixture imported above
) -> None:  # fmt: skip
    """The cut leader's successor runs the previous release (no broker handover): it neither answers nor passes the
    question on, so the replica of this release behind it, which reaches the broker, is never asked; leadership stays
    put and the leader asks again each timeout, until its link heals."""

    def old() -> Replica:
        made = OldReplica("old-0", cluster.env, tmp_path)
        made.tree = previous_release
        cluster.replicas.append(made)
        return made.start()

    cut = _cut_leader_with_two_behind(cluster, proxy, zk_client, zk_root, old)
    mine = f"{zk_root}/v1/election/{line(zk_client, zk_root)[0]}"
    # Asked twice: the first question and one more a timeout later (each ask rewrites its candidate's data).
    _stays_put(cluster, proxy, zk_client, zk_root, cut, lambda: zk_client.get(mine)[1].version >= 2)
    assert ASKED_LINE in cut.log()
    third = cluster.replicas[-1]
    assert "has not reached the broker since" not in third.log(), "the question went past the older replica"

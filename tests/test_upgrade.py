"""Rolling upgrades: a replica steps aside for a newer layout, and the leader
reports a replica whose schedule differs from its own.

In-process schedulers against the real ZooKeeper and Redis, plus one test with
real ``celery beat`` processes. The "newer release" is played by the test: a
``<root>/v<LAYOUT + 1>`` it creates, or a candidate whose data says ``"layout": LAYOUT + 1``.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

import pytest
from kazoo.client import KazooClient

from tests.support.accounting import account
from tests.support.faults import candidates
from tests.support.helpers import Published, every, wait_for
from tests.support.processes import Cluster
from tests.support.servers import RedisServer, ZooKeeperServer
from zkbeat import LeaderElection, Scheduler
from zkbeat.coordination.peers import LAYOUT, schedule_hash
from zkbeat.leading import leadership
from zkbeat.ledger.clock import measure_skew


def own_candidate(client: KazooClient, scheduler: Scheduler) -> dict:
    raw, _ = client.get(wait_for(lambda: scheduler.election.candidate))
    return json.loads(raw)


def run_ticks(scheduler: Scheduler, seconds: float) -> None:
    """Drive the beat loop by hand for a while (tick() sleeps are capped short)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        time.sleep(min(scheduler.tick(), 0.1))


def test_candidate_data_says_its_layout_and_schedule_hash(make_scheduler, zk_client: KazooClient) -> None:
    """Each candidate znode carries this release's layout and a hash that changes with the schedule and only with it."""
    first = make_scheduler({"a": every(1, "x"), "b": every(5)})
    same = make_scheduler({"b": every(5), "a": every(1, "x")})
    other = make_scheduler({"a": every(1, "y"), "b": every(5)})
    datas = [own_candidate(zk_client, s) for s in (first, same, other)]
    assert [d["layout"] for d in datas] == [LAYOUT] * 3
    assert datas[0]["schedule_hash"] == schedule_hash(first.schedule)
    assert datas[0]["schedule_hash"] == datas[1]["schedule_hash"]
    assert datas[0]["schedule_hash"] != datas[2]["schedule_hash"]


def test_a_newer_layout_directory_makes_a_replica_refuse_to_lead(
    make_scheduler, zk_client: KazooClient, zk_root: str, published: Published, caplog, monkeypatch
) -> None:
    """With a newer <root>/v<N> the elected replica publishes and records nothing, says why, leads once it is gone."""
    monkeypatch.setattr(leadership, "LAYOUT_RECHECK", 1.0)
    newer = f"v{LAYOUT + 1}"
    zk_client.ensure_path(f"{zk_root}/{newer}/entries")
    scheduler = make_scheduler({"tidy": every(0.2)})
    with caplog.at_level(logging.ERROR, logger="zkbeat"):
        assert scheduler.election.wait_for_leadership(timeout=15)
        run_ticks(scheduler, 2.0)
    assert published.headers == []
    assert zk_client.exists(f"{zk_root}/v1/entries/tidy") is None
    refusals = [r.getMessage() for r in caplog.records if "refusing to lead" in r.getMessage()]
    assert refusals and f"{zk_root}/{newer}" in refusals[0] and f"newer zkbeat layout ({newer})" in refusals[0]
    zk_client.delete(f"{zk_root}/{newer}", recursive=True)  # the rollback, done
    wait_for(lambda: scheduler.tick() is not None and published.headers, timeout=15)
    assert zk_client.exists(f"{zk_root}/v1/entries/tidy") is not None


def test_a_leader_steps_aside_for_a_newer_release_in_its_line(
    make_scheduler, zk_client: KazooClient, zk_root: str, published: Published
) -> None:
    """A candidate of a newer layout joins the line: the leading replica stops publishing and the newer one leads."""
    scheduler = make_scheduler({"tidy": every(0.2)})
    assert scheduler.election.wait_for_leadership(timeout=15)
    wait_for(lambda: scheduler.tick() is not None and published.headers, timeout=10)
    newer = LeaderElection(zk_client, scheduler.election.path, {"identity": "newer-replica", "layout": LAYOUT + 1})
    newer.start()
    try:
        assert wait_for(lambda: scheduler.tick() is not None and newer.is_leader, timeout=15)
        sent = len(published.headers)
        run_ticks(scheduler, 1.5)
        assert len(published.headers) == sent, "an older replica published beside a newer release"
        assert not scheduler.election.is_leader
    finally:
        newer.close()


def test_the_leader_reports_a_candidate_whose_schedule_differs(make_scheduler, zk_client: KazooClient, caplog) -> None:
    """A follower with another beat_schedule is named in the leader's log, once; one with the same is not."""
    leader = make_scheduler({"a": every(1)}, identity="old-config")
    assert leader.election.wait_for_leadership(timeout=15)
    with caplog.at_level(logging.WARNING, logger="zkbeat"):
        run_ticks(leader, 0.5)
        make_scheduler({"a": every(1)}, identity="same-config")
        changed = make_scheduler({"a": every(2)}, identity="new-config")
        wait_for(lambda: changed.election.candidate, timeout=10)

        def reported() -> list[str]:
            leader.tick()
            return [r.getMessage() for r in caplog.records if "runs a different schedule" in r.getMessage()]

        lines = wait_for(reported, timeout=10)
        run_ticks(leader, 1.0)
    assert len(reported()) == 1
    assert "new-config" in lines[0] and own_candidate(zk_client, changed)["schedule_hash"] in lines[0]
    assert "same-config" not in lines[0]


def test_clock_skew_is_measured_against_a_znode_mtime(zk_client: KazooClient, zk_root: str) -> None:
    """measure_skew finds a clock 60 s fast or 5 s slow, and calls a synchronised one fine."""
    path = f"{zk_root}/v1/clock"
    fast = measure_skew(zk_client, path, "t", now=lambda: time.time() + 60)
    slow = measure_skew(zk_client, path, "t", now=lambda: time.time() - 5)
    fine = measure_skew(zk_client, path, "t")
    assert 59 < fast.seconds < 61 and fast.worth_a_warning and "ahead of" in fast.describe()
    assert -6 < slow.seconds < -4 and slow.worth_a_warning and "behind" in slow.describe()
    assert abs(fine.seconds) < 1 and not fine.worth_a_warning


@pytest.mark.processes
def test_rolling_upgrade_with_real_replicas(
    redis_server: RedisServer, zk_server: ZooKeeperServer, zk_client: KazooClient, zk_root: str, tmp_path: Path
) -> None:
    """Real replicas: the leader reports a changed schedule; a newer release in line makes them all step aside."""
    schedule = {"alpha": 1, "beta": 1}
    cluster = Cluster(
        2, zk_hosts=zk_server.hosts, broker=redis_server.url, root=zk_root, schedule=schedule, log_dir=tmp_path
    )
    try:
        cluster.start()
        wait_for(lambda: len(cluster.publishes()) >= 4, timeout=60, message=lambda: cluster.logs())
        leader = cluster.leader()
        changed = cluster.add({"ZKBEAT_TEST_SCHEDULE": json.dumps({"alpha": 1, "beta": 2})})
        wait_for(lambda: "runs a different schedule" in leader.log(), timeout=60, message=leader.log)
        assert changed.identity in leader.log()
        newer = zk_client.create(
            f"{zk_root}/v1/election/candidate-{'0' * 32}-",
            json.dumps({"identity": "newer-replica", "layout": LAYOUT + 1}).encode(),
            ephemeral=True,
            sequence=True,
        )
        wait_for(lambda: candidates(zk_client, zk_root)[0][0] == newer.rsplit("/", 1)[1], timeout=30)
        stepped_aside = time.time()
        wait_for(lambda: time.time() - stepped_aside > 3, timeout=5)
        rows = cluster.publishes()
        assert [p for p in rows if p.at > stepped_aside] == [], "an older replica published beside a newer release"
        assert all(r.alive for r in cluster.replicas)
        assert any("refusing to lead" in r.log() and "newer-replica" in r.log() for r in cluster.replicas)
        report = account(rows, schedule)
        assert report.twice == 0 and report.lost == [], report.details()
    finally:
        cluster.stop()

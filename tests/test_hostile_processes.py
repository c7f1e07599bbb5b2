"""Bad entries under real ``celery beat`` replicas: one entry whose schedule
raises and one routed to a queue that does not exist leave the leader leading
and every other tick published exactly once."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from tests.support.accounting import account
from tests.support.helpers import wait_for
from tests.support.processes import Cluster, leader_epochs
from tests.support.servers import RedisServer, ZooKeeperServer

pytestmark = pytest.mark.processes


def test_bad_entries_leave_the_leader_leading_and_the_rest_on_time(
    redis_server: RedisServer, zk_server: ZooKeeperServer, zk_root: str, tmp_path: Path
) -> None:
    """Three replicas, a raising entry and a queue routed nowhere: one leader throughout, good ticks each once."""
    cluster = Cluster(
        3,
        zk_hosts=zk_server.hosts,
        broker=redis_server.url,
        root=zk_root,
        schedule={"alpha": 1, "beta": 1, "nowhere": 1},
        log_dir=tmp_path,
        extra_env={
            "ZKBEAT_TEST_RAISING": json.dumps(["broken"]),
            "ZKBEAT_TEST_ENTRY_OPTIONS": json.dumps({"nowhere": {"queue": "nowhere"}}),
            "ZKBEAT_TEST_CONF": json.dumps(
                {"task_create_missing_queues": False, "task_queues": {"celery": {"routing_key": "celery"}}}
            ),
        },
    )
    try:
        cluster.start()
        wait_for(lambda: cluster.publishes(), timeout=30, message=cluster.logs)
        started = time.monotonic()
        wait_for(lambda: time.monotonic() - started > 10, timeout=20)
        publishes = [p for p in cluster.publishes() if p.entry in ("alpha", "beta")]
        logs = [r.log() for r in cluster.replicas]
    finally:
        cluster.stop()
    report = account(publishes, {"alpha": 1, "beta": 1})
    assert report.ok() and report.lost == [], report.details()
    assert min(sum(p.entry == n for p in publishes) for n in ("alpha", "beta")) >= 9
    assert len(leader_epochs(logs)) == 1, "no leadership ping-pong"
    assert sum(log.count("leaving out 'broken'") for log in logs) == 1
    assert sum(log.count("nowhere (slot") for log in logs) >= 9, "each tick of nowhere is logged as dropped"
    assert not any("broker unreachable" in log or "unexpected error" in log for log in logs)

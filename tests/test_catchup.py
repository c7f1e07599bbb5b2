"""The catch-up policy: ``all`` publishes every slot a ZooKeeper outage missed,
once and in order; ``once`` and ``skip`` behave as before; past the limit
``all`` refuses and says why."""

from __future__ import annotations

import json
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from celery import Celery
from celery.beat import ScheduleEntry

from tests.support.helpers import wait_for
from tests.support.processes import Cluster
from tests.support.servers import RedisServer, ZooKeeperServer
from zkbeat.ticking.catchup import decide, policy_for

OUTAGE = 10.0


@pytest.mark.processes
def test_a_zookeeper_outage_is_caught_up_per_policy(zk_server_private: ZooKeeperServer, redis_server: RedisServer,
                                                    zk_root: str, tmp_path: Path) -> None:  # fmt: skip
    """After a 10 s outage a 1 s 'all' entry publishes each missed slot once, in order; 'once' one late run; 'skip' none."""  # noqa: E501
    options = {"every": {"zkbeat_catchup": "all"}, "skipped": {"zkbeat_catchup": "skip"}}
    cluster = Cluster(2, zk_hosts=zk_server_private.hosts, broker=redis_server.url, root=zk_root,
                      schedule={"every": 1, "coalesced": 1, "skipped": 1}, log_dir=tmp_path,
                      extra_env={"ZKBEAT_TEST_ENTRY_OPTIONS": json.dumps(options)})  # fmt: skip
    try:
        cluster.start()
        wait_for(lambda: {"every", "coalesced", "skipped"} <= {p.entry for p in cluster.publishes()}, timeout=30,
                 message=cluster.logs)  # fmt: skip
        zk_server_private.stop()
        stopped_at = time.time()
        wait_for(lambda: time.time() - stopped_at > OUTAGE, timeout=OUTAGE + 5)
        zk_server_private.start()
        restarted_at = time.time()
        wait_for(lambda: sum(p.entry == "skipped" and p.at > restarted_at for p in cluster.publishes()) >= 3,
                 timeout=60, message=cluster.logs)  # fmt: skip
        rows = cluster.publishes()
    finally:
        cluster.stop()

    every = [p for p in rows if p.entry == "every"]
    slots = [p.slot for p in every]
    assert slots == sorted(slots), "missed slots published out of order"
    assert len(slots) == len(set(slots)), "a slot was published twice"
    steps = {b - a for a, b in zip(slots, slots[1:])}
    assert steps == {timedelta(seconds=1)}, f"a slot was left out: steps {sorted(steps)}"
    assert sum(restarted_at - OUTAGE < p.slot.timestamp() < restarted_at for p in every) >= OUTAGE - 2

    def late_runs(name: str) -> list:
        return [p for p in rows if p.entry == name and p.at - p.slot.timestamp() > OUTAGE / 2]

    assert len(late_runs("coalesced")) == 1, "'once' must run the outage's ticks as one"
    assert late_runs("skipped") == [], "'skip' must not run a missed tick"
    assert any("zkbeat: skipping skipped: its tick at" in r.log() for r in cluster.replicas)


def entry(name: str, seconds: float, behind: float, options: dict | None = None) -> ScheduleEntry:
    app = Celery("catchup", set_as_current=False)
    return ScheduleEntry(
        name=name,
        task="t",
        schedule=timedelta(seconds=seconds),
        last_run_at=datetime.now(timezone.utc) - timedelta(seconds=behind),
        options=options or {},
        app=app,
    )


def test_all_refuses_past_its_limit_and_says_why() -> None:
    """'all' with 150 slots missed and a limit of 100 publishes none and names the limit; 50 missed run one by one."""
    now = datetime.now(timezone.utc)
    far = entry("far", 1, 150)
    decision = decide(far, far.last_run_at + timedelta(seconds=1), now, "all", None, 100)
    assert decision.skip and decision.advance_to is None and "more than 100" in decision.why
    near = entry("near", 1, 50)
    slot = near.last_run_at + timedelta(seconds=1)
    decision = decide(near, slot, now, "all", None, 100)
    assert not decision.skip and decision.advance_to == slot


def test_an_invalid_entry_policy_is_logged_and_the_setting_used(caplog) -> None:
    """options={'zkbeat_catchup': 'sometimes'} logs an error naming the entry and falls back to the setting."""
    assert policy_for(entry("odd", 1, 0, {"zkbeat_catchup": "sometimes"}), "once") == "once"
    assert "odd.options.zkbeat_catchup" in caplog.text
    assert policy_for(entry("fine", 1, 0, {"zkbeat_catchup": "ALL"}), "once") == "all"


def test_a_database_row_sets_its_policy_in_its_headers() -> None:
    """A django-celery-beat row's headers {'zkbeat_catchup': 'skip'} set its policy, and never reach the message."""
    from zkbeat.ticking.ticks import message_options

    row = entry("row", 1, 0, {"headers": {"zkbeat_catchup": "skip", "x-team": "ops"}})
    assert policy_for(row, "once") == "skip"
    sent = message_options(row, "/zkbeat/t", datetime.now(timezone.utc), 3)
    assert "zkbeat_catchup" not in sent["headers"] and sent["headers"]["x-team"] == "ops"

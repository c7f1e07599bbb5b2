"""zkbeat.DatabaseScheduler's answer to "can the schedule be read now?", asked of a replica marked unready
(in-process, real PostgreSQL, ZooKeeper and Redis; the database made unreachable for real): no while the
database refuses connections, so the mark stays; yes once it answers, so the mark goes without the
replica having to lead first."""

from __future__ import annotations

import pytest
from kazoo.client import KazooClient

import zkbeat.leading.leadership as leadership_module
import zkbeat.leading.sharded as sharded_module
from tests.support.djangosupport import ON_THE_DATABASE, database_unreachable, interval_task
from tests.support.helpers import wait_for
from zkbeat.coordination.shards import unready_path

pytestmark = ON_THE_DATABASE


def test_the_database_scheduler_says_its_schedule_is_readable_only_while_the_database_answers(make_scheduler) -> None:
    interval_task("canary", 60)
    scheduler = make_scheduler()
    with database_unreachable():
        assert scheduler.schedule_readable() is False
    assert scheduler.schedule_readable() is True


def test_a_database_replica_marked_unready_unmarks_itself_once_the_database_answers(
    make_scheduler, zk_client: KazooClient, zk_root: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Alone in the lines of 2 shards with its database down: it leads, its schedule does not load, it steps
    aside after zkbeat_stall_timeout and marks itself unready; the mark stays while the database is down and
    goes once it answers, while the replica is still out of the lines (LOAD_RECHECK an hour here)."""
    monkeypatch.setattr(leadership_module, "LOAD_RECHECK", 3600.0)
    monkeypatch.setattr(sharded_module, "READY_PROBE", 0.2)
    interval_task("canary", 60)
    scheduler = make_scheduler(zkbeat_shards=2, zkbeat_stall_timeout=5.5)
    scheduler.wait_in_tick = False
    mark = f"{unready_path(zk_root)}/{scheduler._replica}"

    def ticked(until):
        def step():
            scheduler.tick()
            return until()

        return step

    with database_unreachable():
        wait_for(ticked(lambda: zk_client.exists(mark)), timeout=60, interval=0.05, message="no unready mark")
        probes = []
        readable = scheduler.schedule_readable
        scheduler.schedule_readable = lambda: probes.append(readable()) or probes[-1]
        wait_for(ticked(lambda: len(probes) >= 3), timeout=30, interval=0.05, message="never asked")
        assert probes[:3] == [False, False, False]
        assert zk_client.exists(mark) is not None
    wait_for(ticked(lambda: zk_client.exists(mark) is None), timeout=30, interval=0.05, message="the mark stayed")
    assert all(s.election.leadership is None for s in scheduler._shards)  # out of the lines all along

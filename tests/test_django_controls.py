"""Operator controls on django-celery-beat rows, with real ``celery beat --scheduler zkbeat.DatabaseScheduler``
replicas on PostgreSQL and the real ``zkbeat -A proj`` command, run as an operator runs it.

What is counted is what the replicas handed to the broker (recorded from
``after_task_publish``), with the accounting of tests/support/accounting.py.
"""

from __future__ import annotations

import json
import signal
import subprocess
import time
from collections.abc import Callable
from datetime import datetime

import pytest
from kazoo.client import KazooClient

from tests.support.accounting import accounting, assert_clean
from tests.support.djangosupport import EXAMPLE_PROJECT, ON_THE_DATABASE, DjangoCluster, interval_task
from tests.support.faults import ledger_slots
from tests.support.helpers import wait_for
from tests.support.processes import ROOT, SESSION, Publish
from tests.test_cli import zkbeat

pytestmark = [pytest.mark.processes, *ON_THE_DATABASE]

MakeCluster = Callable[..., DjangoCluster]
NOTE = "db migration, back at 3pm"


def operator(cluster: DjangoCluster, *args: str) -> subprocess.CompletedProcess:
    """``zkbeat -A proj ARGS`` with the replicas' own settings (the example project's, from the environment)."""
    return zkbeat("-A", "proj", *args, env={**cluster.env, "PYTHONPATH": f"{ROOT}:{EXAMPLE_PROJECT}"})


def records(cluster: DjangoCluster) -> list[dict]:
    """Every publish as recorded, with its zkbeat-manual header (None for a scheduled tick)."""
    return [json.loads(raw) for raw in cluster.redis.lrange(cluster.record_key, 0, -1)]


def scheduled(cluster: DjangoCluster, name: str, after: datetime, pid: int | None = None) -> list[Publish]:
    """Scheduled (not triggered) publishes of ``name`` for slots after ``after``, by ``pid`` if given."""
    return [p for p in cluster.publishes(name) if p.slot > after and p.manual is None and pid in (None, p.pid)]


def test_pause_trigger_and_resume_a_row_across_a_kill_9(
    make_cluster: MakeCluster, zk_client: KazooClient, zk_root: str
) -> None:
    """A paused row publishes nothing on the leader nor, after its kill -9, on the next; a trigger runs it
    once meanwhile, and the command returns once that run is published; a resume brings it back; the
    other row runs throughout; nothing is published twice."""
    interval_task("held", 1)
    interval_task("steady", 1, task="jobs.aggregate_analytics")
    cluster = make_cluster(3).start()
    wait_for(lambda: {"held", "steady"} <= {p.entry for p in cluster.publishes()}, timeout=40, message=cluster.logs)
    first = cluster.replica(cluster.publishes("steady")[-1].pid)

    paused = operator(cluster, "pause", "held", "--note", NOTE, "--json")
    assert paused.returncode == 0, paused.stderr
    assert json.loads(paused.stdout)["paused"]["note"] == NOTE
    held_slot = ledger_slots(zk_client, zk_root)["held"]  # the last tick of held claimed before the pause
    shown = operator(cluster, "status")
    assert shown.returncode == 0, shown.stderr
    print(shown.stdout)
    assert "paused (1):" in shown.stdout and "held: by " in shown.stdout and NOTE in shown.stdout
    wait_for(lambda: len(scheduled(cluster, "steady", held_slot, first.pid)) >= 3, timeout=20, message=cluster.logs)
    assert scheduled(cluster, "held", held_slot) == [], "the leader published a paused row"
    assert "held is paused (by " in first.log()

    killed_at = time.time()
    first.signal(signal.SIGKILL)
    first.wait()
    heir = cluster.replica(
        wait_for(
            lambda: next((p for p in cluster.publishes("steady") if p.pid != first.pid and p.at > killed_at), None),
            timeout=SESSION + 20,
            message=cluster.logs,
        ).pid
    )
    wait_for(lambda: len(scheduled(cluster, "steady", held_slot, heir.pid)) >= 3, timeout=20, message=cluster.logs)
    assert scheduled(cluster, "held", held_slot) == [], "the next leader published a paused row"
    assert ledger_slots(zk_client, zk_root)["held"] == held_slot
    assert "held is paused (by " in heir.log()

    triggered = operator(cluster, "trigger", "held", "--json")
    returned = records(cluster)  # read the moment the command is back: the run must be there already
    assert triggered.returncode == 0, triggered.stderr + cluster.logs()
    done = json.loads(triggered.stdout)
    manual = [r for r in returned if r["manual"] == done["request"]]
    assert len(manual) == 1, "the command returned before the run was published"
    assert manual[0]["entry"] == "held" and manual[0]["pid"] == heir.pid
    assert manual[0]["task_id"] == done["published"]["task_id"]
    assert scheduled(cluster, "held", held_slot) == [], "a trigger is one run, not a resume"

    resumed_at = time.time()
    resumed = operator(cluster, "resume", "held", "--json")
    assert resumed.returncode == 0, resumed.stderr
    assert json.loads(resumed.stdout)["was_paused"]["note"] == NOTE
    wait_for(lambda: len(scheduled(cluster, "held", held_slot, heir.pid)) >= 3, timeout=20, message=cluster.logs)
    # What it missed while paused follows the catch-up policy (the default, once): one run, late.
    caught_up = [p for p in scheduled(cluster, "held", held_slot) if p.slot.timestamp() < resumed_at]
    assert len(caught_up) == 1, f"the missed ticks did not run once on resume: {caught_up}\n{cluster.logs()}"
    shown = json.loads(operator(cluster, "status", "--json").stdout)
    assert next(e for e in shown["entries"] if e["name"] == "held")["paused"] is None

    report = accounting(cluster, zk_client, intervals={"held": 1, "steady": 1}, kills=[(first.pid, killed_at)])
    assert_clean(report, cluster.logs())
    assert report.manual == 1
    assert [gap for gap in report.lost if gap.entry == "held"] == [], "held was paused at the kill: none in flight"
    slots = [p.slot for p in cluster.publishes("held")]
    assert len(slots) == len(set(slots)), "a slot of held was published twice"

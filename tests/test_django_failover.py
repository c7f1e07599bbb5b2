"""zkbeat.DatabaseScheduler as real ``celery beat`` processes of the example project.

Replicas run ``celery -A tests.support.djangobeat beat --scheduler zkbeat.DatabaseScheduler``
on one PostgreSQL database. The tests kill and stop them with real signals,
then count what each published (recorded from ``after_task_publish``) with the
accounting of tests/support/accounting.py (nothing twice, nothing lost but a
tick in flight in a leader killed with kill -9), and which process wrote
django-celery-beat's task table (a trigger records each writer's
``application_name``, which replicas set to their identity).
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable

import pytest
from kazoo.client import KazooClient

from tests.support.accounting import accounting, assert_clean
from tests.support.brokers import TestBroker
from tests.support.djangosupport import (
    ON_THE_DATABASE,
    DjangoCluster,
    interval_task,
    periodic_task,
    recorded_writes,
)
from tests.support.helpers import wait_for
from tests.support.processes import SESSION, Publish

pytestmark = [pytest.mark.processes, *ON_THE_DATABASE]

MakeCluster = Callable[..., DjangoCluster]


def published_by(cluster: DjangoCluster, pid: int, entry: str | None = None) -> list[Publish]:
    return [p for p in cluster.publishes(entry) if p.pid == pid]


def next_leader(cluster: DjangoCluster, old_pid: int, since: float, timeout: float) -> Publish:
    def new_publish() -> Publish | None:
        return next((p for p in cluster.publishes() if p.pid != old_pid and p.at > since), None)

    return wait_for(new_publish, timeout=timeout, message=lambda: "no other replica published\n" + cluster.logs())


def test_kill_9_then_sigterm_each_tick_once_and_only_leaders_write(
    make_cluster: MakeCluster, zk_client: KazooClient, broker: TestBroker
) -> None:
    """kill -9 the leader, then SIGTERM the next: every tick once, and only replicas that led wrote the tables."""
    interval_task("cleanup", 1)
    interval_task("aggregate", 1, task="jobs.aggregate_analytics")
    cluster = make_cluster(4, broker=broker.url).start()
    first = wait_for(lambda: cluster.publishes("cleanup"), timeout=40, message=cluster.logs)[0]
    leader = cluster.replica(first.pid)
    wait_for(lambda: len(published_by(cluster, leader.pid, "cleanup")) >= 4, timeout=20, message=cluster.logs)

    killed_at = time.time()
    leader.signal(signal.SIGKILL)
    leader.wait()
    kills = [(leader.pid, killed_at)]
    heir = cluster.replica(next_leader(cluster, leader.pid, killed_at, timeout=SESSION + 20).pid)
    wait_for(lambda: len(published_by(cluster, heir.pid, "cleanup")) >= 4, timeout=20, message=cluster.logs)

    stopped_at = time.time()
    heir.signal(signal.SIGTERM)
    assert heir.wait() == 0, heir.log()
    taken = next_leader(cluster, heir.pid, stopped_at, timeout=20)
    last = cluster.replica(taken.pid)
    wait_for(lambda: len(published_by(cluster, last.pid, "cleanup")) >= 4, timeout=20, message=cluster.logs)

    rows = [p for p in cluster.publishes() if p.entry in ("cleanup", "aggregate")]
    leaders = {p.identity for p in rows}
    assert leaders == {leader.identity, heir.identity, last.identity}

    writes = recorded_writes()
    writers = {app for _, app, _, _ in writes if app.startswith("replica-")}
    assert writers, "leaders write the tables (beat_schedule, run times)"
    assert writers <= leaders, f"replicas that never led wrote: {writers - leaders}"
    assert {r.identity for r in cluster.replicas} - leaders, "one replica should have stayed a follower"
    # At exit it hands over first, then writes its run times, never over a newer run (see
    # tests/test_django_handover_write.py): once the next leader runs, those updates are all it writes.
    late = {(op, name) for at, app, op, name in writes if app == heir.identity and at.timestamp() > taken.at}
    assert late <= {("UPDATE", "cleanup"), ("UPDATE", "aggregate")}, (
        f"the replica stopped with SIGTERM wrote more than its run times after the next leader took over: {late}"
    )
    report = accounting(cluster, zk_client, intervals={"cleanup": 1, "aggregate": 1}, kills=kills)
    assert_clean(report, cluster.logs())


def test_a_one_off_runs_once_although_its_leader_is_killed_right_after_publishing_it(
    make_cluster: MakeCluster, zk_client: KazooClient
) -> None:
    """Every replica SIGKILLs itself right after publishing the one-off: it goes out once; the heir disables it."""
    from django.utils import timezone
    from jobs.models import Broadcast

    interval_task("canary", 1)
    name = "broadcast 1: launch"  # the one-off the first Broadcast schedules (jobs/models.py)
    cluster = make_cluster(2, extra_env={"ZKBEAT_TEST_KILL_AFTER": name}).start()
    wait_for(lambda: len(cluster.publishes("canary")) >= 3, timeout=40, message=cluster.logs)
    broadcast = Broadcast.objects.create(subject="launch", send_at=timezone.now())
    assert broadcast.task_name == name
    sent = wait_for(lambda: cluster.publishes(name), timeout=20, message=cluster.logs)[0]
    doomed = cluster.replica(sent.pid)
    doomed.wait()
    # The heir may have taken over and disabled the row already; the doomed
    # leader itself must have written nothing of the run.
    assert [w for w in recorded_writes() if w[1] == doomed.identity and w[3] == name] == [], (
        "the row must know nothing of the run from the leader that sent it"
    )

    wait_for(lambda: not periodic_task(name).enabled, timeout=SESSION + 20, message=cluster.logs)
    heir = next(r for r in cluster.replicas if r is not doomed)
    wait_for(lambda: len(published_by(cluster, heir.pid, "canary")) >= 3, timeout=20, message=cluster.logs)
    assert len(cluster.publishes(name)) == 1
    assert heir.alive, "the heir would have killed itself had it published the one-off again"
    # The doomed leader died the moment the one-off was sent: what it had in flight may be lost, nothing else.
    assert_clean(accounting(cluster, zk_client, intervals={"canary": 1}, kills=[(doomed.pid, sent.at)]), cluster.logs())

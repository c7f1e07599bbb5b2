"""zkbeat.DatabaseScheduler with ``zkbeat_shards``: each shard's leader holds and runs only its shard's rows.

Real ``celery beat`` replicas of the example project on one PostgreSQL
database, ZooKeeper and Redis. Who leads each shard is read from ZooKeeper;
what each replica holds is read from its log ("zkbeat: holding N entries of
shards ..."), said after every read that changed something and whenever it
drops a shard it no longer leads.
"""

from __future__ import annotations

import re
import signal
import time
from collections.abc import Callable

import pytest
from kazoo.client import KazooClient

from tests.support.accounting import accounting, assert_clean
from tests.support.djangosupport import ON_THE_DATABASE, DjangoCluster, DjangoReplica, periodic_task
from tests.support.helpers import wait_for
from tests.test_cli import zkbeat
from tests.test_django_unreadable import unreachable
from tests.test_shards_processes import heads, settled
from zkbeat.coordination.shards import shard_of

pytestmark = [pytest.mark.processes, *ON_THE_DATABASE]

MakeCluster = Callable[..., DjangoCluster]

ROWS = 200
SHARDS = 3
TIMEOUT = 90
HOLDING = re.compile(r"zkbeat: holding (\d+) entries")


def make_rows(count: int) -> list[str]:
    """``count`` enabled rows, each every second (one query, as a data migration would write them)."""
    from django_celery_beat.models import IntervalSchedule, PeriodicTask, PeriodicTasks

    every, _ = IntervalSchedule.objects.get_or_create(every=1, period=IntervalSchedule.SECONDS)
    names = [f"row-{i:03d}" for i in range(count)]
    PeriodicTask.objects.bulk_create(
        PeriodicTask(name=name, task="jobs.cleanup_messages", interval=every) for name in names
    )
    PeriodicTasks.update_changed()
    return names


def enabled_by_shard(root: str) -> dict[int, int]:
    """How many enabled rows each shard has now."""
    from django_celery_beat.models import PeriodicTask

    counts = dict.fromkeys(range(SHARDS), 0)
    for name in PeriodicTask.objects.filter(enabled=True).values_list("name", flat=True):
        counts[shard_of(root, name, SHARDS)] += 1
    return counts


def holding(replica: DjangoReplica) -> int | None:
    """The entries the replica said it holds last (None: it never said)."""
    found = HOLDING.findall(replica.log())
    return int(found[-1]) if found else None


def wait_holding_own_shards(cluster: DjangoCluster, client: KazooClient) -> dict[int, str | None]:
    """Settled (one shard each), and each live replica holds exactly the enabled rows of the shards it leads."""

    def right() -> dict[int, str | None] | None:
        led = settled(client, cluster, SHARDS)
        if led is None:
            return None
        counts = enabled_by_shard(cluster.root)
        for replica in cluster.replicas:
            if replica.alive:
                mine = sum(counts[shard] for shard, head in led.items() if head == replica.identity)
                if holding(replica) != mine:
                    return None
        return led

    def why() -> str:
        said = {r.identity: holding(r) for r in cluster.replicas if r.alive}
        return f"heads {heads(client, cluster.root, SHARDS)}, rows {enabled_by_shard(cluster.root)}, holding {said}"

    return wait_for(right, timeout=TIMEOUT, interval=0.5, message=lambda: why() + "\n" + cluster.logs())


def published_after(cluster: DjangoCluster, since: float) -> set[str]:
    return {p.entry for p in cluster.publishes() if p.at > since}


def leader_of(led: dict[int, str | None], cluster: DjangoCluster, shard: int) -> DjangoReplica:
    return next(r for r in cluster.replicas if r.identity == led[shard] and r.alive)


def test_three_shards_hold_their_own_rows_and_survive_a_kill_9(
    make_cluster: MakeCluster, zk_client: KazooClient
) -> None:
    """3 replicas, 3 shards, 200 rows every second: one shard each, each holding only its shard's rows.

    An edit, a disable and a delete of a row change only what its shard's
    leader holds and runs; a kill -9 moves only the killed replica's shard,
    whose heir then holds both shards' rows; nothing twice, nothing lost but
    the killed replica's ticks in flight.
    """
    names = make_rows(ROWS)
    cluster = make_cluster(3, extra_env={"ZKBEAT_TEST_SHARDS": str(SHARDS)}).start()
    root = cluster.root
    led = wait_holding_own_shards(cluster, zk_client)
    assert sorted(led.values()) == sorted(r.identity for r in cluster.replicas), led
    started = time.time()
    wait_for(lambda: set(names) <= published_after(cluster, started), timeout=TIMEOUT, message=cluster.logs)
    for shard in range(SHARDS):
        mine = {
            p.identity for p in cluster.publishes() if p.entry in names and shard_of(root, p.entry, SHARDS) == shard
        }
        assert led[shard] in mine, (shard, led, mine)

    # An edit, a disable and a delete, each of a row of a different shard.
    edited, disabled, deleted = (next(n for n in names if shard_of(root, n, SHARDS) == k) for k in range(SHARDS))
    before = {r.identity: holding(r) for r in cluster.replicas}
    logged = {r.identity: len(r.log()) for r in cluster.replicas}
    row = periodic_task(edited)
    row.description = "edited in the admin"
    row.save()
    row = periodic_task(disabled)
    row.enabled = False
    row.save()
    periodic_task(deleted).delete()
    changed_at = time.time()
    led = wait_holding_own_shards(cluster, zk_client)
    dropped_at = time.time()  # each leader said it holds its rows without the disabled and the deleted one
    after = {r.identity: holding(r) for r in cluster.replicas}
    assert after[led[0]] == before[led[0]], "an edit changes no count"
    assert after[led[1]] == before[led[1]] - 1 and after[led[2]] == before[led[2]] - 1, (before, after)
    built = re.compile(r"quick read of the schedule: .* 1 entries built")

    def rebuilt() -> list[str]:
        return [r.identity for r in cluster.replicas if built.search(r.log()[logged[r.identity] :])]

    wait_for(lambda: led[0] in rebuilt(), timeout=TIMEOUT, message=cluster.logs)
    time.sleep(3)
    assert rebuilt() == [led[0]], "only the leader of the edited row's shard builds it again"
    # Not published once its leader's read dropped it (2 s after the change, or later on a loaded machine).
    gone_after = [
        p for p in cluster.publishes() if p.entry in (disabled, deleted) and p.at > max(changed_at + 2, dropped_at)
    ]
    assert gone_after == [], gone_after
    wait_for(lambda: edited in published_after(cluster, changed_at + 2), timeout=TIMEOUT, message=cluster.logs)

    # kill -9 the leader of shard 1: only its shard moves, to a live replica that then holds two shards' rows.
    victim = leader_of(led, cluster, 1)
    time.sleep(1.0)  # its followers watch its liveness socket
    killed_at = time.time()
    victim.signal(signal.SIGKILL)
    victim.wait(30)
    kept = set(names) - {disabled, deleted}
    led_after = wait_holding_own_shards(cluster, zk_client)
    assert {k: v for k, v in led_after.items() if k != 1} == {k: v for k, v in led.items() if k != 1}, (
        led,
        led_after,
    )
    wait_for(lambda: kept <= published_after(cluster, killed_at + 1), timeout=TIMEOUT, message=cluster.logs)
    heir = leader_of(led_after, cluster, 1)
    assert "holding" in heir.log() and re.search(r"holding \d+ entries of shards (0, 1|1, 2) of 3", heir.log())

    intervals = dict.fromkeys(kept, 1.0)
    assert_clean(accounting(cluster, zk_client, intervals=intervals, kills=[(victim.pid, killed_at)]), cluster.logs())


def test_a_replica_that_cannot_read_the_database_steps_aside_from_every_shard_it_leads(
    make_cluster: MakeCluster, zk_client: KazooClient, beat_db: str
) -> None:
    """A replica cut off from the database leads all 3 shards first: it announces none, publishes nothing,
    and gives each up, stepping aside within its stall timeout (or handing it over to the fair share before
    that); marked unready, it is handed none again, and the two that read the database lead all 3."""
    names = make_rows(10)
    cluster = make_cluster(0, extra_env={"ZKBEAT_TEST_SHARDS": str(SHARDS)})
    cut_off = cluster.add({"DATABASE_URL": unreachable(beat_db), "ZKBEAT_STALL_TIMEOUT": "6"})
    wait_for(lambda: set(heads(zk_client, cluster.root, SHARDS).values()) == {cut_off.identity}, timeout=TIMEOUT,
             message=cluster.logs)  # fmt: skip
    good = [cluster.add(), cluster.add()]
    wait_for(
        lambda: re.search(r"stepping aside .* the schedule has not loaded in 6s", cut_off.log()),
        timeout=TIMEOUT,
        message=cluster.logs,
    )
    wait_for(
        lambda: set(heads(zk_client, cluster.root, SHARDS).values()) <= {r.identity for r in good},
        timeout=TIMEOUT,
        message=cluster.logs,
    )
    # `zkbeat status` names it while it is in some line (out of all of them for 30 s after stepping aside).
    env = cluster.env
    wait_for(
        lambda: (
            f"not ready to lead: {cut_off.identity} (pid"
            in zkbeat("--hosts", env["ZKBEAT_HOSTS"], "--root", env["ZKBEAT_ROOT"], "status").stdout
        ),
        timeout=TIMEOUT,
        message=lambda: zkbeat("--hosts", env["ZKBEAT_HOSTS"], "--root", env["ZKBEAT_ROOT"], "status").stdout,
    )
    started = time.time()
    wait_for(lambda: set(names) <= published_after(cluster, started), timeout=TIMEOUT, message=cluster.logs)
    assert {p.identity for p in cluster.publishes()} <= {r.identity for r in good}
    assert_clean(accounting(cluster, zk_client, intervals=dict.fromkeys(names, 1.0)), cluster.logs())

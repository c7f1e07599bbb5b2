"""Sharded leadership (``zkbeat_shards``), proven with real ``celery beat`` replicas and real signals.

Every replica contends for every shard; each shard has its own election and
fence. The tests read who leads each shard from ZooKeeper (the head of each
shard's line), do something unkind to replicas, and end with the accounting
of tests/support/accounting.py over every entry: nothing twice, nothing lost
but a tick in flight in a replica killed with kill -9 (the documented
window). Timings (the longest gap between two publishes of one shard's
entries) are printed, never asserted.
"""

from __future__ import annotations

import json
import math
import os
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable

import pytest
from kazoo.client import KazooClient

from tests.support.accounting import accounting, assert_clean
from tests.support.faults import ledger_slots, wait_until_watched
from tests.support.helpers import wait_for
from tests.support.processes import ROOT, Cluster, Publish, Replica
from tests.test_log_lines import LIVENESS, LOG_FORMAT, lines, table
from zkbeat.coordination.candidates import CandidateReader
from zkbeat.coordination.shards import election_path, shard_of

pytestmark = pytest.mark.processes

MakeCluster = Callable[..., Cluster]

#: Entries every second. 60 keeps a 2-core machine shared with other test
#: runs responsive; ZKBEAT_TEST_SHARD_ENTRIES=300 runs the same tests with 300.
ENTRY_COUNT = int(os.environ.get("ZKBEAT_TEST_SHARD_ENTRIES", "60"))
SCHEDULE = {f"entry-{i:03d}": 1.0 for i in range(ENTRY_COUNT)}
#: Generous waits on a loaded machine: a replica starts in seconds, settling takes a couple more.
SETTLE_TIMEOUT = 90


def shards_env(shards: int) -> dict[str, str]:
    """The replicas' settings: ``shards`` shards, in the log format the log-line table is checked in."""
    return {"ZKBEAT_TEST_CONF": json.dumps({"zkbeat_shards": shards, "worker_log_format": LOG_FORMAT})}


def heads(client: KazooClient, root: str, shards: int) -> dict[int, str | None]:
    """Who leads each shard: the identity of the head of its line (None: nobody is in line)."""
    found: dict[int, str | None] = {}
    for shard in range(shards):
        head = CandidateReader(client, election_path(root, shard, shards)).read().head
        found[shard] = None if head is None else head.data.get("identity")
    return found


def live_identities(cluster: Cluster) -> set[str]:
    return {r.identity for r in cluster.replicas if r.alive}


def settled(client: KazooClient, cluster: Cluster, shards: int) -> dict[int, str | None] | None:
    """The heads once every shard is led by a live replica and none leads more than its fair share."""
    led = heads(client, cluster.root, shards)
    live = live_identities(cluster)
    if any(identity not in live for identity in led.values()):
        return None
    share = math.ceil(shards / len(live))
    counts = [list(led.values()).count(identity) for identity in live]
    return led if max(counts) <= share else None


def wait_settled(client: KazooClient, cluster: Cluster, shards: int) -> dict[int, str | None]:
    return wait_for(
        lambda: settled(client, cluster, shards),
        timeout=SETTLE_TIMEOUT,
        interval=0.2,
        message=lambda: f"never settled: {heads(client, cluster.root, shards)}\n{cluster.logs()}",
    )


def wait_has_share(client: KazooClient, cluster: Cluster, identity: str) -> None:
    """Settled again, with ``identity`` (restarted) leading its share."""

    def has_share() -> bool:
        led = settled(client, cluster, 3)
        return led is not None and identity in led.values()

    wait_for(
        has_share,
        timeout=SETTLE_TIMEOUT,
        interval=0.2,
        message=lambda: (
            f"the restarted {identity} never got its share: {heads(client, cluster.root, 3)}\n" + cluster.logs()
        ),
    )


def published_since(cluster: Cluster, since: float, names: set[str]) -> set[str]:
    return {p.entry for p in cluster.publishes() if p.at > since and p.entry in names}


def wait_all_published(cluster: Cluster, since: float, names: set[str], what: str) -> None:
    """Every entry of ``names`` is published again after ``since``: none is stalled."""
    wait_for(
        lambda: published_since(cluster, since, names) == names,
        timeout=SETTLE_TIMEOUT,
        interval=0.2,
        message=lambda: (
            f"{what}: never published again: {sorted(names - published_since(cluster, since, names))}\n"
            + cluster.logs()
        ),
    )


def wait_published_times(cluster: Cluster, since: float, names: set[str], times: int) -> None:
    """Every entry of ``names`` is published ``times`` times after ``since``."""

    def done() -> bool:
        counts = Counter(p.entry for p in cluster.publishes() if p.at > since)
        return all(counts[name] >= times for name in names)

    wait_for(done, timeout=SETTLE_TIMEOUT, interval=0.2, message=cluster.logs)


def gaps_by_shard(
    publishes: list[Publish], root: str, shards: int, start: float = 0.0, end: float = math.inf
) -> dict[int, float]:
    """The longest time between two publishes of one entry, per shard, the later one between ``start`` and ``end``.

    Seconds; printed, never asserted (the machine is shared).
    """
    by_entry: dict[str, list[float]] = {}
    for p in publishes:
        if p.manual is None:
            by_entry.setdefault(p.entry, []).append(p.at)
    gaps = dict.fromkeys(range(shards), 0.0)
    for name, times in by_entry.items():
        times.sort()
        shard = shard_of(root, name, shards)
        gaps[shard] = max([gaps[shard], *(b - a for a, b in zip(times, times[1:]) if start <= b <= end)])
    return {shard: round(gap, 2) for shard, gap in gaps.items()}


def undocumented_lines(cluster: Cluster) -> list[str]:
    """Lines on zkbeat.events, and WARNINGs of zkbeat's, that the log-line table of docs/operating.md lacks."""
    rows = table()
    found = []
    for replica in cluster.replicas:
        for line in lines(replica):
            ours = line.logger == "zkbeat.events" or (
                line.logger.startswith("zkbeat") and line.logger != LIVENESS and line.level in ("WARNING", "ERROR")
            )
            if ours and not any(
                row.level == line.level and row.pattern.fullmatch(line.message) for row in rows.values()
            ):
                found.append(f"{line.replica}: {line.level} {line.logger}: {line.message}")
    return found


def wait_watched(client: KazooClient, cluster: Cluster, shard: int, shards: int, replica: Replica) -> None:
    """Wait until the follower behind ``replica`` in ``shard``'s line watches its liveness socket."""
    wait_until_watched(
        client,
        cluster.root,
        replica.pid,
        lambda: "\n".join(r.log() for r in cluster.replicas),
        timeout=SETTLE_TIMEOUT,
        election=election_path(cluster.root, shard, shards),
    )


def replica_named(cluster: Cluster, identity: str) -> Replica:
    return next(r for r in cluster.replicas if r.identity == identity and r.alive)


def test_three_shards_on_three_replicas_kill_9_and_sigterm_each(
    make_cluster: MakeCluster, zk_client: KazooClient
) -> None:
    """3 shards, 3 replicas: settled one shard each; kill -9 then SIGTERM each in turn (restarted after).

    Only the stopped replica's shard moves (the others keep their leader),
    and every entry of every shard goes on: nothing twice, nothing lost but
    a tick in flight in a killed replica.
    """
    cluster = make_cluster(3, schedule=SCHEDULE, extra_env=shards_env(3)).start()
    names = set(SCHEDULE)
    led = wait_settled(zk_client, cluster, 3)
    assert sorted(led.values()) == sorted(r.identity for r in cluster.replicas), led
    wait_all_published(cluster, time.time(), names, "at start")
    kills: list[tuple[int, float]] = []
    stops: list[tuple[str, str, list[int], float]] = []
    for sig in (signal.SIGKILL, signal.SIGTERM):
        for index in range(3):
            identity = f"replica-{index}"
            before = heads(zk_client, cluster.root, 3)
            mine = {shard for shard, head in before.items() if head == identity}
            victim = replica_named(cluster, identity)
            # Its followers watch its liveness socket before it is killed (else only the session sees it).
            for shard in mine:
                wait_watched(zk_client, cluster, shard, 3, victim)
            stopped_at = time.time()
            victim.signal(sig)
            if sig == signal.SIGKILL:
                kills.append((victim.pid, stopped_at))
            victim.wait(30)

            def taken_over(mine: set[int] = mine, identity: str = identity) -> dict[int, str | None] | None:
                now = heads(zk_client, cluster.root, 3)
                return now if all(now[s] not in (None, identity) for s in mine) else None

            after = wait_for(taken_over, timeout=SETTLE_TIMEOUT, interval=0.05, message=cluster.logs)
            assert {s: h for s, h in after.items() if s not in mine} == {
                s: h for s, h in before.items() if s not in mine
            }, f"a shard of a live replica moved: {before} -> {after}"
            wait_all_published(cluster, stopped_at, names, f"{signal.Signals(sig).name} of {identity}")
            stops.append((signal.Signals(sig).name, identity, sorted(mine), stopped_at))
            victim.start()  # as a Deployment would restart it
            wait_has_share(zk_client, cluster, identity)
    rows = cluster.publishes()
    print(f"{ENTRY_COUNT} entries every 1 s; longest gap per shard in the 5 s after each stop (s):")
    for name, identity, moved, at in stops:
        print(f"  {name} of {identity} (moved shards {moved}):", gaps_by_shard(rows, cluster.root, 3, at, at + 5))
    print("longest gap per shard over the whole run (s):", gaps_by_shard(rows, cluster.root, 3))
    assert len({p.pid for p in rows}) >= 3, "leadership was not spread"
    assert_clean(accounting(cluster, zk_client, kills=kills), cluster.logs())
    assert undocumented_lines(cluster) == []


def test_joining_replicas_take_their_share(make_cluster: MakeCluster, zk_client: KazooClient) -> None:
    """2 replicas lead 3 shards (2 + 1); a 3rd joins and gets one by graceful handover; a 4th changes nothing.

    Nothing twice and nothing lost throughout (the handovers are graceful).
    """
    cluster = make_cluster(2, schedule=SCHEDULE, extra_env=shards_env(3)).start()
    led = wait_settled(zk_client, cluster, 3)
    assert sorted(list(led.values()).count(i) for i in set(led.values())) == [1, 2], led
    joined = cluster.add()
    wait_for(
        lambda: joined.identity in heads(zk_client, cluster.root, 3).values(),
        timeout=SETTLE_TIMEOUT,
        interval=0.2,
        message=lambda: f"the 3rd replica never led: {heads(zk_client, cluster.root, 3)}\n{cluster.logs()}",
    )
    led = wait_settled(zk_client, cluster, 3)
    assert sorted(led.values()) == sorted(r.identity for r in cluster.replicas), led
    fourth = cluster.add()
    joined_at = time.time()
    # Its candidates are in every line, and the fair share had time to act on them.
    wait_for(lambda: "following" in fourth.log() or "joining the election" in fourth.log(), timeout=SETTLE_TIMEOUT)
    wait_for(lambda: time.time() - joined_at > 10, timeout=20)
    led = settled(zk_client, cluster, 3)
    assert led is not None and max(list(led.values()).count(i) for i in set(led.values())) == 1, led
    wait_all_published(cluster, time.time(), set(SCHEDULE), "after the 4th joined")
    assert_clean(accounting(cluster, zk_client), cluster.logs())


def test_rolling_change_of_shards_1_3_2(make_cluster: MakeCluster, zk_client: KazooClient) -> None:
    """Restart the replicas one by one with zkbeat_shards 1 -> 3 -> 2 under load: nothing twice, no entry stalled.

    Mid-change, leaders of both configurations believe they own the same
    entries; the compare-and-set on each entry's znode decides each slot.
    """
    cluster = make_cluster(3, schedule=SCHEDULE, extra_env=shards_env(1)).start()
    names = set(SCHEDULE)
    wait_all_published(cluster, time.time(), names, "at start")
    for shards in (3, 2):
        for replica in list(cluster.replicas):
            stopped_at = time.time()
            replica.signal(signal.SIGTERM)
            assert replica.wait(30) == 0
            replica.start(shards_env(shards))
            wait_all_published(cluster, stopped_at, names, f"restarting {replica.identity} with {shards} shards")
            # Both configurations lead side by side for a while: each entry's slots are contended.
            wait_published_times(cluster, time.time(), names, 3)
        wait_settled(zk_client, cluster, shards)
        wait_all_published(cluster, time.time(), names, f"settled on {shards} shards")
    rows = cluster.publishes()
    print("longest gap per shard (s):", gaps_by_shard(rows, cluster.root, 2))
    assert_clean(accounting(cluster, zk_client), cluster.logs())


def zkbeat_command(cluster: Cluster, *args: str) -> subprocess.CompletedProcess:
    """``zkbeat -A <the replicas' app> ...`` under the cluster's own environment."""
    return subprocess.run(
        [sys.executable, "-m", "zkbeat.ops.cli", "-A", "tests.support.beatapp", *args],
        env={**os.environ, "PYTHONPATH": str(ROOT), **cluster.env},
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )


def test_status_health_step_down_and_logs_name_the_shard(make_cluster: MakeCluster, zk_client: KazooClient) -> None:
    """status (text, --json), health, step-down --shard and the events log name each shard and its leader.

    Run-now requests are consumed by the leader of the entry's shard, once; a pause holds across shards.
    """
    cluster = make_cluster(2, schedule=SCHEDULE, extra_env=shards_env(3)).start()
    led = wait_settled(zk_client, cluster, 3)
    wait_all_published(cluster, time.time(), set(SCHEDULE), "at start")
    result = zkbeat_command(cluster, "status", "--json")
    assert result.returncode == 0, result.stderr
    found = json.loads(result.stdout)
    assert [s["shard"] for s in found["shards"]] == [0, 1, 2]
    assert {s["shard"]: s["leader"]["identity"] for s in found["shards"]} == led
    assert sum(s["entries"] for s in found["shards"]) == ENTRY_COUNT
    assert sorted(c["identity"] for c in found["candidates"]) == ["replica-0", "replica-1"]
    text = zkbeat_command(cluster, "status")
    assert text.returncode == 0, text.stderr
    for shard, identity in led.items():
        assert f"shard {shard}/3 (" in text.stdout and f"leader: {identity}" in text.stdout, text.stdout
    # Without the app's settings (--hosts/--root), the shards in use are found in ZooKeeper.
    bare = subprocess.run(
        [sys.executable, "-m", "zkbeat.ops.cli", "--hosts", cluster.env["ZKBEAT_HOSTS"], "--root", cluster.root,
         "status", "--json"],
        env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True, timeout=60, cwd=ROOT,
    )  # fmt: skip
    assert bare.returncode == 0, bare.stderr
    assert [s["leader"]["identity"] for s in json.loads(bare.stdout)["shards"]] == [led[k] for k in range(3)]
    health = zkbeat_command(cluster, "health")
    assert health.returncode == 0, health.stderr
    assert health.stdout.startswith("ok: every shard has a leader"), health.stdout
    logs = "\n".join(r.log() for r in cluster.replicas)
    for shard in range(3):
        assert f"became leader of shard {shard}/3 (epoch" in logs

    before = heads(zk_client, cluster.root, 3)
    moved = zkbeat_command(cluster, "step-down", "--shard", "2", "--wait")
    assert moved.returncode == 0, moved.stderr + moved.stdout
    # Who leads shard 2 now, as --wait saw it: the fair share may hand the shard back within seconds (the
    # replica that took it then leads more than its share), so ZooKeeper read after the command may not say.
    took = re.search(r"^(\S+) \(epoch \d+\) leads and has published$", moved.stdout, flags=re.M)
    assert took is not None, moved.stdout
    assert took.group(1) != before[2], (before, moved.stdout)
    assert "became leader of shard 2/3" in replica_named(cluster, took.group(1)).log(), moved.stdout
    assert wait_settled(zk_client, cluster, 3)
    assert zkbeat_command(cluster, "step-down", "--shard", "3").returncode == 2

    # Run-now: the leader of each entry's shard consumes its request, once.
    led = wait_settled(zk_client, cluster, 3)
    one_of = {shard_of(cluster.root, name, 3): name for name in sorted(SCHEDULE, reverse=True)}
    for shard, name in sorted(one_of.items()):
        ran = zkbeat_command(cluster, "trigger", name, "--json")
        assert ran.returncode == 0, ran.stderr + ran.stdout
        request = json.loads(ran.stdout)["request"]
        runs = [p for p in cluster.publishes() if p.manual == request]
        assert [(p.entry, p.identity) for p in runs] == [(name, led[shard])], (runs, led)
    # Pause and resume one entry: nothing of it while paused, then it goes on.
    paused = one_of[1]
    assert zkbeat_command(cluster, "pause", paused).returncode == 0
    paused_at = time.time()
    # The pause is a compare-and-set on the entry's znode, as every claim is: each claim before it is in the slot
    # read now, and none may follow. (A claim made just before the pause may still be sent after it, late on a
    # loaded machine: when it is sent says nothing.)
    claimed = ledger_slots(zk_client, cluster.root)[paused]
    wait_published_times(cluster, paused_at + 1, set(SCHEDULE) - {paused}, 2)
    assert [p for p in cluster.publishes() if p.entry == paused and p.slot > claimed and p.manual is None] == []
    assert zkbeat_command(cluster, "resume", paused).returncode == 0
    wait_published_times(cluster, time.time(), {paused}, 2)
    assert_clean(accounting(cluster, zk_client), cluster.logs())
    assert undocumented_lines(cluster) == []


@pytest.mark.parametrize("value", [0, -1, "two", 65])
def test_a_bad_shards_value_ends_celery_beat_on_one_line(make_cluster: MakeCluster, value: object) -> None:
    """zkbeat_shards 0, negative, a string, above 64: celery beat exits 1 with one line naming the setting."""
    cluster = make_cluster(1, schedule={"a": 1}, extra_env={"ZKBEAT_TEST_CONF": json.dumps({"zkbeat_shards": value})})
    replica = cluster.start().replicas[0]
    assert replica.wait(60) == 1, replica.log()
    assert "Traceback" not in replica.log(), replica.log()
    assert f"zkbeat: zkbeat_shards={value!r}: must be a whole number from 1 to 64" in replica.log().splitlines()

"""Clock skew between replicas, with libfaketime (Debian's ``faketime``).

Each replica runs under ``LD_PRELOAD=libfaketime`` with its own offset, so its
wall clock (and so its schedule, its ledger writes and its recorded publish
times) is off by that much while ZooKeeper and Redis keep the real time.
"""

from __future__ import annotations

import glob
import re
import signal
import urllib.request
from collections import Counter
from datetime import timedelta
from pathlib import Path

import pytest
from kazoo.client import KazooClient

from tests.support.accounting import account, logged_skips
from tests.support.faults import candidates
from tests.support.helpers import wait_for
from tests.support.processes import Cluster
from tests.support.servers import RedisServer, ZooKeeperServer, free_port
from zkbeat.ledger.clock import LEDGER_TOLERANCE

pytestmark = pytest.mark.processes

FAKETIME_HINT = "apt-get install -y faketime"
ENTRIES = {"alpha": 1, "beta": 1}


def faketime_env(offset: int) -> dict[str, str]:
    """Environment that makes a process's wall clock ``offset`` seconds off.

    The monotonic clock gets the same constant offset, which no duration
    notices; exempting it (FAKETIME_DONT_FAKE_MONOTONIC) breaks Python's
    time.sleep, whose absolute clock_nanosleep then fails with EINVAL.
    """
    found = sorted(glob.glob("/usr/lib/*/faketime/libfaketime.so.1"))
    if not found:
        raise RuntimeError(f"libfaketime is not installed: run `{FAKETIME_HINT}` or `make test`")
    return {"LD_PRELOAD": found[0], "FAKETIME": f"{offset:+d}"}


def test_skewed_replicas_lead_in_line_order_and_publish_nothing_twice(
    redis_server: RedisServer, zk_server: ZooKeeperServer, zk_client: KazooClient, zk_root: str, tmp_path: Path
) -> None:
    """Replicas 60 s slow to 60 s fast lead in line order; no slot twice, none lost; each skewed leader warns."""
    # Handovers go to a faster clock (caught up at once), except +5 -> 0,
    # where the new leader goes on from ZooKeeper's time of the last write
    # and skips (logged) the ticks the +5 leader published early.
    skews = [-60, -5, +5, 0, +60]
    cluster = Cluster(
        0, zk_hosts=zk_server.hosts, broker=redis_server.url, root=zk_root, schedule=ENTRIES, log_dir=tmp_path
    )
    try:
        for n, skew in enumerate(skews, start=1):
            cluster.add(faketime_env(skew))
            wait_for(lambda n=n: len(candidates(zk_client, zk_root)) == n, timeout=60, message=lambda: cluster.logs())
        for replica in cluster.replicas:
            wait_for(
                lambda r=replica: len([p for p in cluster.publishes() if p.identity == r.identity]) >= 6,
                timeout=30,
                message=lambda: cluster.logs(),
            )
            replica.signal(signal.SIGTERM)
            assert replica.wait() == 0, replica.log()
        rows = cluster.publishes()
    finally:
        cluster.stop()
    leaders = [lease.identity for lease in account(rows, ENTRIES).leaders]
    assert leaders == [r.identity for r in cluster.replicas], "a clock decided who led"
    report = account(rows, ENTRIES, skips=logged_skips([r.log() for r in cluster.replicas]))
    print(report.table())
    print(report.leader_table())
    assert report.twice == 0, report.details()
    assert report.lost == [], report.details()
    for replica, skew in zip(cluster.replicas, skews):
        warned = "clock is" in replica.log() and "ZooKeeper's" in replica.log()
        assert warned == (skew != 0), f"skew {skew}: {replica.log()[-3000:]}"
        if skew:
            side = "ahead of" if skew > 0 else "behind"
            measured = [float(x) for x in re.findall(rf"clock is (\d+\.\d)s {side} ZooKeeper's", replica.log())]
            assert measured and all(abs(m - abs(skew)) <= 1 for m in measured), f"skew {skew}: measured {measured}"


def metric(port: int, name: str) -> float | None:
    """One sample of a replica's /metrics (the first with that name), or None."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    found = re.search(rf"^{name}(?:{{[^}}]*}})? (\S+)$", text, re.MULTILINE)
    return float(found.group(1)) if found else None


@pytest.mark.parametrize("ahead", [30, 86400], ids=["30s", "a-day"])
def test_a_leader_far_ahead_hands_over_and_no_entry_waits_for_its_clock(
    ahead: int, redis_server: RedisServer, zk_server: ZooKeeperServer, zk_client: KazooClient, zk_root: str,
    tmp_path: Path,
) -> None:  # fmt: skip
    """A leader whose clock is ahead hands over to a correct clock: entries run on at once, none twice, with a warning.

    Its ticks were published early under slots in the future; when the
    correct clock reaches them (the 30 s case) each is skipped and logged,
    not published again, and the entries go on past them.
    """
    port = free_port()
    cluster = Cluster(
        0, zk_hosts=zk_server.hosts, broker=redis_server.url, root=zk_root, schedule=ENTRIES, log_dir=tmp_path
    )
    try:
        fast = cluster.add(faketime_env(ahead))
        wait_for(lambda: len(candidates(zk_client, zk_root)) == 1, timeout=60, message=cluster.logs)
        right = cluster.add({"ZKBEAT_TEST_METRICS_PORT": str(port)})
        wait_for(lambda: len(candidates(zk_client, zk_root)) == 2, timeout=60, message=cluster.logs)

        def rows_of(replica) -> list:
            return [p for p in cluster.publishes() if p.identity == replica.identity]

        wait_for(lambda: all(sum(p.entry == e for p in rows_of(fast)) >= 3 for e in ENTRIES), 30, message=cluster.logs)
        fast.signal(signal.SIGTERM)
        assert fast.wait() == 0, fast.log()
        early = {e: sorted(p.slot for p in rows_of(fast) if p.entry == e) for e in ENTRIES}

        def published_before_the_early_slots() -> bool:
            return all(sum(p.entry == e and p.slot < early[e][0] for p in rows_of(right)) >= 5 for e in ENTRIES)

        wait_for(published_before_the_early_slots, timeout=30, message=cluster.logs)
        if ahead < 60:  # the correct clock reaches the early slots, and goes past them
            wait_for(lambda: all(sum(p.entry == e and p.slot > early[e][-1] for p in rows_of(right)) >= 2
                                 for e in ENTRIES), timeout=ahead + 30, message=cluster.logs)  # fmt: skip
        ahead_total = metric(port, "zkbeat_ledger_ahead_total")
        right.signal(signal.SIGTERM)
        assert right.wait() == 0, right.log()
        rows = cluster.publishes()
    finally:
        cluster.stop()

    assert [n for n, c in Counter((p.entry, p.slot) for p in rows).items() if c > 1] == [], "a slot was published twice"
    assert len({p.task_id for p in rows}) == len(rows), "a task id was published twice"
    everything = account(rows, ENTRIES)
    assert everything.twice == 0, everything.details()  # nor two slots nearer than the interval
    after = [p for p in rows if p.identity == right.identity]
    # Nothing held back across the handover: the first slot after it follows the fast
    # leader's last publish (on ZooKeeper's time) by one interval and the tolerance.
    last_fast = max(p.at for p in rows if p.identity == fast.identity) - ahead
    for name, interval in ENTRIES.items():
        first = min(p.slot for p in after if p.entry == name)
        assert first.timestamp() <= last_fast + interval + LEDGER_TOLERANCE + 0.5, f"{name}: a gap after the handover"
    report = account(after, ENTRIES, skips=logged_skips([right.log()]))
    assert report.twice == 0 and report.lost == [], report.details()  # every gap is a logged skip
    log = right.log()
    warning = re.search(r"WARNING.*zkbeat: ledger entries ahead of ZooKeeper's time.*", log)
    assert warning and all(name in warning.group(0) for name in ENTRIES), log[-3000:]
    assert ahead_total == len(ENTRIES)
    # guarantees.md: "The leader ahead warns too, once a term, when ZooKeeper's time of its claims shows its
    # ticks go out early": the fast leader led one term; the correct one never says it.
    ahead_line = "zkbeat: this leader publishes ticks ahead of ZooKeeper's time: "
    assert fast.log().count(ahead_line) == 1, fast.log()[-3000:]
    assert ahead_line not in log
    for name, interval in ENTRIES.items():
        skipped = [slot for n, slot in logged_skips([log]) if n == name]
        near = (early[name][0] - timedelta(seconds=interval), early[name][-1] + timedelta(seconds=interval))
        assert all(near[0] < slot < near[1] for slot in skipped), f"{name}: skipped {skipped}, early {early[name]}"
        assert all(not early[name][0] <= p.slot <= early[name][-1] for p in after if p.entry == name)
        if ahead < 60:
            assert skipped, f"{name}: no early slot was skipped (and logged) when its time came"

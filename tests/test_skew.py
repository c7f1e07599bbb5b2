"""Clock skew between replicas, with libfaketime (Debian's ``faketime``).

Each replica runs under ``LD_PRELOAD=libfaketime`` with its own offset, so its
wall clock (and so its schedule, its ledger writes and its recorded publish
times) is off by that much while ZooKeeper and Redis keep the real time.
"""

from __future__ import annotations

import glob
import re
import signal
from pathlib import Path

import pytest
from kazoo.client import KazooClient

from tests.support.accounting import account
from tests.support.faults import candidates
from tests.support.helpers import wait_for
from tests.support.processes import Cluster
from tests.support.servers import RedisServer, ZooKeeperServer

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
    # where the new leader waits ~5 s for its clock to reach the ledger's.
    skews = [-60, -5, +5, 0, +60]
    cluster = Cluster(
        0, zk_hosts=zk_server.hosts, broker=redis_server.url, root=zk_root, schedule=ENTRIES, log_dir=tmp_path
    )
    try:
        for n, skew in enumerate(skews, start=1):
            cluster.add(faketime_env(skew))
            wait_for(lambda n=n: len(candidates(zk_client, zk_root)) == n, timeout=20, message=lambda: cluster.logs())
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
    report = account(rows, ENTRIES)
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

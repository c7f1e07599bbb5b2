"""A SIGTERM whose SystemExit a library swallows (real ``celery beat`` processes, real signals): kazoo's
``_call`` wakes its connection thread inside a bare ``except:``, so celery beat's handler raising there
turns into a ConnectionClosedError. The replica still stops at once, and hands over."""

from __future__ import annotations

import signal
import subprocess
import time

import pytest
from kazoo.client import KazooClient

from tests.support.accounting import accounting, assert_clean
from tests.support.faults import candidates
from tests.support.helpers import wait_for
from tests.support.processes import Cluster, Publish
from zkbeat.ledger import controls

pytestmark = pytest.mark.processes

STALLED = "zkbeat-test: stalled in kazoo's wake-up send"


def publishes_by(cluster: Cluster, pid: int, since: float = 0.0) -> list[Publish]:
    return [p for p in cluster.publishes() if p.pid == pid and p.at > since]


def test_a_sigterm_swallowed_inside_a_kazoo_call_still_stops_the_leader_and_it_hands_over(
    make_cluster, zk_client: KazooClient, zk_root: str
) -> None:
    """SIGTERM lands while the leader's main thread is inside kazoo's wake-up send (held there by a test hook
    until the signal comes): kazoo swallows the SystemExit, yet the replica exits 0 and the next one leads."""
    cluster = make_cluster(0, schedule={"alpha": 1})
    doomed = cluster.add()
    wait_for(lambda: len(publishes_by(cluster, doomed.pid)) >= 2, timeout=60, message=doomed.log)
    heir = cluster.add()
    wait_for(lambda: len(candidates(zk_client, zk_root)) == 2, timeout=60, message=cluster.logs)
    doomed.signal(signal.SIGUSR2)  # tests/support/beatapp.py: its next kazoo call stalls in the wake-up send
    controls.request_trigger(zk_client, zk_root, "alpha", "ops@bastion", scheduled=True)  # a call outside a claim
    wait_for(lambda: STALLED in doomed.log(), timeout=30, message=doomed.log)
    stopped_at = time.time()
    doomed.signal(signal.SIGTERM)
    try:
        code = doomed.wait(20)
    except subprocess.TimeoutExpired:
        pytest.fail("the leader kept running after a SIGTERM kazoo swallowed\n" + doomed.log()[-4000:])
    assert code == 0, doomed.log()
    assert "shutdown signal (SIGTERM) was swallowed" in doomed.log(), doomed.log()
    wait_for(lambda: len(publishes_by(cluster, heir.pid, stopped_at)) >= 3, timeout=30, message=heir.log)
    assert publishes_by(cluster, doomed.pid, stopped_at + 1) == [], "the stopped leader published on"
    assert_clean(accounting(cluster, zk_client), cluster.logs())

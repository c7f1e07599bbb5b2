"""Many replicas started together; then the leader is killed.

All replicas are launched at once. Two clocks matter: when the last process
was launched (on two cores, 30 Python processes importing Celery take many
seconds of CPU between them, the same for any scheduler) and when the last
one's scheduler was up (its "joining the election" log line). The first
publish is timed from both. Then the leader is killed (kill -9, session 4 s)
and every process's count of ZooKeeper requests (``BENCH_COUNT_ZK``) shows
how many followers woke up: with predecessor watches only the next in line
should do anything.
"""

from __future__ import annotations

import signal
import time

from bench.cluster import PLAIN, ZKBEAT, Run
from bench.context import Bench, takeover_after
from bench.stats import Row, Sample
from bench.steady import zookeeper_requests
from tests.support.helpers import wait_for

JOINED = "zkbeat: joining the election"


def _entries() -> list[dict]:
    return [{"name": "w", "count": 5, "every": 1, "first_due": time.time()}]


def _first_publish(run: Run, timeout: float = 120):
    return wait_for(lambda: (run.publishes() or [None])[0], timeout, 0.01, raise_on_timeout=False)


def run(bench: Bench) -> list[Row]:
    n = 10 if bench.quick else 30
    bench.say(f"swarm: {n} zkbeat replicas started together, then kill -9 of the leader")
    reference = bench.run(PLAIN, _entries())
    with reference:
        reference.start()
        first = _first_publish(reference)
        plain_launch = first.at - reference.beats[0].started_at

    run = bench.run(ZKBEAT, _entries(), BENCH_SESSION_TIMEOUT="4", BENCH_COUNT_ZK="1")
    with run:
        run.start(n)
        first = _first_publish(run)
        joined = wait_for(
            lambda: all(b.events(JOINED) for b in run.beats) and run.beats, 180, 0.1, raise_on_timeout=False
        )
        last_launch = max(b.started_at for b in run.beats)
        last_joined = max(b.events(JOINED)[0].at for b in run.beats) if joined else float("nan")
        bench.say(f"  first publish {first.at - last_launch:.2f} s after the last launch, "
                  f"{first.at - last_joined:.2f} s after the last scheduler came up")  # fmt: skip
        # Let every follower finish joining (its requests stop), then count.
        wait_for(
            lambda: len(bench.client.get_children(f"{run.root}/v1/election")) == n, 60, 0.1, raise_on_timeout=False
        )
        leader = wait_for(run.leader, 30, 0.005, raise_on_timeout=False)
        time.sleep(1.0)  # settle: not a measurement
        before = {b.pid: zookeeper_requests(run, b.pid) for b in run.alive()}
        t0 = time.time()
        leader.signal(signal.SIGKILL)
        event, publish = takeover_after(run, leader.pid, t0, 30)
        time.sleep(1.0)  # let any herd show itself: not a measurement
        woken = [b for b in run.alive() if zookeeper_requests(run, b.pid) > before.get(b.pid, 0)]
        new_leader = getattr(run.leader(), "identity", None)
        bench.say(f"  kill -9 of the leader: {len(woken)} of {n - 1} followers sent ZooKeeper requests "
                  f"({', '.join(b.identity for b in woken)}); new leader {new_leader}")  # fmt: skip
    scenario = f"{n} replicas started together"
    return [
        Row(
            scenario,
            "launch → first publish: 1 celery beat alone / zkbeat from the last launch",
            "s",
            {"plain": Sample([plain_launch]), "zkbeat": Sample([first.at - last_launch])},
            digits=2,
        ),  # fmt: skip
        Row(
            scenario,
            "first publish after the last replica's scheduler came up (negative: before it)",
            "s",
            {"zkbeat": Sample([first.at - last_joined])},
            target="≤ 2 s",
            check=lambda row: row.values["zkbeat"].median <= 2,
            digits=2,
        ),
        Row(
            scenario,
            "followers that woke (sent any ZooKeeper request) when the leader was killed",
            "replicas",
            {"zkbeat": Sample([len(woken)])},
            target="exactly 1",
            check=lambda row: row.values["zkbeat"].median == 1,
            digits=0,
        ),
    ]

"""Graceful handover: SIGTERM the leader while a tick is overdue.

To time "first publish of an overdue entry" the leader must be stopped with a
tick already due and not yet sent. So each trial waits for the leader's
publish of ``tick`` (every 1 s), pauses the leader (SIGSTOP) half a second
later, lets the next tick come due, then sends SIGTERM and SIGCONT together:
t0. From t0 the paused leader handles SIGTERM as beat does in production
(close the scheduler, then exit) and the next replica must take over. Both
times come from the processes themselves: the new leader's log line and its
``before_task_publish`` record. The stopped replica is replaced, so every
trial starts from the same number of replicas.
"""

from __future__ import annotations

import math
import signal
import threading
import time
import uuid

from kazoo.client import KazooClient

from bench.cluster import REDBEAT, REDBEAT_TUNED, ZKBEAT, Flavour
from bench.context import Bench, takeover_after, wait_leader_publishing, wait_settled, wait_started
from bench.stats import Row, Sample

ENTRIES = [{"name": "tick", "every": 1}]


def _sleep_until(moment: float) -> None:
    delay = moment - time.time()
    if delay > 0:
        time.sleep(delay)


def _trials(bench: Bench, flavour: Flavour, trials: int, cap: float) -> tuple[Sample, Sample]:
    ready, first = Sample(cap=cap), Sample(cap=cap)
    run = bench.run(flavour, ENTRIES)
    with run:
        run.start()
        wait_started(run.beats)
        mark = time.time()
        for trial in range(trials):
            found = wait_leader_publishing(run, "tick", mark)
            if found is None:
                bench.say(f"  {flavour.key}: no leader publishing; trial {trial} abandoned")
                break
            leader, last = found
            _sleep_until(last.at + 0.5)
            leader.signal(signal.SIGSTOP)
            _sleep_until(last.at + 1.15)
            t0 = time.time()
            leader.signal(signal.SIGTERM)
            leader.signal(signal.SIGCONT)
            event, publish = takeover_after(run, leader.pid, t0, cap, cap)
            ready.values.append(event.at - t0 if event else math.inf)
            first.values.append(publish.at - t0 if publish else math.inf)
            bench.say(f"  {flavour.key} handover {trial + 1}/{trials}: ready {_ms(ready.values[-1])}, "
                      f"first publish {_ms(first.values[-1])}")  # fmt: skip
            leader.kill()
            if event is None:
                break  # the remaining replicas are still waiting; a further trial would measure nothing new
            wait_settled(run.add())
            mark = time.time()
    for sample in (ready, first):
        sample.values = [v * 1000 if v != math.inf else v for v in sample.values]
        sample.cap = cap * 1000
    return ready, first


def _ms(seconds: float) -> str:
    return "timeout" if seconds == math.inf else f"{seconds * 1000:.1f} ms"


class _Seen:
    """A watch callback that notes when it fired."""

    def __init__(self) -> None:
        self.fired = threading.Event()
        self.at = 0.0

    def __call__(self, event: object) -> None:
        self.at = time.time()
        self.fired.set()


def _delete_floor(bench: Bench, trials: int) -> Sample:
    """How long a ZooKeeper delete takes to reach another client's watch (ms)."""
    watcher = KazooClient(bench.zk.hosts)
    watcher.start(timeout=30)
    sample = Sample()
    try:
        for _ in range(trials):
            path = f"/zkbench/floor-{uuid.uuid4().hex}"
            bench.client.create(path, makepath=True)
            seen = _Seen()
            watcher.exists(path, watch=seen)
            t0 = time.time()
            bench.client.delete(path)
            if seen.fired.wait(5):
                sample.values.append((seen.at - t0) * 1000)
    finally:
        watcher.stop()
        watcher.close()
    return sample


def run(bench: Bench) -> list[Row]:
    trials = 3 if bench.quick else 20
    results = {}
    floor = _delete_floor(bench, 20 if bench.quick else 100)
    bench.say(f"graceful handover: SIGTERM the leader x{trials}")
    for flavour, n, cap in (
        (ZKBEAT, trials, 10.0),
        (REDBEAT_TUNED, trials, 10.0),
        # redbeat's defaults: followers poll the lock every beat_max_loop_interval (300 s).
        (REDBEAT, 1, 3.0 if bench.quick else 20.0),
    ):
        results[flavour.key] = _trials(bench, flavour, n, cap)
    not_applicable = Sample(note="n/a (1 replica)")
    return [
        Row(
            "graceful handover (SIGTERM)",
            "floor: a ZooKeeper delete reaches another client's watch",
            "ms",
            {"zkbeat": floor},
            digits=2,
        ),
        Row(
            "graceful handover (SIGTERM)",
            "new leader ready after the signal",
            "ms",
            {key: r[0] for key, r in results.items()} | {"plain": not_applicable},
            target="p99 ≤ 50 ms",
            check=lambda row: row.values["zkbeat"].p99 <= 50,
        ),
        Row(
            "graceful handover (SIGTERM)",
            "first publish of the overdue tick",
            "ms",
            {key: r[1] for key, r in results.items()} | {"plain": not_applicable},
            target="p99 ≤ 100 ms",
            check=lambda row: row.values["zkbeat"].p99 <= 100,
        ),
    ]

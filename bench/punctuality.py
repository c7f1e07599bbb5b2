"""Punctuality: 5 entries every 1 s on 3 replicas (celery beat: 1).

For each entry, the gap between two consecutive publishes (``before_task_publish``
records, any replica) should be exactly the interval; the error is
``|gap - 1 s|``. A scheduler that wakes late, or rounds due times to whole
seconds, shows here.
"""

from __future__ import annotations

import time
from collections import defaultdict

from bench.cluster import FLAVOURS, Run
from bench.context import Bench, wait_leader_publishing
from bench.stats import Row, Sample
from bench.windows import run_windows

INTERVAL = 1.0


def _errors(run: Run, started: float, elapsed: float) -> Sample:
    by_entry = defaultdict(list)
    for p in run.publishes():
        if started <= p.at <= started + elapsed:
            by_entry[p.entry].append(p.at)
    sample = Sample()
    for times in by_entry.values():
        times.sort()
        sample.values += [abs(b - a - INTERVAL) * 1000 for a, b in zip(times, times[1:])]
    return sample


def run(bench: Bench) -> list[Row]:
    duration = 6.0 if bench.quick else 60.0
    bench.say(f"punctuality: 5 entries every 1 s for {duration:g} s")
    results = run_windows(
        bench,
        FLAVOURS,
        lambda: [{"name": "p", "count": 5, "every": INTERVAL}],
        duration,
        settle=lambda run: wait_leader_publishing(run, "p-00000", 0),
        snapshot=lambda run: None,
        measure=lambda run, _, elapsed: _errors(run, time.time() - elapsed, elapsed),
    )
    for key, sample in results.items():
        bench.say(f"  {key}: {sample.n} gaps, error median {sample.median:.1f} ms, p99 {sample.p99:.1f} ms")
    return [
        Row(
            f"punctuality: 5 entries every 1 s, {duration:g} s",
            "|gap between publishes − 1 s|",
            "ms",
            results,
            target="p99 ≤ celery beat p99 + 5 ms",
            check=lambda row: row.values["zkbeat"].p99 <= row.values["plain"].p99 + 5,
        )
    ]

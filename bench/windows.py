"""Run flavours through one measuring window each (or all at once with --quick).

The full run gives every flavour the machine to itself, one after another;
``--quick`` runs them side by side to stay under two minutes, which is
noisier and says so in the header. The window's length is not a measurement:
every figure comes from what the processes recorded or from /proc.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from bench.cluster import Flavour, Run
from bench.context import Bench, wait_started

Snapshot = Callable[[Run], Any]
Measure = Callable[[Run, Any, float], Any]


def run_windows(
    bench: Bench,
    flavours: tuple[Flavour, ...],
    entries: Callable[[], list[dict]],
    duration: float,
    settle: Callable[[Run], None],
    snapshot: Snapshot,
    measure: Measure,
    env: dict[str, str] | None = None,
) -> dict[str, Any]:
    """For each flavour: start its cluster, ``settle``, snapshot, wait ``duration``, ``measure``."""
    groups = [list(flavours)] if bench.quick else [[flavour] for flavour in flavours]
    results: dict[str, Any] = {}
    for group in groups:
        runs = [bench.run(flavour, entries(), **(env or {})) for flavour in group]
        try:
            for run in runs:
                run.start()
            for run in runs:
                wait_started(run.beats)
                settle(run)
            before = [(run, snapshot(run), time.time()) for run in runs]
            time.sleep(duration)
            for run, snap, started in before:
                results[run.flavour.key] = measure(run, snap, time.time() - started)
        finally:
            for run in runs:
                run.close()
    return results

"""An interval entry published on time keeps its grid: its next slot is one interval after this one.

Counted from the moment the pass read the clock (which is after the slot:
the heap holds an entry until just past its due moment, and the pass takes
time), each slot came a little later than the one before, and every gap
between two publishes was the interval plus that lateness.
"""

from __future__ import annotations

import time
from datetime import datetime, timedelta

from celery.signals import after_task_publish

from tests.support.helpers import Published, connected, every, lead, wait_for
from zkbeat.leading.term import ON_TIME
from zkbeat.ticking.jitter import offset


def test_an_interval_published_on_time_goes_on_from_its_slot(make_scheduler, published: Published) -> None:
    interval = 1.0
    jitters = {"grid": 0.0, "jittered": 0.3}
    scheduler = make_scheduler({name: every(interval, options={"zkbeat_jitter": j}) for name, j in jitters.items()})
    root = scheduler.zk_settings.root
    sent_at: dict[tuple[str, str], float] = {}

    def note(headers=None, **kwargs) -> None:
        sent_at[(headers["zkbeat-entry"], headers["zkbeat-slot"])] = time.time()

    lead(scheduler)
    with connected(after_task_publish, note):
        wait_for(
            lambda: scheduler.tick() is not None and min(published.count(name) for name in jitters) >= 5, timeout=30
        )
    for name, jitter in jitters.items():
        slots = [datetime.fromisoformat(slot) for _, slot, _ in published.of(name)]
        checked = 0
        for before, after in zip(slots, slots[1:]):
            # Lateness counts from the jittered moment: a jitter is not a misfire.
            late = sent_at[(name, before.isoformat())] - before.timestamp() - offset(root, name, before, jitter)
            assert late >= 0, f"{name}: published before its (jittered) moment {before}"
            if late > min(ON_TIME, interval / 2):
                continue  # a pass this late (a loaded machine) goes on from the moment it ran, as Celery's does
            assert after - before == timedelta(seconds=interval), f"{name}: {before} then {after}, {late:.4f}s late"
            checked += 1
        assert checked, f"{name}: no publish came on time to check: {slots}"

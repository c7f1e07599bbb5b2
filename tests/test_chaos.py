"""The chaos soak, short: every fault kind once, then the accounting.

`make chaos DURATION=1800` is the real soak (a fault every 20-60 s). Here the
faults come every 8-14 s for about 100 s, enough for one shuffled round of all
five kinds, so that `make test` stays well inside its time budget while each
kind still meets the others' aftermath. ZKBEAT_CHAOS_SECONDS makes it longer.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.support.chaos import FAULTS, run

pytestmark = pytest.mark.processes

SECONDS = float(os.environ.get("ZKBEAT_CHAOS_SECONDS", "100"))


def test_chaos_soak_publishes_each_tick_once(tmp_path: Path) -> None:
    """Random faults into the leader (kill -9, SIGTERM, SIGSTOP, ZooKeeper and broker restarts): nothing twice."""
    soak = run(SECONDS, every=(8.0, 14.0), log_dir=tmp_path, say=lambda text: None)
    print(soak.summary())
    assert {event.fault for event in soak.events} == set(FAULTS), soak.summary()
    assert soak.report.twice == 0, soak.summary()
    assert soak.report.lost_unexplained == [] and soak.report.unpublished_claims == [], soak.summary()
    assert soak.unexpected_exits == [], soak.summary()
    assert len(soak.report.leaders) >= 3, "the faults never moved leadership"

"""How far this replica's clock is from ZooKeeper's, measured on taking over.

No clock decides who leads, but the schedule runs on the leader's wall clock:
the ledger's ``last_run_at`` is written by one leader's clock and read by the
next one's. A new leader whose clock is behind the last one's waits that much
longer for the next tick (an interval entry stalls for the difference); one
that is ahead catches up at once. Neither publishes a tick twice (slots only
move forward), but an operator should hear about it, so a new leader compares
its clock with ZooKeeper's and warns past :data:`SKEW_WARNING`.

ZooKeeper stamps every write with its leader's clock (a znode's ``mtime``), so
one write to ``<root>/v1/clock`` and the local time around it measure the
skew, give or take half the round trip.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass

from kazoo.client import KazooClient
from kazoo.exceptions import NoNodeError

__all__ = ["SKEW_WARNING", "Skew", "measure_skew"]

#: Seconds of skew, beyond the measurement's own uncertainty, that are warned about.
SKEW_WARNING = 1.0


@dataclass(frozen=True)
class Skew:
    """This replica's wall clock minus ZooKeeper's, in seconds, ± ``uncertainty``."""

    seconds: float
    uncertainty: float

    @property
    def worth_a_warning(self) -> bool:
        return abs(self.seconds) - self.uncertainty > SKEW_WARNING

    def describe(self) -> str:
        side = "ahead of" if self.seconds > 0 else "behind"
        return f"{abs(self.seconds):.1f}s {side} ZooKeeper's (±{self.uncertainty:.2f}s)"


def measure_skew(client: KazooClient, path: str, identity: str, now: Callable[[], float] = time.time) -> Skew:
    """Write ``path`` (creating it if needed) and compare its mtime with ``now()``.

    ZooKeeper errors propagate; the caller decides that a failed measurement
    is not a reason to stop leading.
    """
    before = now()
    data = json.dumps({"identity": identity, "local_time": before}).encode()
    try:
        stat = client.set(path, data)
    except NoNodeError:
        client.create(path, data, makepath=True)
        stat = client.exists(path)
    after = now()
    server = stat.mtime / 1000.0
    return Skew(seconds=(before + after) / 2 - server, uncertainty=(after - before) / 2)

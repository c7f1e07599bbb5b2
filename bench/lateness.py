"""Where an on-time tick's lateness goes: one zkbeat leader in this process, 5 entries every 1 s.

``python -m bench.lateness [--seconds 40]`` runs the punctuality scenario's
schedule on one in-process ``zkbeat.Scheduler`` driven by beat's own loop
(tick, sleep what it says), on a ZooKeeper and a Redis of its own
(tests/support/servers.py), and splits each second's lateness (the moment
after the slot) into its stages: the pass woke, the fenced claim left for
ZooKeeper, its answer came back, the first message was handed to kombu
(``before_task_publish``). It prints each stage's p50 / p90 / p99 in ms, a
bare one-znode write's round trip on the same server (the floor of a
claim: ZooKeeper answers a write once its log is on disk), the
gap error the punctuality row measures (``|gap between publishes − 1 s|``)
and how far each slot is from the one before less the interval (the grid:
0 when the entry goes on from its slot). The first two ticks of each entry
(the takeover) are left out. No pass/fail: a measurement to read.
"""

from __future__ import annotations

import argparse
import time
from datetime import datetime

from celery import Celery
from celery.signals import before_task_publish

from tests.support.servers import RedisServer, ZooKeeperServer

STAGES = ("woke", "claim sent", "claim answered", "first publish")


def _quantiles(values: list[float]) -> str:
    values = sorted(values)
    if not values:
        return "n/a"
    at = [values[min(len(values) - 1, int(q * len(values)))] for q in (0.5, 0.9, 0.99)]
    return " / ".join(f"{v:.2f}" for v in at)


def _bare_writes(hosts: str, count: int = 200) -> list[float]:
    """Round trips (ms) of ``count`` one-znode writes on the same ZooKeeper: the floor of a fenced claim."""
    from kazoo.client import KazooClient

    client = KazooClient(hosts)
    client.start(timeout=30)
    try:
        client.ensure_path("/lateness-floor")
        times = []
        for n in range(count):
            started = time.perf_counter()
            client.set("/lateness-floor", str(n).encode())
            times.append((time.perf_counter() - started) * 1000)
            time.sleep(0.01)
        return times
    finally:
        client.stop()
        client.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=40.0, help="how long to run (default 40)")
    args = parser.parse_args()

    import zkbeat
    from zkbeat.ledger import store

    publishes: list[tuple[str, str, float]] = []
    stages: dict[str, list[float]] = {stage: [] for stage in STAGES[:3]}

    def record(headers=None, **kwargs) -> None:
        publishes.append((headers["zkbeat-entry"], headers["zkbeat-slot"], time.time()))

    before_task_publish.connect(record, weak=False)
    start_claim, result = store.Ledger.start_claim, store.ClaimInFlight.result

    def timed_start(self, *a, **k):
        stages["claim sent"].append(time.time())
        return start_claim(self, *a, **k)

    def timed_result(self, *a, **k):
        answer = result(self, *a, **k)
        stages["claim answered"].append(time.time())
        return answer

    store.Ledger.start_claim, store.ClaimInFlight.result = timed_start, timed_result
    with ZooKeeperServer() as zk, RedisServer() as redis:
        app = Celery("lateness", set_as_current=False)
        app.conf.update(
            broker_url=redis.url,
            zkbeat_hosts=zk.hosts,
            zkbeat_root="/lateness",
            beat_schedule={f"p-{i}": {"task": "lateness.noop", "schedule": 1.0} for i in range(5)},
        )
        floor = _bare_writes(zk.hosts)
        scheduler = zkbeat.Scheduler(app)
        try:
            assert scheduler.election.wait_for_leadership(timeout=30), "never became leader"
            end = time.time() + args.seconds
            while time.time() < end:
                stages["woke"].append(time.time())
                wait = scheduler.tick()
                if wait:
                    time.sleep(wait)
        finally:
            scheduler.close()

    by_entry: dict[str, list[tuple[float, float]]] = {}
    for entry, slot, at in publishes:
        by_entry.setdefault(entry, []).append((datetime.fromisoformat(slot).timestamp(), at))
    slots, gaps, grid = set(), [], []
    for rows in by_entry.values():
        rows = rows[2:]
        slots.update(slot for slot, _ in rows)
        gaps += [abs(b[1] - a[1] - 1) * 1000 for a, b in zip(rows, rows[1:])]
        grid += [abs(b[0] - a[0] - 1) * 1000 for a, b in zip(rows, rows[1:])]
    firsts = sorted(at for _, _, at in publishes)
    moments = {**{stage: sorted(times) for stage, times in stages.items()}, "first publish": firsts}
    print(f"{len(slots)} slots, {len(gaps)} gaps; ms after the slot, p50 / p90 / p99:")
    for stage in STAGES:
        times = moments[stage]
        after = [(next((t for t in times if t >= slot), slot) - slot) * 1000 for slot in sorted(slots)]
        print(f"  {stage:<15} {_quantiles(after)}")
    print(f"  a bare write    {_quantiles(floor)}  (kazoo set() on the same server, round trip: its commit)")
    print(f"  gap error       {_quantiles(gaps)}  (|gap between publishes − 1 s|)")
    print(f"  off the grid    {_quantiles(grid)}  (|slot − previous slot − 1 s|)")


if __name__ == "__main__":
    main()

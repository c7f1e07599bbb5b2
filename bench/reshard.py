"""What a reshard costs: 3 replicas, 10,000 entries every 60 s, ``zkbeat_shards`` 1 → 3 by a rolling restart.

Three replicas of ``celery beat`` (``bench/shardsapp.py``) start with
``zkbeat_shards = 1``; the entries all come due LEAD seconds after the
launch and then every minute, with one small entry every second in each of
the 3 shards to come (as in bench/shards.py). ROLL_AT seconds after the
first round came due the replicas are replaced one at a time, as a rolling
restart does: SIGTERM, wait for the process to exit, start its replacement
with ``zkbeat_shards = 3``, wait until the replacement has its schedule
built (bench.context.wait_settled), then the next. The second round comes
due during the roll; the window (bench/accounting.py) covers ROUNDS minutes
from the first round, so the rounds after the roll count too.

Measured: the roll (first SIGTERM → last replacement built, and → the 3
shards settled: every one led, none above ceil(3/3)), each round's first →
last publish and lateness, the claims that conflicted (zkbeat's "changed
underneath" warning: two leaders of the old and the new value claimed the
same entry, one committed), ZooKeeper writes per publish, and every tick
once over the window: published twice, missed, claimed and not published.
"""

from __future__ import annotations

import math
import os
import signal
import threading
import time
from dataclasses import dataclass

from bench import shards
from bench.context import Bench, wait_settled
from bench.stats import Row, Sample
from tests.support.helpers import wait_for

ENTRIES = 10_000
EVERY = 60.0
LEAD = 35.0
#: Seconds after the first round came due that the roll starts: the roll (about 10 s here) spans the second round.
ROLL_AT = 52.0
ROUNDS = 3
#: The shard counts before and after.
BEFORE, AFTER = 1, 3
CONFLICT = "changed underneath"


@dataclass
class Roll:
    started: float = math.nan
    #: Seconds from the first SIGTERM until the last replacement had its schedule built.
    built: float = math.inf
    #: Seconds from the first SIGTERM until the new value's shards stood settled.
    settled: float = math.inf


def _roll(bench: Bench, run, roll: Roll, at: float) -> None:
    time.sleep(max(0.0, at - time.time()))
    roll.started = time.time()
    old = list(run.beats)
    for beat in old:
        beat.signal(signal.SIGTERM)
        if beat.process is not None:
            beat.process.wait(60)
        run.env["BENCH_SHARDS"] = str(AFTER)
        replacement = run.add()
        if not wait_settled(replacement, 90):
            bench.note(f"reshard: replacement {replacement.identity} not settled within 90 s")
    roll.built = time.time() - roll.started
    if wait_for(lambda: shards._settled(bench, run, AFTER), 120, 0.2, raise_on_timeout=False):
        roll.settled = time.time() - roll.started


def run(bench: Bench) -> list[Row]:
    count = 1_000 if bench.quick else ENTRIES
    every = 20.0 if bench.quick else EVERY
    lead = 15.0 if bench.quick else LEAD
    bench.say(f"reshard: 3 replicas, {count:,} entries every {every:g} s, zkbeat_shards {BEFORE} → {AFTER} rolling")
    result = shards.Result(load=(os.getloadavg()[0], math.nan))
    roll = Roll()
    due = time.time() + lead
    run = shards._cluster(bench, BEFORE, count, every, due, pulses=AFTER)  # the pulses: one in each shard to come
    with run:
        shards._launch(run, result, lead)
        roller = threading.Thread(target=_roll, args=(bench, run, roll, due + ROLL_AT * every / EVERY), daemon=True)
        roller.start()
        shards._window(bench, run, result, count, due, ROUNDS, every)
        roller.join(180)
        conflicts = sum(len(beat.events(CONFLICT)) for beat in run.beats)
    bench.drop(run.root)
    ticks = result.ticks
    bench.say(
        f"  load {result.load[0]:.2f} → {result.load[1]:.2f}; roll built {roll.built:.2f} s, settled "
        f"{roll.settled:.2f} s after the first SIGTERM; "
        + "; ".join(
            f"round {k}: {b.span:.2f} s first to last (by {b.publishers}), late p50 / p99 "
            f"{Sample(b.late).median:.3f} / {Sample(b.late).p99:.3f} s"
            for k, b in enumerate(result.bursts, 1)
        )
        + f"; {conflicts} conflicts; {result.writes_per_publish:.3f} writes a publish; "
        + (ticks.summary() if ticks else "no window")
    )
    return _rows(count, every, result, roll, conflicts)


def _rows(count: int, every: float, result: shards.Result, roll: Roll, conflicts: int) -> list[Row]:
    scenario = f"reshard: 3 replicas, {count:,} entries every {every:g} s, zkbeat_shards {BEFORE} → {AFTER} rolling"

    def single(value: float, cap: float | None = None) -> dict[str, Sample]:
        return {"zkbeat": Sample([value], cap=cap)}

    rows = [
        Row(scenario, "machine load average at the launch", "1 min", single(result.load[0]), digits=2),
        Row(scenario, "machine load average at the window's end", "1 min", single(result.load[1]), digits=2),
        Row(scenario, "first SIGTERM → last replacement's schedule built", "s", single(roll.built), digits=2),
        Row(scenario, f"first SIGTERM → the {AFTER} shards settled", "s", single(roll.settled), digits=2),
    ]
    when = {1: "before the roll", 2: "during the roll", 3: "after it"}
    for k, burst in enumerate(result.bursts, 1):
        rows += [
            Row(
                scenario,
                f"round {k} ({when.get(k, '')}): first → last publish (by replica: {burst.publishers or '?'})",
                "s",
                single(burst.span, cap=ROUNDS * every),
                digits=2,
            ),
            Row(
                scenario,
                f"round {k}: lateness, publish − its slot, p50 / p99",
                "s",
                {"zkbeat": Sample(burst.late or [math.inf], cap=ROUNDS * every)},
                digits=3,
            ),
        ]
    ticks = result.ticks
    rows += [
        Row(scenario, 'claims that conflicted ("changed underneath" warnings)', "claims", single(conflicts), digits=0),
        Row(scenario, "ZooKeeper znode writes per publish", "per publish", single(result.writes_per_publish), digits=3),
    ]
    if ticks is not None:
        what = f"{ticks.ticks:,} ticks due in {ROUNDS} rounds"
        zero = {"target": "0", "check": lambda row: row.values["zkbeat"].median == 0}
        rows += [
            Row(scenario, f"{what}: published twice", "ticks", single(ticks.twice), digits=0, **zero),
            Row(
                scenario,
                f"{what}: missed (not published in the window)",
                "ticks",
                single(ticks.missed),
                digits=0,
                **zero,
            ),
            Row(scenario, f"{what}: claimed, not published", "ticks", single(ticks.lost), digits=0),
            Row(scenario, f"{what}: runs the leaders recorded as catch-up", "ticks", single(ticks.catch_up), digits=0),
        ]
    return rows

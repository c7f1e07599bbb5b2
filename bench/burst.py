"""Burst: N entries due at the same moment, then takeover with an N-entry ledger.

Every entry gets ``last_run_at`` = the chosen moment minus its interval, so
all N come due together at that moment in every scheduler, and the clock
starts there: "all published" is the last ``before_task_publish`` record
minus that moment. The processes start early enough to be leading before it
(checked from their logs and reported if not).

Afterwards zkbeat's ledger holds N entries, so the same cluster times a
graceful takeover that has to load them all (the "became leader" line says
how long the load took).

``BENCH_BURST_FLAVOURS=zkbeat`` runs only the named schedulers (celery beat's
own burst of 10,000 takes minutes); zkbeat always runs (the rows and the
takeover are measured on its run), and a name no scheduler has is refused.
``BENCH_BURST_TRIALS=N`` sets zkbeat's trials (default 2, 1 with ``--quick``;
at least 1).
"""

from __future__ import annotations

import math
import os
import signal
import time

from bench import cores, wire
from bench.cluster import BECAME_LEADER, FLAVOURS, ZKBEAT, Flavour, Run
from bench.context import Bench, takeover_after, wait_settled, wait_started
from bench.stats import Row, Sample
from tests.support.helpers import wait_for

#: Seconds a burst may take; celery beat's own tick is O(entries) per publish.
CAP = 600.0


def _distinct(run: Run) -> int:
    """Entries published at least once (a scheduler that publishes some twice is not done sooner)."""
    return len({p.entry for p in run.publishes()})


def _burst(bench: Bench, flavour: Flavour, n: int, lead: float, cap: float, samples: dict, keep: bool = False):
    due = time.time() + lead
    run = bench.run(flavour, [{"name": "burst", "count": n, "every": 3600, "first_due": due}])
    run.start()
    done = wait_for(lambda: _distinct(run) >= n, lead + cap, 0.2, raise_on_timeout=False)
    rows = [p for p in run.publishes() if p.entry.startswith("burst-")]
    firsts = sorted({p.entry: p.at for p in reversed(rows)}.values())
    leader = run.leader()
    led = leader.events(flavour.leader_line)[-1].at if leader else math.inf
    if led > due:
        samples["note"].append(f"{flavour.key}: leading {led - due:.2f} s after the due moment")
    samples["twice"][flavour.key].values.append(len(rows) - len({p.entry for p in rows}))
    samples["all"][flavour.key].values.append(firsts[-1] - due if done and firsts else math.inf)
    samples["first"][flavour.key].values.append(firsts[0] - due if firsts else math.inf)
    last, first = samples["all"][flavour.key].values[-1], samples["first"][flavour.key].values[-1]
    bench.say(f"  {flavour.key} burst of {n}: {len(rows)} published, last {last:.3f} s after the due moment, "
              f"first {first:.3f} s")  # fmt: skip
    if keep:
        return run
    run.close()
    return None


def _takeovers(bench: Bench, run: Run, trials: int) -> tuple[Sample, Sample]:
    load, ready = Sample(), Sample()
    with run:
        wait_started(run.beats)
        for _ in range(trials):
            leader = wait_for(run.leader, 30, 0.005, raise_on_timeout=False)
            if leader is None:
                break
            t0 = time.time()
            leader.signal(signal.SIGTERM)
            event, _ = takeover_after(run, leader.pid, t0, 30, 0.1)
            if event is None:
                break
            match = BECAME_LEADER.search(event.message)
            load.values.append(float(match.group(4)))
            ready.values.append((event.at - t0) * 1000)
            bench.say(f"  zkbeat takeover with a ledger of {match.group(3)} entries: loaded in {match.group(4)} ms, "
                      f"ready {ready.values[-1]:.1f} ms after SIGTERM")  # fmt: skip
            leader.kill()
            wait_settled(run.add())
    return load, ready


def _flavours(names: str | None) -> tuple[Flavour, ...]:
    """The schedulers BENCH_BURST_FLAVOURS names (comma-separated keys), zkbeat always among them; all when unset."""
    if not names:
        return FLAVOURS
    wanted = {name.strip() for name in names.split(",") if name.strip()}
    unknown = wanted - {f.key for f in FLAVOURS}
    if unknown:
        raise ValueError(f"BENCH_BURST_FLAVOURS: no scheduler is called {', '.join(sorted(unknown))}")
    return tuple(f for f in FLAVOURS if f is ZKBEAT or f.key in wanted)


def run(bench: Bench) -> list[Row]:
    n = 2000 if bench.quick else 10000
    trials = max(1, int(os.environ.get("BENCH_BURST_TRIALS") or (1 if bench.quick else 2)))
    flavours = _flavours(os.environ.get("BENCH_BURST_FLAVOURS"))  # e.g. "zkbeat": without the others' long bursts
    lead = 4.0 if bench.quick else 12.0
    bench.say(f"burst: {n} entries due at one moment, x{trials}")
    pace = cores.alone_seconds()
    bench.say(f"  this machine: bench/cores.py's work on one core in {pace:.3f} s")
    samples = {
        "all": {f.key: Sample(cap=CAP) for f in FLAVOURS},
        "first": {f.key: Sample(cap=CAP) for f in FLAVOURS},
        "twice": {f.key: Sample() for f in FLAVOURS},
        "note": [],
    }
    ledger_run = None
    for trial in range(trials):
        for flavour in flavours:
            if flavour is not ZKBEAT and trial > 0:
                continue  # one trial each: celery beat alone needs minutes for 10,000 (see README)
            keep = flavour is ZKBEAT and trial == trials - 1
            kept = _burst(bench, flavour, n, lead, CAP, samples, keep=keep)
            ledger_run = kept or ledger_run
    messages = wire.zkbeat_messages(bench.redis.url)
    floor = wire.push(bench.redis.url, messages, n)[1] if messages else float("nan")
    bench.say(f"  floor: {n} of zkbeat's messages pushed by a redis-py pipeline in {floor:.3f} s")
    load, ready = _takeovers(bench, ledger_run, 1 if bench.quick else 5)
    for note in samples["note"]:
        bench.note(f"burst: {note}")
    scenario = f"burst: {n:,} entries due at once"
    return [
        Row(
            scenario,
            f"all {n:,} published, after the due moment",
            "s",
            samples["all"],
            target=f"≤ {1.5 * n / 10000:g} s",
            check=lambda row: row.values["zkbeat"].median <= 1.5 * n / 10000,
            digits=2,
        ),
        Row(
            scenario,
            f"floor: {n:,} of zkbeat's messages pushed by a bare redis-py pipeline",
            "s",
            {"zkbeat": Sample([floor])},
            digits=3,
        ),
        Row(scenario, "first published, after the due moment", "s", samples["first"], digits=3),
        Row(
            scenario,
            "this machine's pace: bench/cores.py's work on one core (the seconds above move with it)",
            "s",
            {"zkbeat": Sample([pace])},
            digits=3,
        ),
        Row(
            scenario,
            "entries published more than once (total over the trials)",
            "ticks",
            {key: Sample([sum(sample.values)]) for key, sample in samples["twice"].items() if sample.values},
            target="0",
            check=lambda row: row.values["zkbeat"].median == 0,
            digits=0,
        ),
        Row(
            f"takeover with a {n:,}-entry ledger",
            "ledger loaded (multiRead, 1,000 reads a request)",
            "ms",
            {"zkbeat": load},
            target="≤ 300 ms",
            check=lambda row: row.values["zkbeat"].p99 <= 300,
        ),
        Row(f"takeover with a {n:,}-entry ledger", "new leader ready after SIGTERM", "ms", {"zkbeat": ready}),
    ]

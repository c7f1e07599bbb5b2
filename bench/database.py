"""Database schedules: django-celery-beat rows on PostgreSQL, 10,000 and 100,000 of them every 60 s.

Each row is an interval task every 60 s whose ``last_run_at`` makes it due
the moment the replicas are launched, so "launch → first publish" is what a
new leader costs (start-up, reading the rows, the ledger, the first claim),
not a wait for the schedule; it is timed over TAKEOVERS launches of one
replica (as django-celery-beat runs), and once for the rounds trial's
replicas launched together (zkbeat's three import Celery and Django on the
same two cores, seconds under load). In that trial every row comes due again 60 s after its
first publish, so the second round shows how late a minute's ticks go out;
after it, the leader gets SIGTERM and its successor's takeover (the tables
read, a ledger of every row loaded) is timed from its log line.

Side by side on the same rows: zkbeat.DatabaseScheduler on 3 replicas, and
django-celery-beat's own DatabaseScheduler alone (1 replica; it cannot run
more). A round that does not finish within its cap is kept as ``>cap``.
Every time comes from a ``before_task_publish`` record the process wrote
(bench/djangoapp.py) or its own log line.
"""

from __future__ import annotations

import math
import os
import signal
import time
from collections import defaultdict
from dataclasses import replace
from datetime import datetime, timedelta, timezone
from pathlib import Path

from bench import probes
from bench.accounting import Ledger, account
from bench.cluster import DJANGO_CELERY_BEAT, ZKBEAT_DATABASE, Beat, Flavour, Run
from bench.context import Bench, takeover_after
from bench.schemadb import ScheduleDatabase
from bench.stats import Row, Sample

EVERY = 60
#: Celery's log line that says a process's beat service starts (imports done, nothing read yet).
UP = "beat: Starting..."
#: Launches per size and flavour that only time the first publish (the rounds trial adds one);
#: ``BENCH_DATABASE_TAKEOVERS`` sets another number.
TAKEOVERS = 3
#: Seconds a first round may take from the launch, and the second from the first's end;
#: ``BENCH_DATABASE_CAPS`` (``first,second``) sets both for every size.
CAPS = {10_000: (240.0, 180.0), 100_000: (600.0, 300.0)}
#: django-celery-beat alone publishes 10,000 rows in minutes (72 ms a row): its first round is
#: capped at this, and its second round is not waited for once the first was capped.
COMPARISON_CAP = 120.0
#: The rows of the every-tick-once window: the first two rounds, two minutes from the first publish.
WINDOW_ROUNDS = 2


class Tally:
    """Publish records read as they are appended (the files grow to 200,000 lines)."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.offsets: dict[Path, int] = {}
        self.times: dict[str, list[float]] = defaultdict(list)
        self.first = math.inf
        self.first_pid = 0

    def read(self) -> None:
        for path in self.folder.glob("*.tsv"):
            with open(path) as handle:
                handle.seek(self.offsets.get(path, 0))
                data = handle.read()
            end = data.rfind("\n") + 1  # a line still being written waits for the next read
            self.offsets[path] = self.offsets.get(path, 0) + len(data[:end].encode())
            for line in data[:end].splitlines():
                parts = line.split("\t")
                if len(parts) == 3 and parts[0].startswith("row-"):
                    at = float(parts[2])
                    self.times[parts[0]].append(at)
                    if at < self.first:
                        self.first, self.first_pid = at, int(parts[1])

    def rounds(self, n: int) -> int:
        """Entries published at least ``n`` times."""
        return sum(1 for times in self.times.values() if len(times) >= n)


def _wait_rounds(tally: Tally, count: int, n: int, deadline: float, run: Run) -> bool:
    while time.time() < deadline and run.alive():
        tally.read()
        if tally.rounds(n) >= count:
            return True
        time.sleep(1.0)
    tally.read()
    return tally.rounds(n) >= count


def _read_line(run: Run) -> str:
    """What the leader's log says of its read of the tables (zkbeat), to explain a first publish."""
    leader = run.leader()
    lines = leader.events("read of the schedule") if leader is not None else []
    return f" ({lines[0].message.split(': ', 1)[1]})" if lines else ""


def _stopped(leader: Beat, t0: float, until: float) -> float:
    """When the SIGTERMed leader's own log says it stopped leading (its last shard), before ``until``.

    zkbeat.DatabaseScheduler writes the run times of every row run since
    beat's last sync while it still leads, then ends its terms ("stopped
    leading" per shard) and deletes its candidates: the successor's wait
    up to here is the leader's shutdown, the rest is the successor's own
    takeover. ``until`` where no such line came.
    """
    stops = [e.at for e in leader.events("zkbeat: stopped leading") if t0 < e.at <= until]
    return max(stops) if stops else until


def _since_up(run: Run, tally: Tally) -> float:
    """Seconds from the publishing process's scheduler start (its own log line) to its first publish.

    Launch → first publish also holds the process's start-up (importing
    Celery and Django: seconds on a loaded machine, with three replicas
    starting on two cores); this is the scheduler's own part.
    """
    beat = next((b for b in run.beats if b.process is not None and b.pid == tally.first_pid), None)
    lines = beat.events(UP) if beat is not None else []
    return tally.first - lines[0].at if lines and tally.first < math.inf else math.inf


def _caps(count: int, flavour: Flavour) -> tuple[float, float]:
    """The first and second rounds' caps for ``count`` rows (the comparison's first shorter)."""
    first, second = CAPS.get(count, (240.0, 180.0))
    if os.environ.get("BENCH_DATABASE_CAPS"):  # e.g. "240,180"
        first, second = (float(n) for n in os.environ["BENCH_DATABASE_CAPS"].split(","))
    if flavour.key != "zkbeat":
        first = min(first, COMPARISON_CAP)
    return first, second


def _takeovers(bench: Bench) -> int:
    return 1 if bench.quick else int(os.environ.get("BENCH_DATABASE_TAKEOVERS", TAKEOVERS))


def _takeover(bench: Bench, db: ScheduleDatabase, flavour: Flavour, count: int, cap: float) -> tuple[float, float]:
    """Launch one replica on freshly due rows; seconds to its first publish from the launch, and from "up"."""
    db.fill(count, EVERY, datetime.now(timezone.utc) - timedelta(seconds=EVERY + 1))
    run = bench.run(flavour, [], **db.env(), CELERY_BROKER_URL=bench.redis.url)
    with run:
        run.start(1)
        launched = min(beat.started_at for beat in run.beats)
        tally = Tally(run.dir / "records")
        while time.time() < launched + cap and run.alive() and tally.first == math.inf:
            time.sleep(0.1)
            tally.read()
        first, up = tally.first - launched, _since_up(run, tally)
        bench.say(f"  {flavour.key} {count:,} rows: first publish {first:.2f} s after launch, {up:.2f} s after "
                  f"its scheduler was up{_read_line(run)}")  # fmt: skip
    bench.drop(run.root)
    return first, up


def _trial(bench: Bench, db: ScheduleDatabase, flavour: Flavour, count: int, out: dict) -> None:
    first_cap, second_cap = _caps(count, flavour)
    out["load"].values.append(os.getloadavg()[0])
    db.fill(count, EVERY, datetime.now(timezone.utc) - timedelta(seconds=EVERY + 1))
    run = bench.run(flavour, [], **db.env(), CELERY_BROKER_URL=bench.redis.url)
    with run:
        run.start()
        launched = min(beat.started_at for beat in run.beats)
        tally = Tally(run.dir / "records")
        done_first = _wait_rounds(tally, count, 1, launched + first_cap, run)
        firsts = sorted(times[0] for times in tally.times.values())
        out["together"].values.append(tally.first - launched if firsts else math.inf)
        out["up"].values.append(_since_up(run, tally))
        out["round1"].values.append(firsts[-1] - firsts[0] if done_first else math.inf)
        out["all1"].values.append(firsts[-1] - launched if done_first else math.inf)
        span = firsts[-1] - firsts[0] if len(firsts) > 1 else 0.0
        out["rate1"].values.append(span / (len(firsts) - 1) * 1000 if span > 0 else math.nan)
        leader = run.leader() or (run.alive() or [None])[0]
        # Every replica's CPU: with shards several lead (a follower costs almost nothing).
        beats = run.alive()
        cpu_before = {b.pid: probes.cpu_seconds(b.pid) for b in beats}
        published_before = sum(len(times) for times in tally.times.values())
        done_second = done_first and _wait_rounds(tally, count, 2, firsts[-1] + EVERY + second_cap, run)
        published = sum(len(times) for times in tally.times.values()) - published_before
        if done_second and published:
            cpu = sum(probes.cpu_seconds(b.pid) - cpu_before[b.pid] for b in beats if b.alive)
            out["cpu"].values.append(cpu / published * 1e6)  # ms per 1,000 publishes
        out["rss"].values += [probes.rss_mb(b.pid) for b in run.alive()]
        out["load_end"].values.append(os.getloadavg()[0])
        if firsts and flavour.key == "zkbeat":
            # Every tick once over the first two rounds: two minutes from the first publish.
            start = tally.first
            time.sleep(max(0.0, start + WINDOW_ROUNDS * EVERY + 2.0 - time.time()))
            tally.read()
            records = Ledger(bench.client, run.root).load()
            names = [f"row-{i:06d}" for i in range(count)]
            ticks = account(tally.times, records, names, start, start + WINDOW_ROUNDS * EVERY - 0.5, 2, EVERY)
            out["ticks_twice"].values.append(ticks.twice)
            out["ticks_missed"].values.append(ticks.missed)
            out["ticks_lost"].values.append(ticks.lost)
            out["late_slot"].values.extend(ticks.late[1] or [math.inf])
            bench.say(f"  {flavour.key} {count:,} rows: {ticks.summary()}")
        late = [times[1] - times[0] - EVERY for times in tally.times.values() if len(times) >= 2]
        seconds = sorted(times[1] for times in tally.times.values() if len(times) >= 2)
        out["round2"].values.append(seconds[-1] - seconds[0] if done_second else math.inf)
        out["late"].values.extend(late if done_second else [math.inf])
        twice = sum(1 for times in tally.times.values() for a, b in zip(times, times[1:]) if b - a < EVERY / 2)
        out["twice"].values.append(twice)
        bench.say(
            f"  {flavour.key} {count:,} rows, {len(run.beats)} replicas: first publish "
            f"{out['together'].values[-1]:.2f} s after launch"
            f"{_read_line(run)}, first round {out['round1'].values[-1]:.2f} s first to last "
            f"({'done' if done_first else 'capped'}), second round {out['round2'].values[-1]:.2f} s "
            f"({'done' if done_second else 'capped'}), {len(late)} second publishes, {twice} too close"
        )
        if flavour.scheduler == ZKBEAT_DATABASE.scheduler and done_first and leader is not None and leader.alive:
            # A graceful handover with every row in the ledger: the successor reads the
            # tables and loads the ledger before it leads ("became leader ... in X ms").
            t0 = time.time()
            leader.signal(signal.SIGTERM)
            event, _ = takeover_after(run, leader.pid, t0, 120, 0.1)
            if event is not None:
                out["handover"].values.append(event.at - t0)
                stopped = _stopped(leader, t0, event.at)
                out["handover_leaving"].values.append(stopped - t0)
                out["handover_successor"].values.append(event.at - stopped)
                bench.say(f"  {flavour.key} {count:,} rows: SIGTERM of the leader, successor leading after "
                          f"{event.at - t0:.2f} s: the leader stopped leading after {stopped - t0:.2f} s (its "
                          f"pass ended; run times are written after the handover), the successor led "
                          f"{event.at - stopped:.2f} s later"
                          f"{_read_line(run)}; {event.message.split('; ', 1)[-1]}")  # fmt: skip
    bench.drop(run.root)


def run(bench: Bench) -> list[Row]:
    counts = (2_000, 10_000) if bench.quick else (10_000, 100_000)
    if os.environ.get("BENCH_DATABASE_ROWS"):  # e.g. "100000": one size only
        counts = tuple(int(n) for n in os.environ["BENCH_DATABASE_ROWS"].split(","))
    flavours = (ZKBEAT_DATABASE, DJANGO_CELERY_BEAT)
    if os.environ.get("BENCH_DATABASE_FLAVOURS"):  # e.g. "zkbeat": without django-celery-beat alone
        flavours = tuple(f for f in flavours if f.key in os.environ["BENCH_DATABASE_FLAVOURS"].split(","))
    # e.g. "1,2,3": zkbeat's rows again with zkbeat_shards 2 and 3 (rows of their own, zkbeat alone).
    shard_counts = sorted({int(n) for n in os.environ.get("BENCH_DATABASE_SHARDS", "1").split(",") if n.strip()})
    bench.say(f"database: django-celery-beat rows every {EVERY} s on PostgreSQL, {', '.join(map(str, counts))} rows")
    rows: list[Row] = []
    with ScheduleDatabase() as db:
        for count in counts:
            for shards in shard_counts:
                here = flavours if shards == 1 else tuple(_sharded(f, shards) for f in flavours if f.key == "zkbeat")
                rows += _rows(bench, db, count, here, shards)
    return rows


def _sharded(flavour: Flavour, shards: int) -> Flavour:
    """zkbeat.DatabaseScheduler with ``zkbeat_shards = shards`` (bench/djangoapp.py reads BENCH_SHARDS).

    Its leader figures (CPU, RSS, the SIGTERM handover) are those of the
    replica that took over last, which leads some of the shards.
    """
    return replace(flavour, label=f"{flavour.label}, {shards} shards", env={**flavour.env, "BENCH_SHARDS": str(shards)})


def _rows(bench: Bench, db: ScheduleDatabase, count: int, flavours: tuple[Flavour, ...], shards: int) -> list[Row]:
    """The scenario's rows for ``count`` rows (zkbeat with ``shards`` shards)."""
    rows: list[Row] = []
    keys = ("first", "together", "up", "all1", "round1", "rate1", "round2", "late", "cpu", "rss", "twice")
    keys += ("handover", "load", "load_end", "ticks_twice", "ticks_missed", "ticks_lost", "late_slot")
    keys += ("handover_leaving", "handover_successor")
    samples = {}
    for key in keys:
        samples[key] = {}
        for f in flavours:
            first_cap, second_cap = _caps(count, f)
            capped = {"first": first_cap, "together": first_cap, "up": first_cap, "all1": first_cap}
            caps = {**capped, "round1": first_cap, "round2": second_cap, "late": second_cap, "late_slot": 2 * EVERY}
            samples[key][f.key] = Sample(cap=caps.get(key))
    for flavour in flavours:
        for _ in range(_takeovers(bench)):
            first, up = _takeover(bench, db, flavour, count, first_cap)
            samples["first"][flavour.key].values.append(first)
            samples["up"][flavour.key].values.append(up)
        _trial(bench, db, flavour, count, {key: samples[key][flavour.key] for key in keys})
    samples = {key: {k: v for k, v in column.items() if v.values} for key, column in samples.items()}
    scenario = f"database: {count:,} django-celery-beat rows every {EVERY} s, all due at launch"
    scenario += f", zkbeat_shards = {shards}" if shards > 1 else ""
    target = "≤ 5 s" if count <= 10_000 else "≤ 20 s"
    limit = 5.0 if count <= 10_000 else 20.0
    rows += [
        Row(scenario, "machine load average at the rounds trial's launch", "1 min", samples["load"], digits=2),
        Row(scenario, "machine load average after its second round", "1 min", samples["load_end"], digits=2),
        Row(
            scenario,
            f"launch of one replica → its first publish ({_takeovers(bench)} launches)",
            "s",
            samples["first"],
            target=target,
            check=lambda row, limit=limit: row.values["zkbeat"].median <= limit,
            digits=2,
        ),
        Row(
            scenario,
            "launch of the rounds trial's replicas (zkbeat: 3 together on the 2 cores) → first publish",
            "s",
            samples["together"],
            digits=2,
        ),
        Row(
            scenario,
            "the publishing process's beat service starting (its log line) → its first publish",
            "s",
            samples["up"],
            digits=2,
        ),
        Row(scenario, "launch → every row published once", "s", samples["all1"], digits=1),
        Row(scenario, "first round: first → last publish", "s", samples["round1"], digits=1),
        Row(
            scenario,
            "first round: ms per row published (first to last, or to the cap)",
            "ms",
            samples["rate1"],
            digits=2,
        ),
        Row(scenario, "second round (a minute later): first → last publish", "s", samples["round2"], digits=1),
        Row(scenario, "second publish − first − 60 s, p50 / p99", "s", samples["late"], digits=2),
        Row(
            scenario,
            "second round: lateness, publish − the slot its claim recorded (ledger), p50 / p99",
            "s",
            samples["late_slot"],
            digits=2,
        ),
        Row(
            scenario,
            "CPU per 1,000 publishes, second round (every replica's CPU ÷ the publishes)",
            "ms",
            samples["cpu"],
            digits=0,
        ),
        Row(
            scenario,
            "RSS per replica at the end of the rounds, median / p99 of the replicas",
            "MB",
            samples["rss"],
            digits=0,
        ),
        Row(
            scenario,
            "after the rounds: SIGTERM of the leader → successor leading (tables read, ledger loaded)",
            "s",
            samples["handover"],
            digits=2,
        ),
        Row(
            scenario,
            'of which SIGTERM → the leader\'s "stopped leading" (its pass ends; run times written after it)',
            "s",
            samples["handover_leaving"],
            digits=2,
        ),
        Row(
            scenario,
            'of which the leader\'s "stopped leading" → successor leading (tables read, ledger loaded)',
            "s",
            samples["handover_successor"],
            digits=2,
        ),
        Row(
            scenario,
            f"the first two rounds ({count * WINDOW_ROUNDS:,} ticks in 120 s from the first publish): missed",
            "ticks",
            samples["ticks_missed"],
            target="0",
            check=lambda row: row.values["zkbeat"].median == 0,
            digits=0,
        ),
        Row(
            scenario,
            "the first two rounds: published twice (< 30 s apart, or one slot claimed twice)",
            "ticks",
            samples["ticks_twice"],
            target="0",
            check=lambda row: row.values["zkbeat"].median == 0,
            digits=0,
        ),
        Row(scenario, "the first two rounds: claimed, not published", "ticks", samples["ticks_lost"], digits=0),
        Row(
            scenario,
            "publishes less than 30 s apart (twice)",
            "ticks",
            samples["twice"],
            target="0",
            check=lambda row: row.values["zkbeat"].median == 0,
            digits=0,
        ),
    ]
    return rows

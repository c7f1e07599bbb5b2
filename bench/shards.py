"""Sharded leadership: 3 replicas, N entries every 60 s, with zkbeat_shards = 1, 2 and 3.

Each configuration is a fresh cluster of three ``celery beat`` replicas
launched together (``bench.app``'s ``beat_schedule`` through
``bench/shardsapp.py``, which sets ``zkbeat_shards``). The N entries all
come due at one moment some seconds after the launch, time enough for the
replicas to start and for the leadership to settle: every shard led and no
replica above its share, ceil(N / 3), read from ZooKeeper as ``zkbeat
status`` shows it. One more entry in each shard, every second, wakes the
leaders' loops before that moment, as any real schedule's small entries do:
zkbeat checks the fair share once a loop pass, and a loop with nothing due
sleeps until the next due entry.

What the rows say, per configuration, over a window of a few rounds (a
minute each) from that moment, in which nothing reads the ledger:

* launch → first publish (the first ``before_task_publish`` record), and
  launch → settled (the last "became leader" line before it was seen so);
* each round's first → last publish (round k: each entry's k-th publish in
  the window), and its ratio to one shard's;
* lateness: each publish minus the slot zkbeat claimed it for (the slot of
  the entry's recent run in the ledger that the publish went out for);
* CPU per 1,000 publishes: every replica's CPU (/proc, all threads) over
  the window, summed, divided by the entries' publishes: a sharded schedule
  has several leaders, and a follower costs almost nothing;
* ZooKeeper znode writes per publish (the entries' ledger versions, as
  bench/steady.py counts them) and each replica's RSS at the end;
* every tick once (bench/accounting.py): the window's ticks published
  twice, missed (not published within the window) and claimed but not
  published;
* the machine's load average at the launch and at the window's end.

Before the trials, bench/cores.py times two CPU-bound Python processes
side by side against one alone, to read the ratios by: what two leaders
on this machine's two cores can get of them (0.82 here on 2026-12-03; a
core shared with another tenant shows as less). It is no floor for the
ratio: with 2 shards a publish cost less CPU than with one (all
replicas' CPU, 0.17 against 0.20 ms a publish that day).

The entry count is ``BENCH_SHARDS_ENTRIES`` (``10000``, ``100000`` or both,
comma separated; 10,000 by default): 10,000 entries for two rounds,
100,000 for three. The window ends once every entry was published in each
round, or at the next round's due time; a round not complete by then is
kept as ``>window``, with its pace (ms a publish) to compare.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field

from bench import cores, probes
from bench.accounting import Accounting, Ledger, account
from bench.cluster import Flavour, Run
from bench.context import Bench
from bench.database import Tally, _wait_rounds
from bench.stats import Row, Sample
from tests.support.helpers import wait_for
from zkbeat.coordination.shards import shard_of
from zkbeat.ops.status import read_shards

SHARDS = (1, 2, 3)
#: The target of the sharding issue: 2 shards publish a burst in at most this share of one shard's time.
TARGET_RATIO = 0.6
#: The scale-out issue's target for 100,000 entries every 60 s: every tick once, lateness p99 at most this.
LATE_TARGET_SECONDS = 15.0
LATE_TARGET = f"p99 ≤ {LATE_TARGET_SECONDS:g} s"
#: Per entry count: seconds from the launch to the first round (start-up and settling fit in it),
#: and the rounds of the window (a minute each).
PLANS = {10_000: (35.0, 2), 100_000: (90.0, 3)}


def flavour(shards: int) -> Flavour:
    return Flavour(
        "zkbeat",
        f"zkbeat, {shards} shard{'s' if shards > 1 else ''}",
        "zkbeat.Scheduler",
        3,
        {"BENCH_SHARDS": str(shards)},
        leader_line="zkbeat: became leader",
        app="bench.shardsapp",
    )


@dataclass
class Burst:
    """Round k of all N entries, from the window's accounting; span inf where it was not complete."""

    span: float = math.inf
    #: Milliseconds a publish, first to last (or to the window's end): comparable when a round is incomplete.
    pace: float = math.nan
    #: Entries of the round published in the window (all of them when complete).
    published: int = 0
    late: list[float] = field(default_factory=list)
    publishers: str = ""


@dataclass
class Result:
    """One configuration's trial."""

    first: float = math.inf
    #: Seconds from the launch until the leadership stood settled (_settled); inf: not before the burst.
    settled: float = math.inf
    bursts: list[Burst] = field(default_factory=list)
    rss: list[float] = field(default_factory=list)
    #: Every replica's CPU over the window ÷ the entries' publishes in it, ms per 1,000.
    cpu_per_1000: float = math.nan
    writes_per_publish: float = math.nan
    ticks: Accounting | None = None
    #: The machine's 1-minute load average at the launch and at the window's end.
    load: tuple[float, float] = (math.nan, math.nan)


def _records(bench: Bench, run: Run) -> dict:
    """Every entry's ledger record."""
    return Ledger(bench.client, run.root).load()


def _row_writes(records: dict) -> int:
    """Writes the N entries' ledger znodes took so far (a create counts 1, each set 1 more; bench/steady.py)."""
    return sum(record.version + 1 for name, record in records.items() if name.startswith("row-"))


def _settled(bench: Bench, run: Run, shards: int) -> bool:
    """Every shard has an announced leader and no replica leads more than its share, ceil(N / replicas).

    One shard is settled as soon as it is led. Read from ZooKeeper
    (zkbeat.ops.status.read_shards), as ``zkbeat status`` shows it.
    """
    if shards == 1:
        return run.leader() is not None
    lines = read_shards(bench.client, run.root, shards)
    if any(line.leader is None for line in lines):
        return False
    led = Counter(line.leader.identity for line in lines)
    return len(run.alive()) == 3 and max(led.values()) <= math.ceil(shards / 3)


def _window(bench: Bench, run: Run, result: Result, count: int, due: float, rounds: int, every: float) -> None:
    """``rounds`` minutes of the N entries from ``due``: every replica's CPU, the writes, then the accounting.

    The window ends when every entry was published ``rounds`` times, or
    ``rounds`` × ``every`` after the first due moment (the next round's
    ticks come due from then on). Nothing reads the ledger during it.
    """
    tally = Tally(run.dir / "records")
    beats = run.alive()
    writes_before = _row_writes(_records(bench, run))
    time.sleep(max(0.0, due - 1.0 - time.time()))
    cpu_before = {b.pid: probes.cpu_seconds(b.pid) for b in beats}
    end = due + rounds * every - 0.5
    _wait_rounds(tally, count, rounds, end, run)
    stopped = min(time.time(), end)
    cpu = sum(probes.cpu_seconds(b.pid) - cpu_before[b.pid] for b in beats if b.alive)
    result.load = (result.load[0], os.getloadavg()[0])
    time.sleep(2.0)  # a batch claimed just before the end: its publishes are recorded
    records = _records(bench, run)
    # Read after the ledger: every write it holds (a claim, ms before its publish) has its publish recorded.
    tally.read()
    names = [f"row-{i:05d}" for i in range(count)]
    ticks = result.ticks = account(tally.times, records, names, due, stopped, rounds, every)
    published = sum(1 for times in tally.times.values() for at in times if due - 1.0 <= at <= stopped)
    if published:
        result.cpu_per_1000 = cpu / published * 1e6
        since = sum(1 for times in tally.times.values() for at in times if at >= due - 1.0)
        result.writes_per_publish = (_row_writes(records) - writes_before) / since
    windowed = {name: sorted(t for t in found if due - 1.0 <= t <= stopped) for name, found in tally.times.items()}
    order: dict[str, list[tuple[int, float]]] = defaultdict(list)
    for publish in run.publishes():  # in time order: an entry's k-th publisher published its k-th round
        if publish.entry.startswith("row-") and due - 1.0 <= publish.at <= stopped:
            order[publish.entry].append((publish.pid, publish.at))
    for k in range(rounds):
        burst = Burst(span=ticks.spans[k], published=ticks.counts[k], late=ticks.late[k])
        at = [found[k] for found in windowed.values() if len(found) > k]
        if len(at) > 1:
            burst.pace = (max(at) - min(at)) / (len(at) - 1) * 1000
        burst.publishers = _by_publisher([found[k] for found in order.values() if len(found) > k], due + k * every)
        result.bursts.append(burst)
    result.rss = [probes.rss_mb(b.pid) for b in run.alive()]


def _by_publisher(publishes: list[tuple[int, float]], due: float) -> str:
    """Each replica's publishes of a round, with its own first → last (seconds after the round's due moment).

    Where one shard's leader starts late, or runs slower than the other,
    the round's span says only that it was long; this says whose it was.
    """
    spans: dict[int, list[float]] = defaultdict(list)
    for pid, at in publishes:
        spans[pid].append(at - due)
    ranked = sorted(spans.values(), key=len, reverse=True)
    return " / ".join(f"{len(times):,} ({min(times):.2f}–{max(times):.2f} s)" for times in ranked)


def _pulses(root: str, shards: int) -> list[str]:
    """One entry name per shard under ``root`` (zkbeat.coordination.shards.shard_of)."""
    found: dict[int, str] = {}
    for i in itertools.count():
        found.setdefault(shard_of(root, f"pulse-{i}", shards), f"pulse-{i}")
        if len(found) == shards:
            return sorted(found.values())
    raise AssertionError("unreachable")


def _cluster(bench: Bench, shards: int, count: int, every: float, due: float, pulses: int | None = None) -> Run:
    """Three replicas with ``zkbeat_shards = shards``, not started: ``count`` entries every ``every`` s from ``due``.

    Beside them, one small entry every second in each of ``pulses`` shards
    (``shards`` unless given), as a real schedule has small entries: they
    wake the leaders' loops, where the fair share is checked, before the burst.
    """
    run = bench.run(flavour(shards), [])
    entries = [{"name": "row", "count": count, "every": every, "first_due": due}]
    entries += [{"name": name, "every": 1} for name in _pulses(run.root, pulses or shards)]
    run.env["BENCH_ENTRIES"] = json.dumps(entries)
    return run


def _launch(run: Run, result: Result, lead: float) -> float:
    """Start the replicas and wait up to ``lead`` s for the first publish (``result.first``); the launch moment."""
    run.start()
    launched = min(beat.started_at for beat in run.beats)
    wait_for(run.publishes, lead, 0.1, raise_on_timeout=False)
    published = run.publishes()
    result.first = published[0].at - launched if published else math.inf
    return launched


def _trial(bench: Bench, count: int, shards: int, every: float, lead: float, rounds: int) -> Result:
    result = Result(load=(os.getloadavg()[0], math.nan))
    due = time.time() + lead
    run = _cluster(bench, shards, count, every, due)
    with run:
        launched = _launch(run, result, lead)
        if wait_for(lambda: _settled(bench, run, shards), due - 1.5 - time.time(), 0.1, raise_on_timeout=False):
            # The moment it settled: the last takeover logged before it was seen so.
            took = [event.at for beat in run.beats for event in beat.events("zkbeat: became leader")]
            result.settled = max(took) - launched
        else:
            bench.note(f"shards: {shards} shard(s), {count:,} entries: leadership not settled at the burst")
        _window(bench, run, result, count, due, rounds, every)
    bench.drop(run.root)
    return result


def run(bench: Bench) -> list[Row]:
    counts = (1_000,) if bench.quick else (10_000,)
    if os.environ.get("BENCH_SHARDS_ENTRIES"):  # e.g. "100000" or "10000,100000"
        counts = tuple(int(n) for n in os.environ["BENCH_SHARDS_ENTRIES"].split(","))
    every = 20.0 if bench.quick else 60.0
    bench.say(f"shards: 3 replicas, {', '.join(f'{n:,}' for n in counts)} entries every {every:g} s, "
              f"zkbeat_shards = {', '.join(map(str, SHARDS))}")  # fmt: skip
    speed = cores.side_by_side_speed()
    bench.say(f"  this machine: two CPU-bound processes side by side, each at {speed:.2f} of one alone's speed")
    rows: list[Row] = [
        Row(
            "shards: this machine's two cores",
            "two CPU-bound Python processes side by side, each at this fraction of one alone's speed (bench/cores.py)",
            "×",
            {"zkbeat": Sample([speed])},
            digits=2,
        ),
    ]
    for count in counts:
        lead, rounds = (15.0, 2) if bench.quick else PLANS.get(count, PLANS[10_000])
        results = {}
        for shards in SHARDS:
            result = results[shards] = _trial(bench, count, shards, every, lead, rounds)
            bench.say(
                f"  {shards} shard(s), {count:,} entries: load {result.load[0]:.2f} at the launch, "
                f"{result.load[1]:.2f} at the end; first publish {result.first:.2f} s after launch, "
                f"settled {result.settled:.2f} s after launch; "
                + "; ".join(
                    f"round {k}: {b.span:.2f} s first to last, {b.published:,} published, {b.pace:.3f} ms a "
                    f"publish (by {b.publishers or '?'}), late p50 / p99 "
                    f"{Sample(b.late).median:.3f} / {Sample(b.late).p99:.3f} s"
                    for k, b in enumerate(result.bursts, 1)
                )
                + f"; CPU {result.cpu_per_1000:.0f} ms per 1,000, {result.writes_per_publish:.3f} writes a publish"
                + f"; {result.ticks.summary() if result.ticks else 'no window'}"
                + f"; RSS {', '.join(f'{mb:.0f}' for mb in result.rss)} MB"
            )
        for shards, result in results.items():
            rows += _rows(count, every, lead, shards, result, results[1])
    return rows


def _rows(count: int, every: float, lead: float, shards: int, result: Result, one: Result) -> list[Row]:
    scenario = f"shards: 3 replicas, {count:,} entries every {every:g} s, zkbeat_shards = {shards}"
    rounds = len(result.bursts)
    window = rounds * every

    def single(value: float, cap: float | None = None) -> dict[str, Sample]:
        return {"zkbeat": Sample([value], cap=cap)}

    rows = [
        Row(scenario, "machine load average at the launch", "1 min", single(result.load[0]), digits=2),
        Row(scenario, "machine load average at the window's end", "1 min", single(result.load[1]), digits=2),
        Row(scenario, "launch of the 3 replicas → first publish", "s", single(result.first, lead), digits=2),
        Row(
            scenario,
            "launch → leadership settled (every shard led, none above ceil(N/3))",
            "s",
            single(result.settled),
            digits=2,
        ),
    ]
    for k, burst in enumerate(result.bursts, 1):
        when = f"round {k}" + (f" ({lead:g} s after launch, all due at once)" if k == 1 else " (a minute later)")
        rows += [
            Row(
                scenario,
                f"{when}: first → last publish (publishes by replica: {burst.publishers or '?'})",
                "s",
                single(burst.span, window),
                digits=2,
            ),
            Row(
                scenario,
                f"round {k}: ms a publish, first → last (in the window: {burst.published:,} published)",
                "ms",
                single(burst.pace),
                digits=3,
            ),
            Row(
                scenario,
                f"round {k}: lateness, publish − its slot, p50 / p99",
                "s",
                {"zkbeat": Sample(burst.late or [math.inf], cap=window)},
                target=LATE_TARGET if count >= 100_000 and k > 1 else "",
                check=_late_check if count >= 100_000 and k > 1 else None,
                digits=3,
            ),
        ]
        if shards > 1 and len(one.bursts) >= k:
            base = one.bursts[k - 1]
            if math.inf in (base.span, burst.span):  # incomplete: compare the pace
                ratio = burst.pace / base.pace
            else:
                ratio = burst.span / base.span if base.span else math.nan
            target = shards == 2 and count <= 10_000
            rows.append(
                Row(
                    scenario,
                    f"round {k}: first → last ÷ 1 shard's (ms a publish ÷ 1 shard's where a round was incomplete)",
                    "×",
                    single(ratio),
                    target=f"≤ {TARGET_RATIO}×" if target else "",
                    check=(lambda row: row.values["zkbeat"].median <= TARGET_RATIO) if target else None,
                    digits=2,
                )
            )
    ticks = result.ticks
    rows += [
        Row(
            scenario,
            "CPU per 1,000 publishes (every replica's CPU over the window ÷ the entries' publishes)",
            "ms",
            single(result.cpu_per_1000),
            digits=0,
        ),
        Row(scenario, "ZooKeeper znode writes per publish", "per publish", single(result.writes_per_publish), digits=3),
        Row(scenario, "RSS per replica, smallest", "MB", single(min(result.rss, default=math.nan)), digits=0),
        Row(scenario, "RSS per replica, largest", "MB", single(max(result.rss, default=math.nan)), digits=0),
    ]
    if ticks is not None:
        what = f"{ticks.ticks:,} ticks due in {rounds} rounds"
        rows += [
            Row(scenario, f"{what}: published", "ticks", single(ticks.published), digits=0),
            Row(
                scenario,
                f"{what}: published twice",
                "ticks",
                single(ticks.twice),
                target="0",
                check=lambda row: row.values["zkbeat"].median == 0,
                digits=0,
            ),
            Row(
                scenario,
                f"{what}: missed (not published in the window)",
                "ticks",
                single(ticks.missed),
                target="0",
                check=lambda row: row.values["zkbeat"].median == 0,
                digits=0,
            ),
            Row(scenario, f"{what}: claimed, not published", "ticks", single(ticks.lost), digits=0),
            Row(scenario, f"{what}: runs the leader recorded as catch-up", "ticks", single(ticks.catch_up), digits=0),
        ]
    return rows


def _late_check(row: Row) -> bool:
    return row.values["zkbeat"].p99 <= LATE_TARGET_SECONDS

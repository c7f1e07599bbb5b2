"""The demo's closing table, from what the replicas published and what the worker ran."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from demo.cluster import Event


@dataclass
class Handover:
    cause: str  # "kill -9" or "SIGTERM"
    old: str
    new: str
    seconds: float  # signal sent -> "became leader" in the heir's log


@dataclass
class Row:
    entry: str
    every: str
    ticks: int
    publishes: int
    most_per_tick: int
    executions: int
    twice: int
    missed: int | None


def rows(publishes: list[Event], runs: dict[str, Counter], intervals: dict[str, float | None]) -> list[Row]:
    """One row per entry: ``runs`` counts executions per (entry -> slot), ``intervals`` seconds or None (one-off)."""
    table = []
    for entry, every in intervals.items():
        slots = Counter(p.slot.isoformat() for p in publishes if p.entry == entry)
        executed = runs.get(entry, Counter())
        twice = len([s for s in set(slots) | set(executed) if slots[s] > 1 or executed[s] > 1])
        table.append(
            Row(
                entry=entry,
                every=f"{every:g} s" if every else "once",
                ticks=len(slots),
                publishes=sum(slots.values()),
                most_per_tick=max(slots.values(), default=0),
                executions=sum(executed.values()),
                twice=twice,
                missed=missed_ticks(sorted(p.slot for p in publishes if p.entry == entry), every) if every else None,
            )
        )
    return table


def missed_ticks(slots: list, every: float) -> int:
    """Ticks that never ran: a gap of k intervals between two published slots hides k - 1 of them.

    Celery counts an interval from the last run, and after an outage it runs
    a missed tick once, late, not once per missed interval; what a failover
    costs shows up here.
    """
    return sum(max(0, round((b - a).total_seconds() / every) - 1) for a, b in zip(slots, slots[1:]))


def format_table(table: list[Row], handovers: list[Handover], leaders: list[tuple[str, int, int]]) -> str:
    head = ("entry", "every", "ticks", "publishes", "most per tick", "ran", "twice", "missed")
    body = [
        (r.entry, r.every, str(r.ticks), str(r.publishes), str(r.most_per_tick), str(r.executions), str(r.twice),
         "-" if r.missed is None else str(r.missed))
        for r in table
    ]  # fmt: skip
    widths = [max(len(line[i]) for line in [head, *body]) for i in range(len(head))]
    lines = ["  ".join(cell.ljust(w) if i == 0 else cell.rjust(w) for i, (cell, w) in enumerate(zip(line, widths)))
             for line in [head, *body]]  # fmt: skip
    lines.insert(1, "  ".join("-" * w for w in widths))
    lines.append("")
    lines.append("leaders: " + ", ".join(f"{name} (epoch {epoch}, {n} publishes)" for name, epoch, n in leaders))
    for h in handovers:
        lines.append(f"handover after {h.cause} of {h.old}: {h.new} led {duration(h.seconds)} later")
    return "\n".join(lines)


def duration(seconds: float) -> str:
    return f"{seconds * 1000:.0f} ms" if seconds < 1 else f"{seconds:.2f} s"

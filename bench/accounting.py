"""Every tick once? A window of rounds, counted from the publish records and the ledger.

Over a window of ``rounds`` minutes of an every-``every``-seconds schedule
each entry should be published ``rounds`` times, each publish being one
tick zkbeat claimed in the ledger. Counted after the window, from what the
processes wrote themselves (their ``before_task_publish`` records) and what
the leaders recorded (each entry's recent runs in the ledger: slot, claim
time, kind):

* **published twice**: two publishes of one entry less than ``every / 2``
  apart (an interval entry's next run is counted from its last, so no two
  of its ticks are that close), plus two claims of one slot;
* **missed**: ticks of the window not published by its end, ``rounds``
  minus the entry's publishes in the window, summed over the entries (a
  tick more than a minute late is a minute's run gone: an interval entry
  counts its next run from the late one);
* **claimed, not published**: a recent run in the ledger with no publish
  after it and before the entry's next claim (a kill -9 between the two
  would leave one); a publish no claim accounts for counts as twice;
* **catch-up**: runs the leader itself recorded as published after the
  entry's next slot had come (zkbeat.history);
* **lateness** of round k: each entry's k-th publish in the window minus
  the slot its claim recorded.

Every time is a process's own timestamp; the ledger is read once, after
the window, so that reading it costs the leaders nothing while they publish.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from zkbeat.ledger.store import Ledger, LedgerRecord

#: Seconds a claim at the window's end is given for its publish to be recorded before it counts as not published.
MATCH = 10.0

__all__ = ["MATCH", "Accounting", "Ledger", "account"]


@dataclass
class Accounting:
    """One window's count of ticks."""

    entries: int
    rounds: int
    #: Seconds the window lasted (first due → its end).
    seconds: float
    #: The window's ticks published (at most ``rounds`` per entry: a next round's early tick is not counted).
    published: int = 0
    twice: int = 0
    missed: int = 0
    lost: int = 0
    catch_up: int = 0
    #: Round k's lateness (its publish − the slot its claim recorded), seconds, one list per round.
    late: list[list[float]] = field(default_factory=list)
    #: Round k's first → last publish (inf: some entry had no k-th publish in the window).
    spans: list[float] = field(default_factory=list)
    #: Round k's publishes.
    counts: list[int] = field(default_factory=list)

    @property
    def ticks(self) -> int:
        return self.entries * self.rounds

    @property
    def once(self) -> bool:
        return self.twice == 0 and self.missed == 0 and self.lost == 0

    def summary(self) -> str:
        return (
            f"{self.ticks:,} ticks due in {self.seconds:.0f} s ({self.rounds} rounds): {self.published:,} published, "
            f"{self.twice:,} twice, {self.missed:,} missed, {self.lost:,} claimed and not published, "
            f"{self.catch_up:,} catch-up"
        )


def account(
    times: dict[str, list[float]],
    records: dict[str, LedgerRecord],
    names: list[str],
    start: float,
    end: float,
    rounds: int,
    every: float,
) -> Accounting:
    """``names``' ticks from ``start`` (the first due moment) to ``end``, from publish ``times`` and the ledger.

    Each claim (a recent run) is matched with the entry's first publish at
    or after it and before its next claim: a claim of the window with none
    is claimed and not published (once MATCH seconds have passed for it to
    go out), a publish of the window matched with no claim is published
    twice (nothing claimed it).
    """
    result = Accounting(len(names), rounds, end - start)
    late: list[list[float]] = [[] for _ in range(rounds)]
    by_round: list[list[float]] = [[] for _ in range(rounds)]
    for name in names:
        every_publish = sorted(times.get(name, ()))
        published = [t for t in every_publish if start - 1.0 <= t <= end]
        result.published += min(len(published), rounds)  # a next round's early tick is not the window's
        result.missed += max(0, rounds - len(published))
        close = sum(1 for a, b in zip(published, published[1:]) if b - a < every / 2)
        record = records.get(name)
        runs = sorted(record.state.recent, key=lambda run: run.slot_ms + run.late_ms) if record and record.state else []
        slots = [run.slot_ms for run in runs]
        result.twice += len(slots) - len(set(slots))
        result.catch_up += sum(1 for run in runs if run.kind == "catch-up" and start - 1.0 <= run.slot_ms / 1000 <= end)
        claims = [((run.slot_ms + run.late_ms) / 1000, run.slot_ms / 1000) for run in runs]
        slot_of: dict[float, float] = {}
        j = 0
        for i, (at, slot) in enumerate(claims):
            before = claims[i + 1][0] - 0.5 if i + 1 < len(claims) else math.inf
            while j < len(every_publish) and every_publish[j] < at - 0.5:
                j += 1
            if j < len(every_publish) and every_publish[j] < before:
                slot_of[every_publish[j]] = slot
                j += 1
            elif start - 1.0 <= at and (before < math.inf or at < end - MATCH):
                result.lost += 1  # claimed, and no publish followed it before the next claim
        # A second publish of one tick is both close to the first and claimed by nothing: count it once.
        result.twice += max(close, sum(1 for t in published if t not in slot_of))
        for k, at in enumerate(published[:rounds]):
            by_round[k].append(at)
            if at in slot_of:
                late[k].append(at - slot_of[at])
    result.late = late
    result.counts = [len(found) for found in by_round]
    result.spans = [max(found) - min(found) if len(found) == len(names) and found else math.inf for found in by_round]
    return result

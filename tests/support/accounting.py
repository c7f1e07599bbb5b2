"""The accounting every fault scenario ends with: twice, lost, skipped, who led.

It works from what the replicas actually published (recorded from
``after_task_publish``) plus the skips their logs report, and needs no clock
of the test's own. The rule it checks is Celery's interval rule as zkbeat
keeps it: an entry's next slot is the moment its previous tick was claimed
plus the interval. So if tick ``a`` was sent at ``a.at`` (its publisher's
clock, the same clock that wrote the claim), the entry's next published slot
can be no later than ``a.at + interval``. A later one means a tick was
claimed in between and never sent: skipped (then a log line says so) or lost.

A run-now (``zkbeat trigger``, header ``zkbeat-manual``) is not a tick: it is
left out of the schedule's accounting and counted on its own, once per request.

A tick that came due during an outage is published once, late, when a leader
can publish again (Celery's catch-up-once rule): that shows as lateness
(``at - slot``), reported as "late", not as a loss.
"""

from __future__ import annotations

import re
import signal
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from kazoo.client import KazooClient

from tests.support.faults import ledger_slots
from tests.support.processes import Publish, too_close

__all__ = ["Report", "Lease", "account", "accounting", "assert_clean", "logged_skips", "logged_unanswered"]

#: What a skip looks like in a replica's log (zkbeat.scheduler._run_due).
SKIP_LINE = re.compile(r"zkbeat: skipping (\S+): its tick at (\S+) is")
#: A publish that got no answer (zkbeat.leading.broker.may_have_arrived): not sent again, at most once.
UNANSWERED_LINE = re.compile(r"zkbeat: the publish of (\S+) \(slot ([^,]+), task id [^)]*\) got no answer")
#: Slack for the publish-after-claim order check, in seconds.
TOLERANCE = 0.25


@dataclass
class Lease:
    """One leader's stretch, as its publishes show it."""

    epoch: int
    identity: str
    pid: int
    first_at: float
    last_at: float
    count: int


@dataclass
class Lost:
    entry: str
    after: datetime
    before: datetime
    ticks: int
    #: Set when the tick was in flight in a leader that was killed (kill -9).
    killed_in_flight: bool = False
    #: Set when the leader logged the tick as sent without an answer from the broker.
    unanswered: bool = False

    @property
    def explained(self) -> bool:
        return self.killed_in_flight or self.unanswered


@dataclass
class Report:
    published: int
    entries: int
    duplicates: list[tuple[str, datetime]]
    repeats: list[tuple[str, float]]
    late: list[tuple[str, datetime, float]]
    skipped: list[tuple[str, datetime]]
    lost: list[Lost]
    unpublished_claims: list[tuple[str, datetime]]
    leaders: list[Lease] = field(default_factory=list)
    #: Run-now publishes, and the requests among them published more than once.
    manual: int = 0
    manual_twice: list[str] = field(default_factory=list)

    @property
    def twice(self) -> int:
        return len(self.duplicates) + len(self.repeats) + len(self.manual_twice)

    @property
    def lost_unexplained(self) -> list[Lost]:
        return [gap for gap in self.lost if not gap.explained]

    def ok(self) -> bool:
        """Nothing twice, nothing lost but what a kill -9 mid-send explains."""
        return self.twice == 0 and not self.lost_unexplained and not self.unpublished_claims

    def table(self) -> str:
        lines = [
            "| measure | count |",
            "|---|---|",
            f"| ticks published | {self.published} ({self.entries} entries) |",
            f"| ticks published twice | {self.twice} |",
            f"| run-now requests published | {self.manual} |",
            f"| ticks lost (unexplained) | {sum(g.ticks for g in self.lost_unexplained)} |",
            f"| ticks lost in flight to kill -9 (at-most-once, documented) | "
            f"{sum(g.ticks for g in self.lost if g.killed_in_flight)} |",
            f"| ticks sent without an answer from the broker (logged, at-most-once, documented) | "
            f"{sum(g.ticks for g in self.lost if g.unanswered and not g.killed_in_flight)} |",
            f"| ticks skipped past misfire grace (each logged) | {len(self.skipped)} |",
            f"| ticks caught up late, once | {len(self.late)} (max {self.max_lateness:.1f}s late) |",
            f"| claimed in the ledger but never published | {len(self.unpublished_claims)} |",
            f"| leaders | {len(self.leaders)} |",
        ]
        return "\n".join(lines)

    @property
    def max_lateness(self) -> float:
        return max((lateness for _, _, lateness in self.late), default=0.0)

    def leader_table(self, t0: float | None = None) -> str:
        t0 = self.leaders[0].first_at if t0 is None and self.leaders else (t0 or 0.0)
        lines = ["| epoch | identity | pid | from (s) | to (s) | ticks |", "|---|---|---|---|---|---|"]
        for lease in self.leaders:
            lines.append(
                f"| {lease.epoch} | {lease.identity} | {lease.pid} | {lease.first_at - t0:.1f} "
                f"| {lease.last_at - t0:.1f} | {lease.count} |"
            )
        return "\n".join(lines)

    def details(self, limit: int = 20) -> str:
        parts = []
        if self.duplicates:
            parts.append(f"twice: {self.duplicates[:limit]}")
        if self.repeats:
            parts.append(f"repeated under another slot: {self.repeats[:limit]}")
        if self.manual_twice:
            parts.append(f"run-now requests published twice: {self.manual_twice[:limit]}")
        if self.lost:
            parts.append(f"lost: {self.lost[:limit]}")
        if self.unpublished_claims:
            parts.append(f"claimed, never published: {self.unpublished_claims[:limit]}")
        return "\n".join(parts)


def logged_skips(logs: list[str]) -> list[tuple[str, datetime]]:
    """Every (entry, slot) some replica logged as skipped past its grace time."""
    return _logged(SKIP_LINE, logs)


def logged_unanswered(logs: list[str]) -> list[tuple[str, datetime]]:
    """Every (entry, slot) some replica logged as sent without an answer (it may not have arrived)."""
    return _logged(UNANSWERED_LINE, logs)


def _logged(line: re.Pattern[str], logs: list[str]) -> list[tuple[str, datetime]]:
    return [(name, datetime.fromisoformat(slot)) for text in logs for name, slot in line.findall(text)]


def account(
    publishes: list[Publish],
    intervals: dict[str, float],
    *,
    skips: list[tuple[str, datetime]] = (),
    ledger_slots: dict[str, datetime] | None = None,
    kills: list[tuple[int, float]] = (),
    unanswered: list[tuple[str, datetime]] = (),
) -> Report:
    """Count what ``publishes`` did against the schedule ``intervals``.

    ``skips`` are the logged skips, ``ledger_slots`` each entry's last claimed
    slot as the ledger holds it at the end (a claim there that was never
    published nor skipped is a lost tick the gaps cannot show), and ``kills``
    the (pid, time) of each kill -9, so a tick lost in flight in a killed
    leader is told apart from an unexplained loss.
    """
    requests = Counter(p.manual for p in publishes if p.manual is not None)
    publishes = [p for p in publishes if p.manual is None]
    counts = Counter((p.entry, p.slot) for p in publishes)
    duplicates = sorted(key for key, n in counts.items() if n > 1)
    repeats = []
    for name, interval in intervals.items():
        repeats += too_close([p for p in publishes if p.entry == name], interval)

    by_entry: dict[str, list[Publish]] = defaultdict(list)
    for p in publishes:
        by_entry[p.entry].append(p)
    skip_set = set(skips)
    unanswered_set = set(unanswered)
    late, lost = [], []
    kill_times = dict(kills)
    for name, rows in by_entry.items():
        interval = intervals.get(name, 1.0)
        unique = sorted({p.slot: p for p in rows}.values(), key=lambda p: p.slot)
        for p in unique:
            lateness = p.at - p.slot.timestamp()
            if lateness > interval:
                late.append((name, p.slot, lateness))
        for a, b in zip(unique, unique[1:]):
            limit = a.at + interval + TOLERANCE
            if b.slot.timestamp() <= limit:
                continue
            between = [(n, s) for n, s in skip_set if n == name and a.slot < s < b.slot]
            if between:
                continue
            missing = max(1, round((b.slot.timestamp() - limit) / interval))
            killed_at = kill_times.get(a.pid)
            in_flight = killed_at is not None and a.at <= killed_at <= a.at + interval + 2
            no_answer = sum(1 for n, s in unanswered_set if n == name and a.slot < s < b.slot)
            lost.append(Lost(name, a.slot, b.slot, missing, in_flight, no_answer >= missing))

    unpublished = []
    for name, slot in (ledger_slots or {}).items():
        published = [p.slot for p in by_entry.get(name, [])]
        if slot in published or (name, slot) in skip_set or (name, slot) in unanswered_set:
            continue
        if published and slot < max(published):
            continue  # an older slot: the ledger moved on (not expected, but not a loss)
        unpublished.append((name, slot))

    return Report(
        published=len(publishes),
        entries=len(by_entry),
        duplicates=duplicates,
        repeats=repeats,
        late=late,
        skipped=sorted(skip_set),
        lost=lost,
        unpublished_claims=unpublished,
        leaders=leases(publishes),
        manual=sum(requests.values()),
        manual_twice=sorted(request for request, n in requests.items() if n > 1),
    )


def leases(publishes: list[Publish]) -> list[Lease]:
    """Who led when: one row per epoch, in the order the epochs first published."""
    rows: dict[int, Lease] = {}
    for p in sorted(publishes, key=lambda p: p.epoch):
        lease = rows.get(p.epoch)
        if lease is None:
            rows[p.epoch] = Lease(p.epoch, p.identity, p.pid, p.at, p.at, 1)
        else:
            lease.first_at = min(lease.first_at, p.at)
            lease.last_at = max(lease.last_at, p.at)
            lease.count += 1
    return sorted(rows.values(), key=lambda lease: lease.epoch)


def accounting(
    cluster: Any, client: KazooClient | None = None, *, intervals: dict[str, float] | None = None, **kwargs: Any
) -> Report:
    """Stop the replicas (SIGTERM), then count; printed (pytest shows it with -s or on failure).

    A graceful stop first, so that the ledger is at rest when it is compared
    with the record: a claim is published a moment after it commits. With
    ``client`` the ledger's last claims are read too (a claim never published
    is a loss the record cannot show). ``intervals`` defaults to the
    cluster's schedule; ``kwargs`` go to :func:`account` (``kills``).
    """
    for replica in cluster.replicas:
        replica.signal(signal.SIGCONT)
        replica.signal(signal.SIGTERM)
    for replica in cluster.replicas:
        if replica.process is not None:
            replica.wait(30)
    report = account(
        cluster.publishes(),
        cluster.schedule if intervals is None else intervals,
        skips=logged_skips([r.log() for r in cluster.replicas]),
        unanswered=logged_unanswered([r.log() for r in cluster.replicas]),
        ledger_slots=ledger_slots(client, cluster.root) if client is not None else None,
        **kwargs,
    )
    print(report.table())
    print(report.leader_table())
    return report


def assert_clean(report: Report, logs: str = "") -> None:
    """Nothing twice, nothing lost; only a tick in flight in a leader killed with kill -9 may be missing."""
    assert report.published, "nothing was published"
    assert report.twice == 0, "a tick was published twice\n" + report.details()
    assert report.lost_unexplained == [] and report.unpublished_claims == [], (
        "a tick was lost\n" + report.details() + "\n" + logs
    )

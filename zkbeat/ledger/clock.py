"""Clocks: this replica's against ZooKeeper's, and ledger times against the writes that carry them.

No clock decides who leads, but the schedule runs on the leader's wall clock:
the ledger's ``last_run_at`` is written by one leader's clock and read by the
next one's. A new leader whose clock is behind the last one's waits that much
longer for the next tick (an interval entry stalls for the difference); one
that is ahead catches up at once. An operator should hear about either, so a
new leader compares its clock with ZooKeeper's and warns past
:data:`SKEW_WARNING`. ZooKeeper stamps every write with its own clock (a
znode's ``mtime``), so one write to ``<root>/v1/clock`` and the local time
around it measure the skew, give or take half the round trip.

A leader whose clock is far ahead (a clock that jumped forward) is worse: it
records ``last_run_at`` in the future, and every later leader would wait for
that date, every entry at once. It also publishes its ticks early, under
slots (the tick's name: header ``zkbeat-slot``, task id) that a correct
clock reaches only later. So the ledger is read against ZooKeeper's time of
each write (``written``, the znode's mtime; a claim's own transaction says
it too), and what must never repeat is a slot. ``cap`` is ``written`` +
:data:`LEDGER_TOLERANCE`, plus the reading leader's own offset from
ZooKeeper's clock when it is ahead (its clock read that much at the write):

=================================================  ==========================================
the ledger entry holds                             a leader that claims it next
=================================================  ==========================================
``last_run_at`` at most ``cap``                    goes on from ``last_run_at`` (trusted)
``last_run_at`` later than ``cap`` (its            does not trust it: goes on as if the entry
writer's clock was ahead)                          last ran at ``cap``, warns naming the entry
                                                   and both times, and counts it
                                                   (``zkbeat_ledger_ahead_total``); nor does it
                                                   keep a last run of the host's own (a
                                                   database row) later than its own clock
``slot`` later than ``written`` + the tolerance    that slot is *early*: it joins ``early``,
(claimed before ZooKeeper's clock reached it)      the spans of early slots the entry carries
                                                   in every claim from then on (a span goes
                                                   on while the early slots follow each other)
a due tick whose slot is within a span, or         skips it, logged ("published early"), and
nearer to it than the entry's period (its next     goes on from that slot (from the span's
slot is past the span's first, and it comes        last if that is due too): an early slot is
before the slot that follows the span's last)      never published again, and no two ticks of
                                                   the entry are nearer than its period
``slot`` on time (not early)                       drops the spans it is past: the clocks
                                                   agree again, no trusted time is before them
=================================================  ==========================================

A leader knows ZooKeeper's time of its own claims from their transaction
(a write to an existing znode returns its stat), and estimates it from its
measured offset for a claim that only created znodes.

Why nothing is published twice: a slot published on time, or early by no
more than the tolerance, is at most ``written`` + the tolerance of its own
write, so at most ``cap`` of every later write, the earliest a distrusted
entry goes on from; a slot published earlier than that is within ``early``
until a slot on time past it has been claimed, and from then on no trusted
time is before it. At most :data:`MAX_EARLY_SPANS` spans are kept; past
that the two nearest become one, whose slots in between are skipped too,
never published twice.

Why nothing is lost silently: a slot between ``cap`` and the first early
slot was never published, and runs when it is due, under the entry's
catch-up policy (a slot between ``written`` and ``cap`` is left to the
warning, which says the entry goes on from ``cap``); an early slot is
skipped with a log line when its time comes. What it costs:
an entry goes on from its last write instead of waiting for the future
date, and later pauses for as long as the early slots span (they ran
already), a span that grows while a leader ahead keeps leading.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import datetime, timedelta

from celery import beat
from kazoo.client import KazooClient
from kazoo.exceptions import NoNodeError

from ..ticking.ticks import slot_after
from .store import EntryState

__all__ = [
    "SKEW_WARNING",
    "LEDGER_TOLERANCE",
    "Skew",
    "measure_skew",
    "ahead_of_write",
    "as_trusted",
    "early_slots",
    "near_early",
    "MAX_EARLY_SPANS",
    "Span",
]

#: Seconds of skew, beyond the measurement's own uncertainty, that are warned about.
SKEW_WARNING = 1.0
#: Seconds a ledger entry's last run may be later than ZooKeeper's time of
#: its write (clocks a little apart, the write's own latency) and be trusted.
LEDGER_TOLERANCE = 1.0
#: Spans of early slots an entry keeps at most (a few clock jumps' worth).
MAX_EARLY_SPANS = 8

#: A span of early slots: the first and the last.
Span = tuple[datetime, datetime]


def _cap(written: datetime, offset: float) -> datetime:
    return written + timedelta(seconds=LEDGER_TOLERANCE + max(offset, 0.0))


def ahead_of_write(state: EntryState, written: datetime | None, offset: float = 0.0) -> bool:
    """Whether ``state``'s last run is later than its ``cap`` (the table): ``offset`` is the reader's, ahead."""
    return written is not None and state.last_run_at > _cap(written, offset)


def early_slots(
    state: EntryState, written: datetime | None, entry: beat.ScheduleEntry | None = None
) -> tuple[Span, ...]:
    """The spans of the entry's early slots that a claim after ``state`` carries (the table).

    An early slot extends the span it follows (the entry's next slot after
    the span's last, give or take the tolerance: ``entry`` says), else
    starts one of its own: a leader that was ahead, then on time, then
    ahead again leaves two spans, not one across the slots in between.
    """
    slot = state.slot
    if slot is None or written is None:
        return state.early  # nothing to judge the slot by: what is known is kept
    spans = list(state.early)
    if slot <= written + timedelta(seconds=LEDGER_TOLERANCE):
        if not spans:
            return state.early
        return tuple(span for span in spans if span[1] >= slot)  # on time: the spans before it are done
    if any(first <= slot <= last for first, last in spans):
        return state.early
    tolerance = timedelta(seconds=LEDGER_TOLERANCE)
    for index, (first, last) in enumerate(spans):
        if entry is not None and last < slot <= slot_after(entry, last) + tolerance:
            spans[index] = (first, slot)
            break
    else:
        spans.append((slot, slot))
    spans.sort()
    while len(spans) > MAX_EARLY_SPANS:
        gaps = [(spans[i + 1][0] - spans[i][1], i) for i in range(len(spans) - 1)]
        _, nearest = min(gaps)
        spans[nearest : nearest + 2] = [(spans[nearest][0], spans[nearest + 1][1])]
    return tuple(spans)


def near_early(entry: beat.ScheduleEntry, slot: datetime, early: tuple[Span, ...]) -> Span | None:
    """The span of early slots for which the tick at ``slot`` is skipped, or None (the table).

    Within it, or nearer than the entry's period: its next slot is past the
    span's first, and it comes before the slot that follows the span's
    last. On a crontab's grid that is exactly the early slots; an
    interval's slots need not fall on the early ones, and this keeps them a
    period apart.
    """
    for first, last in early:
        if first <= slot <= last:
            return first, last
    for first, last in early:
        if slot_after(entry, slot) > first and slot < slot_after(entry, last):
            return first, last
    return None


def as_trusted(
    state: EntryState, written: datetime | None, offset: float = 0.0, entry: beat.ScheduleEntry | None = None
) -> EntryState:
    """``state`` as a leader goes by it (the table): its last run at most ``cap``, the early spans it carries.

    ``offset``: seconds the reading leader's clock is ahead of ZooKeeper's
    (negative if behind); a leader ahead trusts times its own clock wrote.
    """
    last_run_at = state.last_run_at
    if written is not None and ahead_of_write(state, written, offset):
        last_run_at = _cap(written, offset)
    early = early_slots(state, written, entry)
    if last_run_at is state.last_run_at and early == state.early:
        return state  # as written (the usual case): no copy
    return replace(state, last_run_at=last_run_at, early=early)


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

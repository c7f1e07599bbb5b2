"""The catch-up policy: what a leader does with the ticks an entry missed.

Misses come from anything that kept the ledger's last run behind: a
failover, a ZooKeeper or broker outage, a pause. The ledger remembers the
last run, so every replica sees the same first missed slot, and the policy
decides from it alone (plus the clock):

=======  ==============================================================
policy   a due tick whose slot is in the past
=======  ==============================================================
once     runs, once, and the schedule goes on from now (Celery's rule);
         later than the misfire grace time it is skipped instead
skip     skipped when missed: later than the misfire grace time, or,
         with none set, when a later slot is already due too
all      runs, and the schedule goes on from that slot, so every
         missed slot runs once, in order, each under its own task id;
         a slot older than the misfire grace time is skipped; more than
         ``zkbeat_catchup_limit`` missed: none runs, the entry goes on
         from its next slot, and the log says why (as Kubernetes does)
=======  ==============================================================

Counting the missed slots of ``all`` takes one slot computation each (a
crontab's costs about a millisecond), so it is bounded per pass of the
leader's loop: a :class:`Backlog` spends at most :data:`COUNT_BUDGET` of
them in a pass, across entries, and goes on where it stopped in the next
pass; an entry whose count is not finished waits for it (it is due again
at once, nothing is claimed), the others run. A backlog is counted once,
when it is found: while it is caught up, one slot a pass, the count is not
made again. So however many entries and however large the limit
(``zkbeat_catchup_limit``, at most :data:`~zkbeat.conf.MAX_CATCHUP_LIMIT`),
no pass spends long enough counting to trip the watchdog.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime

from celery import beat

from ..conf import ENTRY_CATCHUP_OPTION, parse_catchup
from ..exceptions import ConfigurationError
from .ticks import slot_after

__all__ = ["COUNT_BUDGET", "Backlog", "Decision", "policy_for", "decide", "missed_since"]

logger = logging.getLogger(__name__)

#: Slot computations one pass of the leader's loop spends counting missed
#: slots for catch-up ``all``, across entries (~0.2 s of interval slots,
#: ~1 s of crontab slots on a loaded host: far below the stall timeout).
COUNT_BUDGET = 1000


@dataclass(frozen=True)
class Decision:
    """Publish or skip one due tick, and where the entry's schedule goes on from."""

    skip: bool
    #: The entry's new last run: None for "now" (what Celery's reserve() sets).
    advance_to: datetime | None = None
    #: Why it is skipped, for the log line.
    why: str = "past its misfire grace time"
    #: Not decided in this pass: the count of missed slots goes on in the next one.
    defer: bool = False


@dataclass
class _Count:
    """A count of missed slots under way: from ``start``, ``found`` so far, up to ``moment``."""

    start: datetime
    moment: datetime
    found: int = 0


class Backlog:
    """Missed slots of catch-up ``all``, counted a bounded amount per pass and remembered across passes.

    One per term (a new leader counts afresh). Not thread-safe: beat's thread only.
    """

    def __init__(self) -> None:
        self.left = COUNT_BUDGET
        #: Counts this pass's budget stopped, to go on with.
        self._counts: dict[str, _Count] = {}
        #: Entries being caught up within the limit, from the slot where their backlog was found.
        self._within: dict[str, datetime] = {}

    def new_pass(self) -> None:
        """A pass of the leader's loop begins: a fresh budget."""
        self.left = COUNT_BUDGET

    def missed(self, entry: beat.ScheduleEntry, slot: datetime, now: datetime, limit: int) -> int | None:
        """Slots from ``slot`` up to ``now``, counted up to ``limit + 1``; None if the budget ran out first."""
        within = self._within.get(entry.name)
        if within is not None and within <= slot:
            return 1  # counted when found; caught up since, a slot a pass
        count = self._counts.pop(entry.name, None)
        if count is None or count.start != slot:
            count = _Count(start=slot, moment=slot)
        while count.moment <= now and count.found <= limit:
            if self.left <= 0:
                self._counts[entry.name] = count
                return None
            self.left -= 1
            count.found += 1
            following = slot_after(entry, count.moment)
            if following <= count.moment:
                break  # a schedule that does not move forward: do not loop
            count.moment = following
        if count.found <= limit:
            self._within[entry.name] = slot
        return count.found

    def caught_up(self, name: str) -> None:
        """``name`` has no backlog (any more): a later one is counted afresh."""
        self._within.pop(name, None)
        self._counts.pop(name, None)


def policy_for(entry: beat.ScheduleEntry, default: str) -> str:
    """The entry's own policy if valid (an invalid one is logged), else ``default``.

    Read from ``options``, or from the message headers: a django-celery-beat
    row has no options of its own, but its ``headers`` JSON field reaches them.
    """
    options = entry.options or {}
    headers = options.get("headers") if isinstance(options.get("headers"), dict) else {}
    if ENTRY_CATCHUP_OPTION in options:
        where, value = "options", options[ENTRY_CATCHUP_OPTION]
    elif ENTRY_CATCHUP_OPTION in headers:
        where, value = "headers", headers[ENTRY_CATCHUP_OPTION]
    else:
        return default
    try:
        return parse_catchup(f"{entry.name}.{where}.{ENTRY_CATCHUP_OPTION}", value)
    except ConfigurationError as exc:
        logger.error("zkbeat: %s; using zkbeat_catchup (%s) instead", exc, default)
        return default


def decide(
    entry: beat.ScheduleEntry,
    slot: datetime,
    now: datetime,
    policy: str,
    grace: float | None,
    limit: int,
    backlog: Backlog | None = None,
) -> Decision:
    """The table in the module docstring, for one due tick of ``entry`` planned for ``slot``.

    With a ``backlog`` the count of missed slots is bounded per pass (the
    decision may be deferred); without one it is made whole, at once.
    """
    late = (now - slot).total_seconds()
    past_grace = grace is not None and late > grace
    if policy == "once":
        return Decision(skip=past_grace)
    following = slot_after(entry, slot)
    if policy == "skip":
        if grace is not None:
            return Decision(skip=past_grace)
        return Decision(skip=following <= now, why="a later slot is due too (catch-up 'skip')")
    if following > now and backlog is not None:
        backlog.caught_up(entry.name)
    if following <= now:
        missed = _missed(entry, slot, now, limit) if backlog is None else backlog.missed(entry, slot, now, limit)
        if missed is None:
            return Decision(skip=False, defer=True, why="its missed slots are still being counted")
        if missed > limit:
            if backlog is not None:
                backlog.caught_up(entry.name)
            return Decision(
                skip=True,
                why=f"more than {limit} slots were missed (zkbeat_catchup_limit) since then: catch-up 'all' "
                "publishes none of them and goes on from the next slot",
            )
    if past_grace:
        return Decision(skip=True, advance_to=slot, why="past its misfire grace time (catch-up 'all')")
    return Decision(skip=False, advance_to=slot)


def missed_since(entry: beat.ScheduleEntry, last_run_at: datetime, now: datetime, limit: int) -> int:
    """How many slots of ``entry`` came due after a run at ``last_run_at``, up to ``now`` (counted to ``limit + 1``)."""
    first = slot_after(entry, last_run_at)
    return _missed(entry, first, now, limit) if first <= now else 0


def _missed(entry: beat.ScheduleEntry, slot: datetime, now: datetime, limit: int) -> int:
    """Slots from ``slot`` up to ``now``, counted up to ``limit + 1``."""
    count, moment = 0, slot
    while moment <= now and count <= limit:
        count += 1
        following = slot_after(entry, moment)
        if following <= moment:
            break  # a schedule that does not move forward: do not loop
        moment = following
    return count

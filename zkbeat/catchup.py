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
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime

from celery import beat

from .conf import ENTRY_CATCHUP_OPTION, parse_catchup
from .exceptions import ConfigurationError
from .ticks import slot_after

__all__ = ["Decision", "policy_for", "decide"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Decision:
    """Publish or skip one due tick, and where the entry's schedule goes on from."""

    skip: bool
    #: The entry's new last run: None for "now" (what Celery's reserve() sets).
    advance_to: datetime | None = None
    #: Why it is skipped, for the log line.
    why: str = "past its misfire grace time"


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
    entry: beat.ScheduleEntry, slot: datetime, now: datetime, policy: str, grace: float | None, limit: int
) -> Decision:
    """The table in the module docstring, for one due tick of ``entry`` planned for ``slot``."""
    late = (now - slot).total_seconds()
    past_grace = grace is not None and late > grace
    if policy == "once":
        return Decision(skip=past_grace)
    following = slot_after(entry, slot)
    if policy == "skip":
        if grace is not None:
            return Decision(skip=past_grace)
        return Decision(skip=following <= now, why="a later slot is due too (catch-up 'skip')")
    if following <= now:
        missed = _missed(entry, slot, now, limit)
        if missed > limit:
            return Decision(
                skip=True,
                why=f"more than {limit} slots were missed (zkbeat_catchup_limit) since then: catch-up 'all' "
                "publishes none of them and goes on from the next slot",
            )
    if past_grace:
        return Decision(skip=True, advance_to=slot, why="past its misfire grace time (catch-up 'all')")
    return Decision(skip=False, advance_to=slot)


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

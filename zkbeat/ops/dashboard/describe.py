"""What the dashboard says about one entry: its schedule in words, its next fire times, its last run.

Pure functions of a Celery ``ScheduleEntry`` (when the app is known), the
entry's ledger state and a clock: no ZooKeeper here. The next fire times are
the ones a leader would publish at: each slot comes from the same
``slot_after`` the leader plans with, and is published at ``slot + offset``
(zkbeat.ticking.jitter), so every replica and this page agree on them.
"""

from __future__ import annotations

import copy
from datetime import datetime, timedelta, timezone
from typing import Any

from celery import schedules

from ...ledger.history import kind_of
from ...ledger.store import EntryState
from ...ticking import catchup
from ...ticking.jitter import jitter_for, offset
from ...ticking.ticks import slot_after

__all__ = ["NEXT_COUNT", "schedule_words", "next_fires", "last_run", "policy"]

#: Fire times shown per entry.
NEXT_COUNT = 5


def _span(seconds: float) -> str:
    """``30 s``, ``5 min``, ``2 h``, ``1 d``; ``90 s`` for what no larger unit divides."""
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{seconds / size:g} {unit}"
    return f"{seconds:g} s"


def _zone_name(zone: Any) -> str:
    return str(getattr(zone, "key", None) or getattr(zone, "zone", None) or zone or "UTC")


def schedule_words(entry: Any) -> str:
    """The entry's schedule as an operator would say it: ``every 30 s``, ``at 07:30 Europe/Paris``."""
    sched = entry.schedule
    try:
        if isinstance(sched, schedules.crontab):
            return _crontab_words(sched)
        if isinstance(sched, schedules.solar):
            return f"at {sched.event} at ({sched.lat:g}, {sched.lon:g})"
        if isinstance(sched, schedules.schedule):
            return f"every {_span(sched.run_every.total_seconds())}"
    except Exception:  # noqa: BLE001 - a custom schedule's attributes may raise: show what it says of itself
        pass
    return repr(sched)


def _crontab_words(sched: schedules.crontab) -> str:
    minute, hour = str(sched._orig_minute), str(sched._orig_hour)
    dom, month, dow = str(sched._orig_day_of_month), str(sched._orig_month_of_year), str(sched._orig_day_of_week)
    zone = _zone_name(sched.tz)
    if minute.isdigit() and hour.isdigit():
        words = f"at {int(hour):02d}:{int(minute):02d} {zone}"
        if dow != "*":
            words += f" on day-of-week {dow}"
        if dom != "*":
            words += f" on day {dom}"
        if month != "*":
            words += f" in month {month}"
        return words
    return f"cron {minute} {hour} {dom} {month} {dow} ({zone})"


def _period(entry: Any, slot: datetime) -> float:
    return (slot_after(entry, slot) - slot).total_seconds()


def _jitter(entry: Any, root: str, slot: datetime, default: float) -> float:
    """Seconds after ``slot`` the leader publishes it (0 when off or not below the period, as zkbeat.ticking.jitter)."""
    jitter, _ = jitter_for(entry, default)
    if jitter <= 0 or jitter >= _period(entry, slot):
        return 0.0
    return offset(root, entry.name, slot, jitter)


def next_fires(
    entry: Any, state: EntryState | None, root: str, default_jitter: float, now: datetime, count: int = NEXT_COUNT
) -> list[dict[str, Any]]:
    """The entry's next ``count`` ticks: ``{slot, at, due}``, ``at`` being the jittered publish moment.

    They follow from the ledger's last run (else the app's own), as a new
    leader would plan them. A first slot in the past is due now (late, or
    paused); the ones after it go on from now, as Celery's rule does.
    """
    entry = copy.copy(entry)
    last = state.last_run_at if state is not None else entry.last_run_at
    if last.tzinfo is None:
        last = last.replace(tzinfo=timezone.utc)
    fires = []
    slot = slot_after(entry, last)
    for _ in range(count):
        at = slot + timedelta(seconds=_jitter(entry, root, slot, default_jitter))
        fires.append({"slot": slot.isoformat(), "at": at.isoformat(), "due": at <= now})
        following = slot_after(entry, max(slot, now) if at <= now else slot)
        if following <= slot:
            break  # a schedule that does not move on (a custom one): say no more than it does
        slot = following
    return fires


def last_run(state: EntryState, entry: Any | None, root: str, default_jitter: float) -> dict[str, Any]:
    """The ledger's last run as the page shows it: when, which kind, and how late.

    ``kind`` is ``manual`` for a run-now (the ledger keeps its request),
    ``catch-up`` for a tick published after the next one had come due (it
    was missed: a failover, an outage, a pause), else ``scheduled``.
    ``late_seconds`` counts from the tick's jittered moment (when the app is
    known; from its slot otherwise) to the claim that recorded it. A manual
    run has no slot of its own in the ledger: its lateness is not known.
    """
    published = state.updated_at
    data: dict[str, Any] = {
        "slot": state.slot.isoformat() if state.slot else None,
        "published_at": published.isoformat() if published else None,
        "epoch": state.epoch,
        "manual": state.manual,
        "kind": "manual" if state.manual else "scheduled",
        "late_seconds": None,
    }
    if state.manual or state.slot is None or published is None:
        return data
    moment = state.slot
    try:
        if entry is not None:
            moment = state.slot + timedelta(seconds=_jitter(entry, root, state.slot, default_jitter))
            data["kind"] = kind_of(entry, state.slot, published)  # as the leader records it in its recent runs
    except Exception:  # noqa: BLE001 - a schedule that raises: lateness from the slot alone
        moment = state.slot
    data["late_seconds"] = round((published - moment).total_seconds(), 3)
    return data


def policy(entry: Any, default: str) -> str | None:
    """The entry's catch-up policy (its option, else the app's ``zkbeat_catchup``)."""
    try:
        return catchup.policy_for(entry, default)
    except Exception:  # noqa: BLE001 - shown as unknown
        return None

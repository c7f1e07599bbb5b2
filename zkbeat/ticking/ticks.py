"""What names one tick of an entry: its slot, its task id, its message options.

Every replica must compute the same answers from the same ledger state, so
that a tick keeps its name (headers, task id) across a leader change.
"""

from __future__ import annotations

import copy
import hashlib
import logging
import uuid
from datetime import datetime, timedelta, timezone
from typing import Any

import celery
from celery import beat, schedules
from celery.utils.time import maybe_make_aware
from celery.utils.time import remaining as time_remaining

from ..conf import ENTRY_MISFIRE_OPTION, ENTRY_OPTIONS, parse_misfire_grace_time
from ..exceptions import ConfigurationError

__all__ = [
    "tick_slot",
    "slot_after",
    "delay_to_slot",
    "task_id_for",
    "manual_task_id",
    "HEADER_MANUAL",
    "grace_time",
    "message_options",
    "HEADER_ENTRY",
    "HEADER_SLOT",
    "HEADER_EPOCH",
]

logger = logging.getLogger(__name__)

HEADER_ENTRY = "zkbeat-entry"
HEADER_SLOT = "zkbeat-slot"
HEADER_EPOCH = "zkbeat-epoch"
#: A triggered run's header: the request's znode name (zkbeat.ledger.controls).
HEADER_MANUAL = "zkbeat-manual"

#: Celery 5.7's crontab answers the same whatever day its clock says; older ones do not (see tick_slot).
_CLOCK_AT_LAST_RUN = tuple(celery.VERSION[:2]) < (5, 7)
#: Celery before 5.5 measures the time left on the wall clock, not in real time (see slot_after).
_WALL_CLOCK_REMAINING = tuple(celery.VERSION[:2]) < (5, 5)


def tick_slot(entry: beat.ScheduleEntry) -> datetime:
    """The UTC time entry's due tick was planned for, from its last run alone.

    The schedule's clock is pinned while it is asked, so every replica that
    holds the same ``last_run_at`` (from the ledger) computes the same slot
    to the microsecond; the slot names the tick in headers and task ids.
    On Celery before 5.7 the clock is pinned to the last run itself: there a
    crontab compares the last run's date with the clock's, so after a last
    run on an earlier day it would name the next hour instead of the next
    tick, and two replicas asking either side of midnight would disagree.
    Across a DST change the slot is the moment Celery calls the tick due,
    which depends on the Celery version (see slot_after).
    """
    return slot_after(entry, entry.last_run_at)


def slot_after(entry: beat.ScheduleEntry, last_run_at: datetime) -> datetime:
    """The UTC slot entry's schedule plans next after a run at ``last_run_at`` (see tick_slot).

    The slot is the moment Celery's own ``is_due`` first says due, so that
    two ticks never share a slot across a DST change. From Celery 5.5 on,
    ``remaining_estimate`` is real time, counted from the clock in UTC.
    Before 5.5 it is wall-clock time in the schedule's zone (Celery
    subtracts two times of one zone), so the slot is the first instant whose
    wall clock reads the planned time: for a time the spring-forward jump
    skips, the jump itself (see _first_instant_at).
    """
    schedule = entry.schedule
    if type(schedule) is schedules.schedule and not schedule.relative and not _WALL_CLOCK_REMAINING:
        # A plain interval: Celery's remaining() from the last run, counted from
        # the last run itself (the pinned clock cancels out of the slot), with
        # no copy of the schedule and no clock read. ~25 µs less a tick.
        try:
            start = interval_aware(schedule, last_run_at)
            slot = start.astimezone(timezone.utc) + time_remaining(start, schedule.run_every, start, False)
            return slot.astimezone(timezone.utc)
        except Exception:  # noqa: BLE001 - asked the general way below, which says what is wrong
            pass
    now = datetime.now(timezone.utc)
    try:
        schedule = copy.copy(entry.schedule)
        if _CLOCK_AT_LAST_RUN:
            pinned = getattr(schedule, "maybe_make_aware", maybe_make_aware)(last_run_at)
        else:
            pinned = now
        schedule.nowfun = lambda: pinned
        remaining = schedule.remaining_estimate(last_run_at)
        if _WALL_CLOCK_REMAINING:
            # A crontab subtracts in its own zone; other schedules in the last run's.
            start = schedule.to_local(pinned) if isinstance(schedule, schedules.crontab) else pinned
            slot = _first_instant_at(start + remaining)
        else:
            slot = maybe_make_aware(pinned).astimezone(timezone.utc) + remaining
    except Exception:  # noqa: BLE001 - custom schedules may not support this
        slot = now
    return maybe_make_aware(slot).astimezone(timezone.utc)


def interval_aware(schedule: schedules.schedule, moment: datetime) -> datetime:
    """``schedule.maybe_make_aware(moment)`` for a plain interval: an aware moment is returned as it is.

    Celery's ``maybe_make_aware`` returns an aware datetime unchanged, but
    looks up the schedule's zone first (``app.timezone``, behind a lock):
    twice per tick of a burst. Asked of a schedule class that overrides it,
    or of a naive moment, Celery answers.
    """
    if type(schedule).maybe_make_aware is _MAYBE_MAKE_AWARE:
        zone = moment.tzinfo
        if zone is not None and zone.utcoffset(moment) is not None:
            return moment
    return schedule.maybe_make_aware(moment)


_MAYBE_MAKE_AWARE = schedules.BaseSchedule.maybe_make_aware


def delay_to_slot(entry: beat.ScheduleEntry, is_due: bool, next_time: float) -> float:
    """Seconds of real time until entry's next slot, where Celery's ``next_time`` would oversleep it.

    Before Celery 5.5 a crontab's time left is wall-clock time, so across
    the spring-forward jump beat sleeps an hour past the slot: after 01:30
    EST an hourly :30 entry sleeps 3600 s, to 03:30 EDT, although Celery's
    ``is_due`` says due at 03:00 EDT, and the tick named 03:00 goes out at
    03:30 while the one of 03:30 is lost. The heap wakes at the slot
    instead (slot_after; after a due tick, the slot after a run now). Only
    ever earlier than Celery's answer: an early wake asks ``is_due`` again.
    """
    if not _WALL_CLOCK_REMAINING or not isinstance(entry.schedule, schedules.crontab):
        return next_time
    if not isinstance(next_time, (int, float)):
        return next_time
    try:
        now = maybe_make_aware(entry.schedule.now())
        real = (slot_after(entry, now if is_due else entry.last_run_at) - now).total_seconds()
    except Exception:  # noqa: BLE001 - the entry's own clock failed: Celery's answer stands
        return next_time
    return min(next_time, real) if real > 0 else next_time


def _first_instant_at(wall: datetime) -> datetime:
    """The first instant at which a clock in ``wall``'s zone reads ``wall`` or later.

    It is ``wall`` itself unless the spring-forward jump skips that time:
    in New York 02:30 on the night that goes from 02:00 to 03:00 is first
    passed at the jump (07:00 UTC), while PEP 495 maps it to 03:30 EDT,
    which is also the next hour's tick. The jump is found by bisection
    between the two readings of the skipped time, to the microsecond.
    """
    naive = wall.replace(tzinfo=None)
    zone = wall.tzinfo

    def reads_past(moment: datetime) -> bool:
        return moment.astimezone(zone).replace(tzinfo=None) >= naive

    before, instant = _readings(wall)
    if reads_past(before) or not reads_past(instant):
        return before  # a time that exists (the first of two, when the clock repeats it)
    while instant - before > timedelta(microseconds=1):
        middle = before + (instant - before) // 2
        if reads_past(middle):
            instant = middle
        else:
            before = middle
    return instant


def _readings(wall: datetime) -> tuple[datetime, datetime]:
    """The earliest and latest UTC instants ``wall``'s clock reading can name (equal unless DST is changing).

    PEP 495 zones (zoneinfo, dateutil) give the two by ``fold``. pytz
    ignores ``fold`` and gives each offset a tzinfo of its own (aware
    arithmetic keeps the one before a change): its ``localize`` with
    ``is_dst`` gives them, as django-celery-beat's pytz zones need.
    """
    naive = wall.replace(tzinfo=None)
    localize = getattr(wall.tzinfo, "localize", None)
    if callable(localize):
        both = [localize(naive, is_dst=is_dst) for is_dst in (True, False)]
    else:
        both = [wall.replace(fold=fold) for fold in (0, 1)]
    first, second = sorted(moment.astimezone(timezone.utc) for moment in both)
    return first, second


def task_id_for(root: str, name: str, slot: datetime, slot_text: str | None = None) -> str:
    """A task id that is the same for the same tick on every replica (uuid5).

    ``slot_text``: ``slot.isoformat()``, where the caller has it already.
    """
    if slot_text is None:
        slot_text = slot.isoformat()
    return uuid_text(
        hashlib.sha1(_URL_NAMESPACE + f"zkbeat:{root}:{name}:{slot_text}".encode(), usedforsecurity=False).digest(), 5
    )


#: ``uuid.NAMESPACE_URL``'s bytes, as :func:`uuid.uuid5` hashes them before the name.
_URL_NAMESPACE = uuid.NAMESPACE_URL.bytes
#: The bits of a UUID's number that :class:`uuid.UUID` keeps for a given version (the rest: version and variant).
_UUID_KEPT = ~((0xF000 << 64) | (0xC000 << 48)) & ((1 << 128) - 1)


def uuid_text(raw: bytes, version: int) -> str:
    """``str(uuid.UUID(bytes=raw[:16], version=version))`` at a sixth of its cost (a task id per publish).

    ``uuid.uuid5(namespace, name)`` is the version 5 of the SHA-1 of
    ``namespace.bytes + name.encode()``, ``uuid.uuid4()`` the version 4 of
    ``os.urandom(16)``: the same version and variant bits are set here.
    """
    number = (int.from_bytes(raw[:16], "big") & _UUID_KEPT) | (version << 76) | (0x8000 << 48)
    text = f"{number:032x}"
    return f"{text[:8]}-{text[8:12]}-{text[12:16]}-{text[16:20]}-{text[20:]}"


def grace_time(entry: beat.ScheduleEntry, default: float | None) -> float | None:
    """The entry's misfire grace time: its own option if valid, else ``default``."""
    options = entry.options or {}
    if ENTRY_MISFIRE_OPTION in options:
        try:
            return parse_misfire_grace_time(
                f"{entry.name}.options.{ENTRY_MISFIRE_OPTION}", options[ENTRY_MISFIRE_OPTION]
            )
        except ConfigurationError as exc:
            logger.error("zkbeat: %s; using zkbeat_misfire_grace_time instead", exc)
    return default


def manual_task_id(root: str, name: str, request: str) -> str:
    """The task id of a triggered run: from its request, the same on any leader that runs it."""
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"zkbeat:{root}:{name}:manual:{request}"))


def message_options(
    entry: beat.ScheduleEntry, root: str, slot: datetime, epoch: int, manual: str | None = None
) -> dict[str, Any]:
    """The entry's options for this tick: zkbeat's headers and task id, zkbeat's own options removed.

    ``manual`` names the trigger request of a run-now (header ``zkbeat-manual``;
    the slot is then the request's time).
    """
    options = dict(entry.options or {})
    for option in ENTRY_OPTIONS:
        options.pop(option, None)
    headers = dict(options.get("headers") or {})
    for option in ENTRY_OPTIONS:
        headers.pop(option, None)  # a django-celery-beat row sets them in its headers
    headers.update({HEADER_ENTRY: entry.name, HEADER_SLOT: slot.isoformat(), HEADER_EPOCH: epoch})
    if manual is None:
        options["task_id"] = task_id_for(root, entry.name, slot)
    else:
        headers[HEADER_MANUAL] = manual
        options["task_id"] = manual_task_id(root, entry.name, manual)
    options["headers"] = headers
    return options

"""What names one tick of an entry: its slot, its task id, its message options.

Every replica must compute the same answers from the same ledger state, so
that a tick keeps its name (headers, task id) across a leader change.
"""

from __future__ import annotations

import copy
import logging
import uuid
from datetime import datetime, timezone
from typing import Any

import celery
from celery import beat
from celery.utils.time import maybe_make_aware

from .conf import ENTRY_MISFIRE_OPTION, ENTRY_OPTIONS, parse_misfire_grace_time
from .exceptions import ConfigurationError

__all__ = [
    "tick_slot",
    "slot_after",
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
#: A triggered run's header: the request's znode name (zkbeat.controls).
HEADER_MANUAL = "zkbeat-manual"

#: Celery 5.7's crontab answers the same whatever day its clock says; older ones do not (see tick_slot).
_CLOCK_AT_LAST_RUN = tuple(celery.VERSION[:2]) < (5, 7)


def tick_slot(entry: beat.ScheduleEntry) -> datetime:
    """The UTC time entry's due tick was planned for, from its last run alone.

    The schedule's clock is pinned while it is asked, so every replica that
    holds the same ``last_run_at`` (from the ledger) computes the same slot
    to the microsecond; the slot names the tick in headers and task ids.
    On Celery before 5.7 the clock is pinned to the last run itself: there a
    crontab compares the last run's date with the clock's, so after a last
    run on an earlier day it would name the next hour instead of the next
    tick, and two replicas asking either side of midnight would disagree.
    """
    return slot_after(entry, entry.last_run_at)


def slot_after(entry: beat.ScheduleEntry, last_run_at: datetime) -> datetime:
    """The UTC slot entry's schedule plans next after a run at ``last_run_at`` (see tick_slot)."""
    now = datetime.now(timezone.utc)
    try:
        schedule = copy.copy(entry.schedule)
        if _CLOCK_AT_LAST_RUN:
            pinned = getattr(schedule, "maybe_make_aware", maybe_make_aware)(last_run_at)
        else:
            pinned = now
        schedule.nowfun = lambda: pinned
        slot = pinned + schedule.remaining_estimate(last_run_at)
    except Exception:  # noqa: BLE001 - custom schedules may not support this
        slot = now
    return maybe_make_aware(slot).astimezone(timezone.utc)


def task_id_for(root: str, name: str, slot: datetime) -> str:
    """A task id that is the same for the same tick on every replica (uuid5)."""
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"zkbeat:{root}:{name}:{slot.isoformat()}"))


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

"""An entry's tick policy (misfire grace, catch-up, jitter), parsed once when the schedule is read.

The options live in the entry's ``options`` (or, for a django-celery-beat
row, its message headers) and are checked like settings: a bad value is
logged and the setting's default used. Parsing them on every tick of every
entry cost a leader a sixth of its planning, so each entry's policy is kept
with the options object it was read from. Celery's ``reserve()`` hands that
same object to the entry's successor, so the policy lasts from tick to tick;
an entry read again from the schedule (a changed ``beat_schedule``, a
changed row) has new options and is parsed again, and the host's
``schedule_replaced`` / ``entries_replaced`` and a rebuilt heap drop the
cache outright.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from celery import beat

from ..conf import Settings
from . import catchup
from .jitter import jitter_for
from .ticks import grace_time

__all__ = ["EntryPolicy", "Policies", "read_policy"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class EntryPolicy:
    """What a leader needs of an entry's options to plan its ticks."""

    #: Seconds a tick may be late and still run (None: no limit).
    grace: float | None
    #: Catch-up policy: 'once', 'skip' or 'all' (zkbeat.ticking.catchup).
    catchup: str
    #: Jitter bound in seconds (0: none), and the complaint about a bad option to log.
    jitter: float
    jitter_complaint: str | None = None


def read_policy(entry: beat.ScheduleEntry, settings: Settings) -> EntryPolicy:
    """Parse ``entry``'s policy options against the settings' defaults (a bad one is logged, the default used)."""
    jitter, complaint = jitter_for(entry, settings.jitter)
    return EntryPolicy(
        grace=grace_time(entry, settings.misfire_grace_time),
        catchup=catchup.policy_for(entry, settings.catchup),
        jitter=jitter,
        jitter_complaint=complaint,
    )


class Policies:
    """Each entry's :class:`EntryPolicy`, kept while its options object stays the same. Beat's thread only."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._kept: dict[str, tuple[object, EntryPolicy]] = {}

    def of(self, entry: beat.ScheduleEntry) -> EntryPolicy:
        # Celery gives an entry without options a fresh {} at every reserve(): all empty ones are alike.
        options = entry.options or None
        kept = self._kept.get(entry.name)
        if kept is not None and kept[0] is options:
            return kept[1]
        policy = read_policy(entry, self.settings)
        self._kept[entry.name] = (options, policy)
        return policy

    def forget(self, names: object = None) -> None:
        """Parse these entries (all, by default) again when next asked."""
        if names is None:
            self._kept.clear()
            return
        for name in names:  # type: ignore[attr-defined]
            self._kept.pop(name, None)

"""``zkbeat.DatabaseScheduler``: django-celery-beat's schedule under zkbeat's leadership.

    celery -A proj beat --scheduler zkbeat.DatabaseScheduler

The schedule lives in django-celery-beat's tables, where operators edit it in
the Django admin; which ticks ran lives in zkbeat's ledger in ZooKeeper.
django-celery-beat's own scheduler assumes it is the only beat. Four of its
habits would hurt with N replicas, and this module changes exactly those:

* Its ``setup_schedule()`` upserts ``beat_schedule`` into the tables on every
  replica at start-up. Here a replica does that once it leads (after its
  first pass, so that a takeover publishes after one read).
* Its ``schedule`` property may query the database on every access. Here a
  follower sends no query at all, and the leader reads once per pass of its
  loop; django-celery-beat's change tracking (``PeriodicTasks``) tells it of
  anything added, edited, disabled or deleted in the admin since.
* It writes ``last_run_at`` when it syncs, every few minutes and at exit.
  Here only the leader syncs, and a replica that stops leading drops what it
  had pending, so it never writes its stale view over a newer leader's. After
  a failover the rows may be minutes behind, so the ledger decides each
  entry's last run, unless the row itself vouches for one at least as new (a
  one-off an operator re-armed after it ran: see ``ModelEntry.vouched_run``).
* ``ModelEntry.__next__`` advances the row object in place, so the entry being
  published and its successor share one row: a claim that did not commit
  would still count a run (and so disable a one-off). Here each successor
  gets its own copy of the row.

Rows written around the admin (raw SQL, ``QuerySet.update``) can hold what
django-celery-beat cannot load or save: an unknown time zone, arguments that
are not JSON, two schedule types. Each is logged once and left out, and the
other tasks run (zkbeat.contrib._rows says how each is found).

Only the leader writes the rows, and only what django-celery-beat itself
would write; those writes are not fenced by ZooKeeper (the publishes are), so
the ledger, never the database, is what decides whether a tick ran.
"""

from __future__ import annotations

import copy
import logging
import time
from datetime import datetime
from typing import Any

from celery import beat
from celery.utils.time import maybe_make_aware
from django.core.exceptions import ObjectDoesNotExist, ValidationError
from django.db import Error as DatabaseError
from django.db import close_old_connections
from django_celery_beat import schedulers
from django_celery_beat.models import PeriodicTask

from ..ledger import EntryState
from ..scheduler import LeaderScheduleMixin
from . import _rows

__all__ = ["DatabaseScheduler", "ModelEntry"]

logger = logging.getLogger(__name__)

#: Seconds between full re-reads of the schedule even without a change
#: (django-celery-beat's own rule: its crontab pre-filter depends on the hour).
#: Releases before 2.8.1 have neither the pre-filter nor the constant; there
#: the same five minutes cost one extra read.
FULL_RELOAD_INTERVAL = getattr(schedulers, "SCHEDULE_SYNC_MAX_INTERVAL", 300)
#: Reads of the schedule per reload when crontab rows keep turning bad under it.
READ_ATTEMPTS = 3


class ModelEntry(schedulers.ModelEntry):
    """A django-celery-beat entry whose run state is its row's own.

    ``last_run_at`` and ``total_run_count`` read and write the row object,
    so what the ledger merges in is what ``is_due`` sees (a one-off checks
    the row's count), what ``__next__`` advances and what ``save`` writes.
    """

    def __init__(self, model: PeriodicTask, app: Any = None) -> None:
        self.model = model  # the properties below need it before the base class assigns them
        #: The row's last run as read, before django-celery-beat fills in a
        #: default for rows that never ran (None then).
        self.row_last_run_at: datetime | None = model.last_run_at
        super().__init__(model, app=app)

    @property  # type: ignore[override]
    def last_run_at(self) -> datetime:
        return self.model.last_run_at

    @last_run_at.setter
    def last_run_at(self, value: datetime) -> None:
        self.model.last_run_at = value

    @property  # type: ignore[override]
    def total_run_count(self) -> int:
        return self.model.total_run_count

    @total_run_count.setter
    def total_run_count(self, value: int) -> None:
        self.model.total_run_count = value

    def __next__(self) -> ModelEntry:
        # django-celery-beat advances self.model in place; a copy keeps this
        # entry intact for a retry if its claim does not commit.
        model = copy.copy(self.model)
        model.last_run_at = self._default_now()
        model.total_run_count += 1
        model.no_changes = True
        return self.__class__(model, app=self.app)

    def __copy__(self) -> ModelEntry:
        # ScheduleEntry's __reduce__ rebuilds from its own constructor's
        # arguments, which a ModelEntry does not take; a shallow copy shares the row.
        clone = self.__class__.__new__(self.__class__)
        clone.__dict__.update(self.__dict__)
        return clone

    def vouched_run(self) -> datetime | None:
        """The newest run the row itself vouches for, weighed against the ledger's.

        That is the row's own ``last_run_at``. A one-off that never ran also
        vouches for its last change: an operator who deletes a one-off and
        creates it again under the same name expects it to run, although the
        ledger remembers its namesake's run. (A periodic task in that case
        keeps the ledger's older run and is caught up once.)
        """
        if self.row_last_run_at is not None:
            return self.row_last_run_at
        if self.model.one_off:
            return self.model.date_changed
        return None


class DatabaseScheduler(LeaderScheduleMixin, schedulers.DatabaseScheduler):
    """django-celery-beat's DatabaseScheduler with zkbeat's leadership and ledger.

    ``celery -A proj beat --scheduler zkbeat.DatabaseScheduler``
    """

    Entry = ModelEntry

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._host_set_up = False  # beat_schedule upserted (once, while leading)
        self._reload_wanted = True
        self._reloaded_at = 0.0
        self._complaints = _rows.Complaints(logger)  # bad rows, each logged once
        self._crontab_zones: set[str] | None = None  # of the read in progress
        self._unloadable_crontabs: dict[int, str] = {}
        super().__init__(*args, **kwargs)

    @property
    def schedule(self) -> dict[str, ModelEntry]:
        """The schedule as the leader last read it; reading it sends no query."""
        if self._schedule is None:
            self._schedule = {}
        return self._schedule

    # -- leadership --------------------------------------------------------

    def setup_host_schedule(self) -> None:
        """Nothing at start-up: django-celery-beat's setup writes; it runs once leading."""

    def on_leadership_start(self) -> None:
        """A new leader starts from the database's current schedule (one read, no write)."""
        self._reload_wanted = True
        try:
            self._reload()
        except DatabaseError as exc:
            logger.error("zkbeat: cannot read the schedule from the database (%r); retrying on every pass", exc)

    def on_leadership_end(self) -> None:
        if self._dirty:
            logger.info("zkbeat: not leading: dropping unsynced run times of %s", ", ".join(sorted(self._dirty)))
        self._dirty.clear()
        self._reload_wanted = True

    def keeps_own_run(self, entry: beat.ScheduleEntry, state: EntryState) -> bool:
        """Keep the row's last run when it vouches for one at least as new as the ledger's."""
        vouched = entry.vouched_run() if isinstance(entry, ModelEntry) else None
        return vouched is not None and maybe_make_aware(vouched) >= state.last_run_at

    # -- the loop ----------------------------------------------------------

    def tick(self, *args: Any, **kwargs: Any) -> float:
        if self.leading:
            with self.leader_pass():  # a hung query here is a hung leader too
                self._refresh()
        interval = super().tick(*args, **kwargs)
        if self.leading and not self._host_set_up:
            return 0  # the deferred upsert of beat_schedule comes right after this pass, not max_interval later
        return interval

    def _refresh(self) -> None:
        """Once per pass while leading: pick up admin changes, write run times when due."""
        try:
            if not self._host_set_up:
                # django-celery-beat's own setup: default entries and
                # beat_schedule into the tables, where the admin shows them.
                # Deferred from promotion to this replica's first full pass
                # as leader, so that taking over costs a read, not a write
                # per entry, before the first publish.
                schedulers.DatabaseScheduler.setup_schedule(self)
                self._host_set_up = True
                self._reload_wanted = True
            if (
                self._reload_wanted
                or self.schedule_changed()
                or time.monotonic() - self._reloaded_at >= FULL_RELOAD_INTERVAL
            ):
                self.sync()  # what we ran reaches the rows before they are read back
                self._reload()
            elif self._dirty and beat.Scheduler.should_sync(self):
                self._do_sync()
        except DatabaseError as exc:
            self._reload_wanted = True
            logger.error("zkbeat: cannot read the schedule from the database (%r); keeping the last one read", exc)

    def _reload(self) -> None:
        """Read every enabled task again; each is checked against the ledger before it runs."""
        close_old_connections()
        self._last_timestamp = self.Changes.last_change()
        self._schedule = self.all_as_schedule()
        self._reloaded_at = time.monotonic()
        self._reload_wanted = False
        self._dirty &= set(self._schedule)
        # The rebuilt entries carry the rows' run times, which may be behind
        # the ledger: the term reads the ledger for each before its first claim.
        self.schedule_replaced()

    def all_as_schedule(self) -> dict[str, ModelEntry]:
        """Every enabled task; a row that cannot become an entry is logged (once) and left out.

        django-celery-beat skips only rows that raise ValueError; anything else
        (a period that is not a timedelta unit, solar without ``ephem``, a
        crontab whose time zone is unknown) would end every reload, and with
        it the schedule of every other task. Rows are checked first
        (zkbeat.contrib._rows), so that a bad one fails neither the query
        nor, later, a sync.
        """
        self._complaints.begin_read()
        for attempt in range(READ_ATTEMPTS):
            self._crontab_zones, self._unloadable_crontabs = _rows.crontab_zones()
            try:
                # enabled_models() (with its crontab pre-filter) is django-celery-beat
                # 2.8.1's; before it, the manager's enabled() is every enabled row.
                if hasattr(self, "enabled_models"):
                    models = list(self.enabled_models())
                else:
                    models = list(self.Model.objects.enabled())
                break
            except ValidationError:
                # A crontab row turned bad between the check and the read:
                # checked again, it is left out.
                if attempt == READ_ATTEMPTS - 1:
                    raise
            finally:
                self._crontab_zones = None
        self._report_unloadable_crontabs()
        loaded = {}
        for model in models:
            why = _rows.unfit(model)
            if why is not None:
                self._complaints.say(model.name, why, "zkbeat: leaving out periodic task %r: %s", model.name, why)
                continue
            try:
                entry = self.Entry(model, app=self.app)
            except DatabaseError:
                raise
            except Exception as exc:  # noqa: BLE001 - one bad row must not stop the rest
                why = _rows.reason(exc)
                self._complaints.say(
                    model.name, why, "zkbeat: leaving out periodic task %r: it cannot be scheduled: %r", model.name, exc
                )
                continue
            loaded[model.name] = entry
            if model.task not in self.app.tasks:
                why = f"unregistered {model.task}"
                self._complaints.say(
                    model.name,
                    why,
                    "zkbeat: periodic task %r runs task %r, which this app has not registered; "
                    "it is sent by name, as celery beat does",
                    model.name,
                    model.task,
                    level=logging.WARNING,
                )
        self._complaints.end_read()
        return loaded

    def _report_unloadable_crontabs(self) -> None:
        """Name the enabled tasks on crontab rows that cannot load (and those rows no task uses)."""
        unloadable = self._unloadable_crontabs
        if not unloadable:
            return
        used = set()
        on_them = self.Model.objects.filter(enabled=True, crontab_id__in=list(unloadable))
        for name, pk in on_them.values_list("name", "crontab_id"):
            used.add(pk)
            why = unloadable[pk]
            self._complaints.say(
                name, why, "zkbeat: leaving out periodic task %r: its crontab schedule #%s has a time zone "
                "that cannot be loaded: %s", name, pk, why,
            )  # fmt: skip
        for pk in sorted(set(unloadable) - used):
            why = unloadable[pk]
            self._complaints.say(
                f"crontab #{pk}", why, "zkbeat: crontab schedule #%s has a time zone that cannot be loaded: %s "
                "(no enabled task uses it)", pk, why, level=logging.WARNING,
            )  # fmt: skip

    def enabled_models_qs(self) -> Any:
        """django-celery-beat's query, without tasks on crontab rows that cannot load."""
        query = super().enabled_models_qs()
        if self._unloadable_crontabs:
            query = query.exclude(crontab_id__in=list(self._unloadable_crontabs))
        return query

    def _get_unique_timezone_names(self) -> Any:
        # django-celery-beat reads these through the time-zone field, which
        # raises on a single unknown zone, used or not: only known ones here.
        if self._crontab_zones is not None:
            return sorted(self._crontab_zones)
        return sorted(_rows.crontab_zones()[0])

    def should_sync(self) -> bool:
        # Celery asks inside apply_async, in the middle of a batch whose
        # shutdown signals are held; _refresh syncs at the top of the next
        # pass instead. (reserve(), django-celery-beat's own, marks each
        # advanced entry dirty; a claim that did not commit puts the
        # unadvanced entry back, whose row then holds the previous run.)
        return False

    def sync(self) -> None:
        """Write run times to the rows, only while leading (also at exit), one row at a time.

        A row that its own ``save()`` now refuses (changed around the admin
        since it was read) gets its run times written alone, is logged once
        and is left out from the next read on; the other rows are saved.
        """
        if not self.leading:
            return
        close_old_connections()
        for name in sorted(self._dirty):
            entry = (self._schedule or {}).get(name)
            try:
                if entry is not None:
                    entry.save()
            except ObjectDoesNotExist:
                pass  # deleted in the admin since: the next read drops it
            except DatabaseError as exc:
                logger.error("zkbeat: cannot write run times to the database (%r); retrying at the next sync", exc)
                return
            except Exception as exc:  # noqa: BLE001 - one bad row must not cost the others their run times
                if not self._save_refused(entry, exc):
                    return
            self._dirty.discard(name)

    def _save_refused(self, entry: ModelEntry, exc: Exception) -> bool:
        """Write the run times django-celery-beat's save() refused to, alone; False if the database failed."""
        why = _rows.reason(exc)
        self._complaints.say(
            entry.name, why, "zkbeat: leaving out periodic task %r: its row cannot be saved (%s); "
            "writing its run times alone", entry.name, why,
        )  # fmt: skip
        self._reload_wanted = True
        try:
            _rows.write_fields(entry.model, ("last_run_at", "total_run_count"))
        except DatabaseError as exc:
            logger.error("zkbeat: cannot write run times to the database (%r); retrying at the next sync", exc)
            return False
        return True

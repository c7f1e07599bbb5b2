"""``zkbeat.DatabaseScheduler``: django-celery-beat's schedule under zkbeat's leadership.

    celery -A proj beat --scheduler zkbeat.DatabaseScheduler

The schedule lives in django-celery-beat's tables, where operators edit it in
the Django admin; which ticks ran lives in zkbeat's ledger in ZooKeeper.
django-celery-beat's own scheduler assumes it is the only beat, and a small
schedule. Five of its habits would hurt with N replicas or many rows, and
this module changes exactly those:

* Its ``setup_schedule()`` upserts ``beat_schedule`` into the tables on every
  replica at start-up. Here a replica does that once it leads, right after
  its first pass, so that it never delays a takeover's first publish.
* Its ``schedule`` property may query the database on every access, and it
  reads and rebuilds every enabled row whenever anything changed and every
  five minutes. Here a follower sends no query at all; the leader reads the
  tables when it takes over, then only what changed: django-celery-beat's
  change tracking (``PeriodicTasks``) tells it something did, and the rows
  are compared with what it built (zkbeat.contrib._table), with a full
  comparison every ``FULL_RELOAD_INTERVAL`` for rows written around it.
* It writes ``last_run_at`` when it syncs, every few minutes and at exit,
  with two queries per row. Here only the leader syncs, many rows a
  statement (zkbeat.contrib._runs), and a replica that stops leading drops
  what it had pending, so it never writes its stale view over a newer
  leader's. At exit it hands over first and writes after, only to rows
  whose own run is older (``sync_at_close``): the successor never waits
  for that write. After a failover the rows may be minutes behind, so the ledger
  decides each entry's last run, unless the row itself vouches for one at
  least as new (a one-off an operator re-armed after it ran: see
  ``ModelEntry.vouched_run``).
* ``ModelEntry.__next__`` advances the row object in place, so the entry being
  published and its successor share one row: a claim that did not commit
  would still count a run (and so disable a one-off). Here each successor
  gets its own copy of the row.
* Beat's heap asks every entry its clock to place it, and compares the whole
  schedule with its last copy on every pass. Here interval rows are placed
  by arithmetic (zkbeat.contrib._heap), and the heap follows each change.
  Within a pass, an interval row's ``is_due()`` and heap time come from one
  reading of the clock for the pass, not from django-celery-beat's clock
  (a time-zone conversion) two or three times per row published.

Rows written around the admin (raw SQL, ``QuerySet.update``) can hold what
django-celery-beat cannot load or save: an unknown time zone, arguments that
are not JSON, two schedule types. Each is logged once and left out, and the
other tasks run (zkbeat.contrib._rows says how each is found).

Only the leader writes the rows, and only what django-celery-beat itself
would write; those writes are not fenced by ZooKeeper (the publishes are), so
the ledger, never the database, is what decides whether a tick ran.
"""

from __future__ import annotations

import contextlib
import functools
import heapq
import itertools
import logging
import math
import time
from collections.abc import Callable, Iterator
from datetime import datetime
from typing import Any

from celery import beat, schedules
from celery.utils.time import maybe_make_aware
from django.db import DataError, IntegrityError, close_old_connections, connections, router, transaction
from django.db import Error as DatabaseError
from django.db.transaction import TransactionManagementError
from django.utils.timezone import now as django_now
from django_celery_beat import schedulers
from django_celery_beat.models import IntervalSchedule, PeriodicTask, PeriodicTasks
from django_celery_beat.utils import NEVER_CHECK_TIMEOUT
from kazoo.protocol.states import KazooState

from .._collector import no_collection
from ..coordination.election import Fence
from ..coordination.shards import entry_shard
from ..leading.leadership import ZOOKEEPER_ERRORS
from ..leading.shard_state import ShardState
from ..leading.term import SIGNAL_HOLD_LIMIT, as_entry_time
from ..ledger.store import EntryState
from ..scheduler import LeaderScheduleMixin
from . import _rows
from ._heap import Placer
from ._runs import RunTimesNotWritten, write_run_times
from ._table import Changes, TaskTable

__all__ = ["DatabaseScheduler", "ModelEntry", "keeps_own_run", "row_source", "copy_row"]

logger = logging.getLogger(__name__)

#: Seconds between full reads of the tables (every column of every enabled
#: row, compared with what was built; only what differs is built again): the
#: safety net for rows written without django-celery-beat's change marker
#: (raw SQL, ``QuerySet.update``). django-celery-beat's own interval for its
#: full re-read (``SCHEDULE_SYNC_MAX_INTERVAL``), five minutes.
FULL_RELOAD_INTERVAL = getattr(schedulers, "SCHEDULE_SYNC_MAX_INTERVAL", 300)
#: Seconds each chunk (1,000 rows) of the write of run times after the handover may take (on PostgreSQL:
#: zkbeat.contrib._runs): a database slower than that is taken to hang. The process's exit waits for the
#: write, and the rows are only what the admin shows: the ledger decides what runs.
LATE_WRITE_CHUNK_TIMEOUT = 5.0
#: Seconds of close()'s signal hold the late write leaves unused (its connection is cut a second past its time);
#: a write that makes progress has the rest (at 100,000 rows it takes seconds).
LATE_WRITE_MARGIN = 2.0


class ModelEntry(schedulers.ModelEntry):
    """A django-celery-beat entry whose run state is its row's own.

    ``last_run_at`` and ``total_run_count`` read and write the row object,
    so what the ledger merges in is what ``is_due`` sees (a one-off checks
    the row's count), what ``__next__`` advances and what ``save`` writes.
    """

    #: The leader gave it the run it had under its old name (a rename it saw, :meth:`DatabaseScheduler._carry_run`):
    #: its own run is then its newest, whatever the ledger holds under its new name (another row's).
    run_carried: bool = False

    def __init__(self, model: PeriodicTask, app: Any = None) -> None:
        self.model = model  # the properties below need it before the base class assigns them
        #: The row's last run as read, before django-celery-beat fills in a
        #: default for rows that never ran (None then).
        self.row_last_run_at: datetime | None = model.last_run_at
        #: The row's run count as read: above 0 with no ``last_run_at``, it ran and was disabled since.
        self.row_total_run_count: int = model.total_run_count or 0
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
        # entry intact for a retry if its claim does not commit. The rest of
        # the entry (schedule, arguments, options) is the row's and is shared,
        # not built again from the row (three JSON documents) on every publish.
        model = copy_row(self.model)
        model.last_run_at = self._default_now()
        model.total_run_count += 1
        model.no_changes = True
        successor = self.__copy__()
        successor.model = model
        successor.row_last_run_at = model.last_run_at
        return successor

    def __copy__(self) -> ModelEntry:
        # ScheduleEntry's __reduce__ rebuilds from its own constructor's
        # arguments, which a ModelEntry does not take; a shallow copy shares the row.
        clone = self.__class__.__new__(self.__class__)
        clone.__dict__.update(self.__dict__)
        return clone

    def is_due(self) -> schedules.schedstate:
        """django-celery-beat's; a one-off that ran is disabled by a write of its run fields, not ``save()``.

        Its own writes the whole row from this copy (read when the leader last
        read the row): an operator's edit made since is undone, and a row
        deleted since is inserted again.
        """
        model = self.model
        if model.one_off and model.enabled and model.total_run_count > 0:
            # Written first: if the write fails, the entry is asked again (zkbeat.leading.heap_pass) and tries again.
            self._write_disabled(model, total_run_count=0)
            PeriodicTasks.update_changed()
            model.enabled = False
            model.total_run_count = 0
            model.last_run_at = None  # what save() does to a disabled row
            model.no_changes = False
            return schedules.schedstate(False, NEVER_CHECK_TIMEOUT)
        return super().is_due()

    def _disable(self, model: PeriodicTask) -> None:
        """django-celery-beat's (an expired row): disabled without a change signal, by a write of its run fields."""
        self._write_disabled(model)
        model.no_changes = True
        model.enabled = False
        model.last_run_at = None

    @staticmethod
    def _write_disabled(model: PeriodicTask, **fields: Any) -> None:
        """Disable the row (if it is still there) as ``save()`` would, without writing its other columns.

        ``date_changed`` moves, as with ``save()``: a row enabled again by a
        ``QuerySet.update()`` (an admin action) is then a changed row.
        """
        type(model)._default_manager.filter(pk=model.pk).update(
            enabled=False, last_run_at=None, date_changed=django_now(), **fields
        )

    def vouched_run(self) -> datetime | None:
        """The newest run the row itself vouches for, weighed against the ledger's.

        That is the row's own ``last_run_at``. A one-off that never ran also
        vouches for its last change: an operator who deletes a one-off and
        creates it again under the same name expects it to run, although the
        ledger remembers its namesake's run. (A periodic task in that case
        keeps the ledger's older run and is caught up once.) So does a row
        that ran and was disabled with ``save()`` (which clears its
        ``last_run_at``, not its count), then enabled again: it goes on from
        then, as with django-celery-beat alone, and the ticks that fell while
        it was disabled are not caught up. (One disabled before its first run
        was written to it holds no count, and is caught up once.)
        """
        if self.row_last_run_at is not None:
            return self.row_last_run_at
        if self.model.one_off or self.row_total_run_count > 0:
            return self.model.date_changed
        return None


def row_source(entry: beat.ScheduleEntry) -> str | None:
    """The row an entry was built from, as its runs record it in the ledger: ``<id>@<date_changed>``.

    ``date_changed`` moves with every ``save()`` (an admin edit, a rename, a disable, an enable) and with
    zkbeat's own disable of a one-off that ran, never with a write of run times: the same text means the
    same row, unchanged since. None for an entry that is not a row's.
    """
    model = getattr(entry, "model", None) if isinstance(entry, ModelEntry) else None
    if model is None or model.pk is None:
        return None
    changed = model.__dict__.get("date_changed")
    return f"{model.pk}@{changed.isoformat() if isinstance(changed, datetime) else ''}"


def keeps_own_run(entry: beat.ScheduleEntry, state: EntryState) -> bool:
    """Keep the row's last run over the ledger's ``state``, the run recorded under the row's name?

    The ledger knows a task by its name, and records which row each run was of (:func:`row_source`):

    ===================================  ==========================================================
    the ledger's run was of              the entry keeps
    ===================================  ==========================================================
    this row, unchanged since            the ledger's run (a one-off that ran and whose leader died
                                         before disabling it is disabled, whatever its clock said)
    another row, and this one is a       its own: the newest of its row's run and the run it had
    rename the leader saw (two rows      under its old name (``run_carried``)
    that traded names)
    another row, and this one a one-off  its own: a one-off created again runs once
    this row, changed since, a one-off   its own: an operator re-armed it (or edited it, below)
    anything else: another row (a        the newer of the two runs (``vouched_run``): a row renamed
    periodic task created again, a row   before this leader read it may have run under its old
    renamed before this leader read      name since its row was last written, which only the
    it), this row changed since, not     ledger's record of that name holds
    said (an earlier release)
    ===================================  ==========================================================

    Only the last row compares times: a row's ``date_changed`` is stamped by the clock of the host that
    saved it (an admin host's), the ledger's runs by the leaders'. The leader's rule
    (``DatabaseScheduler.keeps_own_run``), and the admin's when it says when a row runs next
    (zkbeat.contrib.admin).
    """
    if not isinstance(entry, ModelEntry):
        return False
    recorded = state.source
    if recorded is not None:
        own = row_source(entry)
        if own is not None:
            if recorded == own:
                return False
            if recorded.partition("@")[0] != own.partition("@")[0]:
                if entry.run_carried or entry.model.one_off:
                    return entry.vouched_run() is not None
            elif entry.model.one_off:
                return True
    vouched = entry.vouched_run()
    return vouched is not None and maybe_make_aware(vouched) >= state.last_run_at


class DatabaseScheduler(LeaderScheduleMixin, schedulers.DatabaseScheduler):
    """django-celery-beat's DatabaseScheduler with zkbeat's leadership and ledger.

    ``celery -A proj beat --scheduler zkbeat.DatabaseScheduler``
    """

    Entry = ModelEntry
    #: Which task names this replica builds and runs (None: every row). Rows
    #: of other names are read as ids only and never held as entries.
    entry_filter: Callable[[str], bool] | None = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._host_set_up = False  # beat_schedule upserted (once, while leading)
        self._full_read_due = True
        self._read_again = False
        self._full_read_at = -math.inf
        self._database_failing = False
        self._loaded = False  # a read of the tables succeeded since leading began
        #: The candidate this replica led under when a read of the tables last succeeded.
        self._read_under: Fence | None = None
        #: The schedule last read, set aside at a takeover under another candidate until a read succeeds.
        self._aside: dict[str, ModelEntry] | None = None
        self._one_offs_run: set[str] = set()  # one-off tasks published this pass
        #: Rows (ids) the database refused to update (:meth:`sync`): written one at a time, apart from the rest.
        self._refused_rows: set[int] = set()
        self._ties = itertools.count()  # heap priorities (zkbeat.contrib._heap)
        self._complaints = _rows.Complaints(logger)  # bad rows, each logged once
        self._table = TaskTable(self.Model, wanted=self.entry_filter)
        #: With shards: the shards whose rows this replica builds and holds (led, or being taken over).
        self._held_shards: set[int] = set()
        #: With shards: each held shard's candidate when a read of the tables last succeeded.
        self._shard_read_under: dict[int, Fence] = {}
        #: With shards: the held shards whose rows loaded since their leadership began.
        self._loaded_shards: set[int] = set()
        #: The pass's answers for plain interval rows (see :meth:`is_due`), and the pass clock reading they are of.
        self._pass_placer: tuple[Any, Placer] | None = None
        super().__init__(*args, **kwargs)
        if self.sharded:
            self._table.wanted = self._wants
        clock = _interval_clock()
        if clock is not None:
            self.pass_clock.real_clocks.add(clock)

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
        """A new leader starts from the tables as they are now (a full read, no write).

        It publishes only from a schedule read while it leads under this
        candidate. One read under an earlier candidate is set aside until a
        read succeeds (see :meth:`_take_back`): another leader may have led
        in between, and rows may have been disabled, deleted or changed since.
        A term begun again under the same candidate (a ZooKeeper connection
        blip the session survived: nobody else can have led meanwhile) goes
        on with the schedule it holds, and leads on it while reads fail, as
        within a term. With shards the same holds for each shard's rows
        (:meth:`_begin_shard`).
        """
        if self.sharded:
            self._begin_shard()
            return
        self._full_read_due = True
        self._loaded = False
        if self._aside is None and self._read_under != self._fence():
            self._aside, self._schedule = self._schedule or {}, {}
        try:
            self._read(full=True)
        except DatabaseError as exc:
            self._database_failed(exc)

    def on_leadership_end(self) -> None:
        if self.sharded:
            index = self._shard.index
            mine = {name for name in self._dirty if self._shard_number(name) == index}
            if mine:
                logger.info(
                    "zkbeat: not leading shard %d/%d: dropping unsynced run times of %s",
                    index, self._shard.count, _names(mine),
                )  # fmt: skip
            self._dirty -= mine
            self._loaded_shards.discard(index)
            return
        if self._dirty:
            logger.info("zkbeat: not leading: dropping unsynced run times of %s", _names(self._dirty))
        self._dirty.clear()
        self._full_read_due = True
        self._loaded = False

    def _fence(self) -> Fence | None:
        """The candidate this replica leads under (the term's, or the one a term is beginning under)."""
        if self.term is not None:
            return self.term.fence
        return self.election.leadership if self.election is not None else None

    def _take_back(self) -> dict[str, ModelEntry] | None:
        """A full read succeeded: the schedule set aside becomes the schedule again, for the read to update.

        The table's marks are of the rows it was built from, so the read
        builds again only what changed since, as within a term; once it is
        applied, every entry takes the run the term read from the ledger as
        it began and reads its ledger state again before its next claim
        (``schedule_replaced``), and the heap is rebuilt. Returns it, to be
        set aside again if applying the read fails.
        """
        aside, self._aside = self._aside, None
        if aside is not None:
            self._schedule = aside  # schedule_replaced() once the read is applied to it (_read)
        return aside

    def schedule_loaded(self) -> bool:
        """False until a read of the tables succeeds (each time leading begins), and again after one fails.

        With shards: the current shard's rows (each shard's leadership begins on its own).
        """
        if self.sharded:
            return self._shard.index in self._loaded_shards and not self._database_failing
        return self._loaded and not self._database_failing

    def schedule_readable(self) -> bool:
        """Whether the database answers now: a read of the change marker and of one row's key.

        Asked every few seconds of a replica that said it cannot lead (its
        schedule did not load as leader): it leads nothing, so no read of
        the schedule would tell it the database is back.
        """
        try:
            close_old_connections()
            self.Changes.last_change()
            list(self.Model.objects.values_list("pk", flat=True)[:1])
        except DatabaseError as exc:
            logger.debug("zkbeat: the database cannot be read yet: %r", exc)
            return False
        return True

    # -- shards --------------------------------------------------------------
    #
    # With zkbeat_shards = N, this replica holds the rows of the shards it
    # leads (or is taking over), and nothing else: the table marks every
    # enabled row but builds only those (``_wants``). One read serves every
    # shard held, once per pass of beat's loop, before the shards' parts of
    # the pass (``tick``); a shard whose leadership begins while a read of
    # this pass already covered it under its candidate reads nothing more.

    def _shard_number(self, name: str) -> int:
        """The shard of row ``name`` (zkbeat.coordination.shards.entry_shard, worked out once per name)."""
        return entry_shard(self.zk_settings.hosts, self.zk_settings.root, name, len(self._shards))

    def _wants(self, name: str) -> bool:
        """Whether row ``name`` is built: a shard held here, and the class's own ``entry_filter``."""
        if self.entry_filter is not None and not self.entry_filter(name):
            return False
        return self._shard_number(name) in self._held_shards

    @staticmethod
    def _fence_of(shard: ShardState) -> Fence | None:
        """The candidate ``shard`` is led under now (its election's), else its term's (a connection suspended)."""
        fence = shard.election.leadership if shard.election is not None else None
        if fence is None and shard.term is not None:
            fence = shard.term.fence
        return fence

    def _follow_shards(self) -> None:
        """Before a pass: hold the rows of each shard now led here, drop those of each shard no longer led.

        A shard led under another candidate than its rows were read under
        (a step-down, a lost session) is read afresh, as a takeover is. A
        shard whose leadership went while the connection is not back is
        kept for now: a blip the session survives leads on with it.
        """
        client = self.zk_client
        connected = client is not None and client.state == KazooState.CONNECTED
        for shard in self._shards:
            index = shard.index
            fence = self._fence_of(shard)
            if fence is None:
                if index in self._held_shards and connected:
                    self._release_shard(index)
            elif index not in self._held_shards:
                self._hold_shard(index)
            elif self._shard_read_under.get(index, fence) != fence:
                self._release_shard(index)
                self._hold_shard(index)

    def _hold_shard(self, index: int) -> None:
        """Build shard ``index``'s rows from the next read (a full one: a takeover's)."""
        self._held_shards.add(index)
        self._table.forget(lambda name: self._shard_number(name) == index)
        self._full_read_due = True

    def _release_shard(self, index: int) -> None:
        """Drop shard ``index``'s entries and unsynced run times (this replica no longer leads it)."""
        self._held_shards.discard(index)
        self._shard_read_under.pop(index, None)
        self._loaded_shards.discard(index)
        schedule = self.schedule
        names = [name for name in schedule if self._shard_number(name) == index]
        for name in names:
            del schedule[name]
        self._dirty.difference_update(names)
        logger.info(
            "zkbeat: not leading shard %d/%d: dropped its %d entries; holding %d entries%s",
            index, len(self._shards), len(names), len(schedule), self._held_label(),
        )  # fmt: skip

    def _held_label(self) -> str:
        held = sorted(self._held_shards)
        if not held:
            return " (no shard)"
        return f" of shards {', '.join(map(str, held))} of {len(self._shards)}"

    def _begin_shard(self) -> None:
        """The current shard's leadership begins: its rows as read under this candidate, else read now.

        Read in this pass already (``tick`` reads for every shard about to
        be led), or before a blip the session survived: it goes on with
        them. Otherwise its rows are built from a full read now; if that
        fails the shard is not loaded, and steps aside after
        ``zkbeat_stall_timeout`` (even under the same candidate: it holds
        nothing to lead on).
        """
        index = self._shard.index
        fence = self._fence()
        self._loaded_shards.discard(index)
        if index in self._held_shards and self._shard_read_under.get(index) == fence:
            self._loaded_shards.add(index)
            return
        if self._shard_read_under.get(index) is not None:
            self._release_shard(index)  # read under another candidate: set aside, as a takeover does
        self._hold_shard(index)
        try:
            self._read(full=True)
        except DatabaseError as exc:
            self._database_failed(exc)
            self._unloaded_since = time.monotonic()

    def _leads_shard(self, shard: ShardState) -> bool:
        with self.shard_current(shard):
            return self.leading

    def entries_replaced(self, names: Any, added: Any = ()) -> None:
        """The mixin's, for every shard's term (one read serves them all)."""
        if not self.sharded:
            super().entries_replaced(names, added)
            return
        names = list(names)
        for shard in self._shards:
            if shard.term is not None:
                with self.shard_current(shard):
                    super().entries_replaced(names, added)

    def keeps_own_run(self, entry: beat.ScheduleEntry, state: EntryState) -> bool:
        """The module's :func:`keeps_own_run`: the ledger's run unless it was another row's, or the row's newer."""
        return keeps_own_run(entry, state)

    def entry_source(self, entry: beat.ScheduleEntry) -> str | None:
        """The row (its id and ``date_changed``) each run of ``entry`` records in the ledger (:func:`row_source`)."""
        return row_source(entry)

    # -- the loop ----------------------------------------------------------

    def tick(self, *args: Any, **kwargs: Any) -> float:
        if self.sharded:
            # Once per pass, for every shard held: not once per shard (the mixin
            # runs this method again for each shard's part of the pass).
            if not self._in_shard_pass and not self.closed:
                self._follow_shards()
                if self._held_shards:
                    with self.leader_pass():
                        self._refresh()
            return super().tick(*args, **kwargs)
        if self.leading:
            with self.leader_pass():  # a hung query here is a hung leader too
                self._refresh()
        return super().tick(*args, **kwargs)

    def after_leader_pass(self, interval: float) -> float:
        """After each pass, the one-offs it ran are disabled; after the first, beat_schedule goes into the tables.

        The upsert (django-celery-beat's own setup) is deferred from the
        takeover to here so that it never delays the first publish, and done
        before the loop waits, so that the entries it adds run at once.
        """
        ran, self._one_offs_run = self._one_offs_run, set()
        if not self.leading:
            return interval
        if ran:
            # django-celery-beat disables a one-off the next time it asks it
            # is_due() after its run (the heap would not ask it again): now.
            self._requeue(ran & self.schedule.keys())
        if self._host_set_up:
            return interval
        try:
            self._upsert_beat_schedule()
            self._read(full=False)
        except DatabaseError as exc:
            self._database_failed(exc)
            return interval
        return 0

    def _upsert_beat_schedule(self) -> None:
        """django-celery-beat's setup_schedule: default entries and beat_schedule into the tables.

        It also puts what it wrote into the schedule, behind the heap's and
        the ledger's back; here it writes into a scratch schedule, and the
        read that follows takes the rows it changed like any other edit.
        """
        live, self._schedule = self._schedule, {}
        try:
            schedulers.DatabaseScheduler.setup_schedule(self)
        finally:
            self._schedule = live
        self._host_set_up = True

    def _refresh(self) -> None:
        """Once per pass while leading: pick up changes to the tables, write run times when due."""
        try:
            if self._full_read_due or time.monotonic() - self._full_read_at >= FULL_RELOAD_INTERVAL:
                self._read(full=True)
            elif self._read_again or self.schedule_changed():
                self._read(full=False)
            elif self._dirty and beat.Scheduler.should_sync(self):
                self._do_sync()
        except DatabaseError as exc:
            self._database_failed(exc)

    def _database_failed(self, exc: DatabaseError) -> None:
        """Keep the schedule last read and read again at the next pass; say so once per outage."""
        self._read_again = True
        if not self._database_failing:
            self._database_failing = True
            logger.error(
                "zkbeat: cannot read the schedule from the database (%r); keeping the last one read, "
                "trying again on every pass",
                exc,
            )

    def schedule_changed(self) -> bool:
        """Whether django-celery-beat's change marker moved since the last read.

        Compared by value, not "newer than": the marker is stamped by the
        writer's clock, which may be behind the last writer's.
        """
        close_old_connections()
        with contextlib.suppress(TransactionManagementError):
            transaction.commit()  # MySQL's repeatable read: see other commits (as django-celery-beat does)
        return self.Changes.last_change() != self._last_timestamp

    def _read(self, full: bool) -> None:
        """Read the tables (zkbeat.contrib._table), build what changed, drop what went."""
        started = time.monotonic()
        full = full or self._aside is not None  # a quick read finds only what changed since the set-aside schedule
        close_old_connections()
        marker = self.Changes.last_change()  # before the rows: a change after it is seen next time
        with no_collection():  # a read builds 100,000 entries: no full collection walking them meanwhile
            changes = self._table.read(full)
            self.leader_progressed()  # a takeover's read of 100,000 rows is a long pass, not a hung one
            replaced = changes.gone | changes.unloadable.keys() | {model.name for model in changes.rows}
            aside = self._take_back()
            built = {model.name for model in changes.rows}
            # Of the entries held (the table also names rows it marked and never built: another shard's).
            dropped = len({name for name in changes.gone if name in self.schedule} - built)
            try:
                if self._dirty & replaced:
                    self.sync()  # what we ran reaches the rows of the entries about to be rebuilt
                self._apply(changes)
                if aside is not None:
                    # After the rows the read built: they, too, take the runs the term read from the ledger.
                    self.schedule_replaced()
            except BaseException:
                if aside is not None:  # not brought up to date: set aside again, nothing published from it
                    self._aside, self._schedule = self._schedule, {}
                    self.invalidate_heap()
                raise
            self._table.commit(changes)
            self.leader_progressed()
        self._last_timestamp = marker
        self._read_again = not changes.complete
        self._loaded = True
        self._read_under = self._fence()
        for shard in self._shards if self.sharded else ():
            fence = self._fence_of(shard) if shard.index in self._held_shards else None
            if fence is not None:
                self._shard_read_under[shard.index] = fence
                self._loaded_shards.add(shard.index)
        if full:
            self._full_read_due = False
            self._full_read_at = time.monotonic()
        if self._database_failing:
            self._database_failing = False
            logger.info("zkbeat: reading the schedule from the database again")
        level = logging.INFO if replaced else logging.DEBUG
        logger.log(
            level,
            "zkbeat: %s read of the schedule: %d enabled rows, %d read whole, %d entries built, %d dropped (%.1f ms)",
            "full" if full else "quick",
            changes.enabled,
            changes.fetched,
            len(changes.rows),
            dropped,
            (time.monotonic() - started) * 1000,
        )
        if self.sharded:
            logger.log(level, "zkbeat: holding %d entries%s", len(self.schedule), self._held_label())

    def _apply(self, changes: Changes) -> None:
        """Put what a read found into the schedule, beat's heap and the term, leaving bad rows out."""
        schedule = self.schedule
        complaints = self._complaints
        touched: set[str] = set()
        carried = self._runs_under_old_names(changes)  # before the old names' entries are dropped
        for name in changes.gone:
            complaints.forget(name)
            if schedule.pop(name, None) is not None:
                # Only an entry held: a row never built (another shard's, or left out) is on no heap,
                # and no term need read its ledger state again.
                touched.add(name)
        for name, (pk, why) in changes.unloadable.items():
            schedule.pop(name, None)
            complaints.recheck(name)
            complaints.say(
                name, why, "zkbeat: leaving out periodic task %r: its crontab schedule #%s has a time zone "
                "that cannot be loaded: %s", name, pk, why,
            )  # fmt: skip
            touched.add(name)
        tasks = self.app.tasks
        # Rows new to a schedule already read under this leadership (enabled again, created again): they keep their
        # own run (Term.replaced). Not so the rows of a first read that comes after the term began (its read at the
        # takeover failed): they take the ledger's, as those of a read before it do in its merge.
        added: set[str] = set()
        with _obvious_json():
            for model in changes.rows:
                complaints.recheck(model.name)
                entry = self._entry(model, tasks)
                if entry is None:
                    schedule.pop(model.name, None)
                else:
                    if model.name not in schedule and self._held_loaded(model.name):
                        added.add(model.name)
                    run = carried.get(model.name)
                    if run is not None:
                        self._carry_run(entry, *run)
                    schedule[model.name] = entry
                touched.add(model.name)
        for row in complaints.rows():
            if row.startswith("crontab #"):
                complaints.recheck(row)
        for pk, why in sorted(changes.unused_zones.items()):
            complaints.say(
                f"crontab #{pk}", why, "zkbeat: crontab schedule #%s has a time zone that cannot be loaded: %s "
                "(no enabled task uses it)", pk, why, level=logging.WARNING,
            )  # fmt: skip
        complaints.settle()
        self._dirty &= schedule.keys()
        if touched:
            # The rebuilt entries carry the rows' run times, which may be behind
            # the ledger: the term reads the ledger for each before its next claim.
            self.entries_replaced(touched, added)
            self._requeue(touched)

    def _held_loaded(self, name: str) -> bool:
        """Whether the rows of row ``name``'s shard (or every row, without shards) were read under this leadership."""
        return self._shard_number(name) in self._loaded_shards if self.sharded else self._loaded

    def _runs_under_old_names(self, changes: Changes) -> dict[str, tuple[datetime, int]]:
        """The last run each renamed row had under its old name: the entry held here, else the ledger's record.

        The ledger knows a task by its name, and a row renamed in the admin
        is the same row: the run it just had under its old name is its last
        run, which its ``last_run_at`` may not hold yet (written at the sync
        interval). Without it, the row would run again at once under its new
        name (the tick it just ran). Only rows this replica had marked under
        their old name are known to be renamed (not a row renamed before its
        first read here).
        """
        built = {model.name for model in changes.rows}
        renamed = {new: old for new, old in changes.renamed.items() if new in built}
        runs: dict[str, tuple[datetime, int]] = {}
        for new, old in renamed.items():
            entry = self.schedule.get(old)
            if entry is not None:
                runs[new] = (entry.last_run_at, entry.total_run_count)
        if not renamed or self.ledger is None:
            return runs
        # The ledger too: another shard's leader ran the row until now, or another leader led since this one
        # held the entry (a schedule set aside at a takeover).
        try:
            records = self.ledger.load(list(renamed.values()))
        except ZOOKEEPER_ERRORS as exc:
            logger.warning(
                "zkbeat: cannot read the ledger's runs of renamed rows (%r); %s go by what this replica holds",
                exc, _names(set(renamed)),
            )  # fmt: skip
            return runs
        for new, old in renamed.items():
            record = records.get(old)
            state = record.state if record is not None else None
            if state is not None and (new not in runs or _newer(state.last_run_at, runs[new][0])):
                runs[new] = (state.last_run_at, state.total_run_count)
            if state is not None and state.paused is not None:
                # A pause is of a name (zkbeat.ledger.controls), as `zkbeat resume NAME` finds it: it is not moved.
                logger.warning(
                    "zkbeat: periodic task %r, paused (by %s: %s), is now named %r: the pause stays with the name "
                    "%r and %r runs; pause %r to hold it",
                    old, state.paused.by, state.paused.note or "no note", new, old, new, new,
                )  # fmt: skip
        return runs

    def _carry_run(self, entry: ModelEntry, last_run_at: datetime, total_run_count: int) -> None:
        """Give a renamed row's entry the run it had under its old name, if newer than its own; its row gets it too."""
        try:
            # An aware time (the ledger's) in the entry's zone, as the term sets it; a naive one (a row's, without
            # USE_TZ) as the row holds it.
            moment = last_run_at if last_run_at.tzinfo is None else as_entry_time(entry, last_run_at)
            entry.run_carried = True  # its own run is now its newest: not the ledger's under its new name
            if not _newer(moment, entry.last_run_at):
                return
        except Exception:  # noqa: BLE001 - the entry's clock: asked again when it is planned, left out if it raises
            return
        entry.last_run_at = moment
        entry.row_last_run_at = moment  # what the row vouches for (keeps_own_run), written at the next sync
        entry.total_run_count = total_run_count
        self._dirty.add(entry.name)

    def _entry(self, model: PeriodicTask, tasks: Any) -> ModelEntry | None:
        """The row as an entry; None (logged once) if it cannot be one."""
        why = _rows.unfit(model)
        if why is not None:
            self._complaints.say(model.name, why, "zkbeat: leaving out periodic task %r: %s", model.name, why)
            return None
        try:
            entry = self.Entry(model, app=self.app)
        except DatabaseError:
            raise
        except Exception as exc:  # noqa: BLE001 - one bad row must not stop the rest
            why = _rows.reason(exc)
            self._complaints.say(
                model.name, why, "zkbeat: leaving out periodic task %r: it cannot be scheduled: %r", model.name, exc
            )
            return None
        if model.task not in tasks:
            # Said once per task name, not per row: 100,000 rows may share one.
            self._complaints.say(
                f"task {model.task}",
                "unregistered",
                "zkbeat: periodic task %r runs task %r, which this app has not registered; "
                "it is sent by name, as celery beat does (said once for all the rows that run it)",
                model.name,
                model.task,
                level=logging.WARNING,
            )
        return entry

    def all_as_schedule(self) -> dict[str, ModelEntry]:
        """Every enabled task as an entry (django-celery-beat's API): the schedule after a full read."""
        self._read(full=True)
        return dict(self.schedule)

    # -- beat's heap -------------------------------------------------------

    def populate_heap(self, *args: Any, **kwargs: Any) -> None:
        """Celery's heap of every entry, placed by arithmetic where it can be (zkbeat.contrib._heap)."""
        placer = Placer(self, ModelEntry, self._ties)
        entries = self.schedule.values()
        if self.sharded:
            entries = [entry for entry in entries if self.in_shard(entry.name)]  # the current shard's
        heap = [placer.event(entry) for entry in entries]
        heapq.heapify(heap)
        self._heap = heap
        self.leader_progressed()

    def _requeue(self, names: set[str]) -> None:
        """Put these entries (as rebuilt, or not at all if dropped) on beat's heap, the others left in place.

        With shards, on each shard's heap, the entries of that shard.
        """
        if self.sharded:
            for shard in self._shards:
                if shard._heap is not None:
                    with self.shard_current(shard):
                        self._requeue_here(names)
            return
        self._requeue_here(names)

    def _requeue_here(self, names: set[str]) -> None:
        heap = self._heap
        if heap is None:
            return  # built from the schedule at the next pass
        placer = Placer(self, ModelEntry, self._ties)
        kept = [event for event in heap if event[2].name not in names]
        schedule = self.schedule
        sharded = self.sharded
        kept += [
            placer.event(schedule[name]) for name in names if name in schedule and (not sharded or self.in_shard(name))
        ]
        heapq.heapify(kept)
        self._heap = kept

    def is_due(self, entry: beat.ScheduleEntry) -> Any:
        """django-celery-beat's ``is_due()``; within a pass, a plain interval row's from the pass's reading.

        Its own asks Django's clock for every row (zkbeat.contrib._heap
        computes the same answer from one reading of the schedules' clock
        per pass): a row that is disabled, starts or expires, or runs once is
        asked itself, as is every other schedule.
        """
        reading = self.pass_clock.now()
        if reading is not None:
            pass_placer = self._pass_placer
            if pass_placer is None or pass_placer[0] is not reading:
                pass_placer = self._pass_placer = (reading, Placer(self, ModelEntry, self._ties))
            remaining = pass_placer[1].due_in(entry)
            if remaining is not None:
                # Answered from the pass's reading, not the row's own clock: its wait goes on the heap from that
                # reading (zkbeat.leading.heap_pass _push), not from the later moment the pass asked this row.
                self.answered_from_reading(entry)
                return (
                    schedules.schedstate(False, remaining)
                    if remaining
                    else schedules.schedstate(True, entry.schedule.seconds)
                )
        return entry.is_due()

    def schedules_equal(self, *args: Any, **kwargs: Any) -> bool:
        # Beat compares the whole schedule with its last copy on every pass to
        # see whether to rebuild the heap: 100,000 comparisons. This scheduler
        # changes its schedule only in _apply, which puts the change on the
        # heap itself (or drops the heap), so there is nothing to compare.
        return True

    # -- writing run times -------------------------------------------------

    def reserve(self, entry: beat.ScheduleEntry) -> beat.ScheduleEntry:
        """django-celery-beat's: the successor, its row marked to sync; a one-off is noted for after the pass."""
        successor = super().reserve(entry)
        if isinstance(successor, ModelEntry) and successor.model.one_off:
            self._one_offs_run.add(successor.name)
        return successor

    def should_sync(self) -> bool:
        # Celery asks inside apply_async, in the middle of a batch whose
        # shutdown signals are held; _refresh syncs at the top of the next
        # pass instead. (reserve(), django-celery-beat's own, marks each
        # advanced entry dirty; a claim that did not commit puts the
        # unadvanced entry back, whose row then holds the previous run.)
        return False

    def sync(self) -> None:
        """Write run times to the rows, only while leading, many rows a statement (at exit: :meth:`sync_at_close`).

        ``last_run_at`` and ``total_run_count`` of each row that ran and is
        still enabled, as django-celery-beat writes them, without a read of
        the row first (zkbeat.contrib._runs). A row deleted since is skipped.
        """
        names, runs = self._runs_to_write()
        if not names:
            return
        close_old_connections()
        refused = self._refused_rows
        together = [run for run in runs if run[0] not in refused]
        try:
            write_run_times(self.Model, together)
        except DatabaseError as exc:
            if not _one_rows(exc):
                logger.error("zkbeat: cannot write run times to the database (%r); retrying at the next sync", exc)
                return
            # One row the database refuses (a constraint it breaks, a value it cannot hold) fails the statement of
            # every row with it: the rows are written in halves, and halves of the half that fails, to tell which.
            half = len(together) // 2
            split = [together[:half], together[half:]] if len(together) > 1 else [together]
        else:
            split = []
        split += [[run] for run in runs if run[0] in refused]  # each refused row alone, once a sync
        schedule = self.schedule
        named = {schedule[name].model.pk: name for name in names if name in schedule}
        if not all(self._write_halving(part, named) for part in split if part):
            return
        self._dirty.difference_update(names)

    def _write_halving(self, runs: list[tuple[int, datetime, int]], named: dict[int, str]) -> bool:
        """Write these rows' run times; if the database refuses the statement, each half of them, down to the row
        it refuses, which is named once and left for later syncs (a few statements for one row among thousands,
        not one a row).

        False if the database cannot be reached (nothing more tried: retried at the next sync).
        """
        try:
            write_run_times(self.Model, runs)
        except DatabaseError as exc:
            if not _one_rows(exc):
                logger.error("zkbeat: cannot write run times to the database (%r); retrying at the next sync", exc)
                return False
            if len(runs) > 1:
                half = len(runs) // 2
                return self._write_halving(runs[:half], named) and self._write_halving(runs[half:], named)
            pk = runs[0][0]
            if pk not in self._refused_rows:
                self._refused_rows.add(pk)
                logger.error(
                    "zkbeat: the database refuses to write the run times of periodic task %r (#%s): %s; the "
                    "other rows' are written without it (the ledger holds its runs)",
                    named.get(pk, "?"), pk, exc.reason if isinstance(exc, RunTimesNotWritten) else exc,
                )  # fmt: skip
            return True
        self._refused_rows.difference_update(run[0] for run in runs)
        return True

    def sync_at_close(self) -> Callable[[], None] | None:
        """At exit: take what :meth:`sync` would write now, and write it once the successor is free to lead.

        At 100,000 rows that write takes seconds, which a graceful handover
        would wait for. Written after it, it may meet rows the successor has
        run and written since: it leaves every row whose ``last_run_at`` is
        as new or newer (``only_newer``), so that it never lowers one. A
        failure costs only these display values: the ledger holds the runs.
        """
        names, runs = self._runs_to_write()
        self._dirty.difference_update(names)  # taken: not "dropped" when the terms end in the handover
        runs = [run for run in runs if run[0] not in self._refused_rows]  # would fail its chunk, and those after
        if not runs:
            return None
        return functools.partial(self._write_after_handover, runs)

    def _write_after_handover(self, runs: list[tuple[int, datetime, int]]) -> None:
        """The write :meth:`sync_at_close` deferred, bounded: the process's exit waits for it.

        Each chunk has LATE_WRITE_CHUNK_TIMEOUT, the write what is left of close()'s signal hold.
        """
        started = time.monotonic()
        left = self.shutdown_hold_left()
        timeout = (SIGNAL_HOLD_LIMIT if left is None else left) - LATE_WRITE_MARGIN
        connection = connections[router.db_for_write(self.Model)]
        if connection.vendor == "postgresql":
            # Opened again within the write's bound (zkbeat.contrib._time_limit): after a failed query,
            # close_old_connections() would first check this one with a query that nothing bounds.
            connection.close()
        close_old_connections()
        try:
            if timeout <= 0:
                raise RunTimesNotWritten(len(runs), len(runs), TimeoutError("no time left of the shutdown hold"), True)
            write_run_times(self.Model, runs, only_newer=True, timeout=timeout, stall=LATE_WRITE_CHUNK_TIMEOUT)
        except RunTimesNotWritten as exc:
            logger.log(
                logging.WARNING if exc.timed_out else logging.ERROR,
                "zkbeat: cannot write run times to the database after handing over: %d of %d rows keep their "
                "earlier run times (%s); the ledger holds the runs",
                exc.left,
                exc.total,
                (
                    f"not done in time ({LATE_WRITE_CHUNK_TIMEOUT:g} s a chunk, {max(timeout, 0):.1f} s in all): "
                    f"{exc.reason}"
                )
                if exc.timed_out
                else repr(exc.cause),
            )
            return
        logger.info(
            "zkbeat: wrote the run times of %d rows after handing over (%.1f ms)",
            len(runs), (time.monotonic() - started) * 1000,
        )  # fmt: skip

    def _runs_to_write(self) -> tuple[set[str], list[tuple[int, datetime, int]]]:
        """The dirty rows of what this replica leads (with shards, of the shards it leads), and their run times."""
        if self.sharded:
            led = {shard.index for shard in self._shards if self._leads_shard(shard)}
            names = {name for name in self._dirty if self._shard_number(name) in led}
        else:
            names = set(self._dirty) if self.leading else set()
        schedule = self.schedule
        runs = []
        for name in sorted(names):
            entry = schedule.get(name)
            if entry is not None and entry.model.pk is not None:
                runs.append((entry.model.pk, entry.model.last_run_at, entry.model.total_run_count))
        return names, runs


@contextlib.contextmanager
def _obvious_json() -> Iterator[None]:
    """While entries are built: django-celery-beat's JSON parser skipped for ``[]`` and ``{}``.

    Its ModelEntry parses a row's args, kwargs and headers with kombu's
    ``loads``, which makes a new JSON decoder per call: a third of building
    an entry, on texts that nearly every row holds as ``[]`` or ``{}``. The
    result is the same (a new list or dict each time); any other text is
    parsed as before. Only this loop's thread builds entries.
    """
    real = getattr(schedulers, "loads", None)
    if real is None:
        yield
        return

    def loads(text: Any, *args: Any, **kwargs: Any) -> Any:
        if text == "[]":
            return []
        if text == "{}":
            return {}
        return real(text, *args, **kwargs)

    schedulers.loads = loads
    try:
        yield
    finally:
        schedulers.loads = real


def _interval_clock() -> Any:
    """The code of django-celery-beat's interval schedules' clock (Django's now, made aware): it reads the real time."""
    nowfun = IntervalSchedule(every=1, period=IntervalSchedule.SECONDS).schedule.nowfun
    return getattr(nowfun, "__code__", None)


def copy_row(model: PeriodicTask) -> PeriodicTask:
    """A shallow copy of a row object (its own run fields and model state), as ``copy.copy`` makes it, faster."""
    clone = model.__class__.__new__(model.__class__)
    clone.__dict__.update(model.__getstate__())
    return clone


def _one_rows(exc: BaseException) -> bool:
    """Whether a failed write may be one row's fault: a constraint it breaks, a value it cannot hold.

    Anything else (the connection down, a timeout, a read-only database, a trigger or a grant that refuses
    every row) refuses the whole write: retried at the next sync, not split down to every row.
    """
    cause = exc.cause if isinstance(exc, RunTimesNotWritten) else exc
    return isinstance(cause, (IntegrityError, DataError))


def _newer(moment: datetime, than: datetime) -> bool:
    """Whether ``moment`` is later than ``than`` (either naive: taken as UTC, as Celery takes it)."""
    try:
        return maybe_make_aware(moment) > maybe_make_aware(than)
    except (TypeError, ValueError):
        return False


def _names(names: set[str], shown: int = 20) -> str:
    """Some names of a set that may hold 100,000."""
    listed = ", ".join(sorted(names)[:shown])
    return listed if len(names) <= shown else f"{listed} and {len(names) - shown} more"

"""The leader's copy of django-celery-beat's tables, and which rows changed since it last looked.

django-celery-beat reads every enabled row again whenever anything changed
and every five minutes besides, and builds an entry (a schedule object,
three JSON documents) for each. With 100,000 rows that is a minute of a
core per admin edit. Here each read compares what the tables hold with
what was last built, by value, and returns only the rows to build again:

==============================  =================================================  ===========================
read                            queries                                            finds
==============================  =================================================  ===========================
quick (the change marker,       (id, date_changed, schedule ids) of every          admin edits (``save()``),
``PeriodicTasks``, moved)       enabled row; every schedule row; then every        deletes, disables and
                                column of the new or changed rows only             enables (also by
                                                                                   ``QuerySet.update``),
                                                                                   schedule rows edited
full (leading starts; every     every column of every enabled row; every           anything, even a row
``FULL_RELOAD_INTERVAL``)       schedule row                                       written by raw SQL or
                                                                                   ``QuerySet.update`` without
                                                                                   the marker
==============================  =================================================  ===========================

Rows are compared by value, never against a high-water mark of
``date_changed``: that is stamped by the writer's clock before its commit,
so a row committed late, or by a host whose clock is behind, would sort
before a mark already passed. A row disabled or deleted is one that is no
longer among the enabled ids; schedule rows (an interval, a crontab) have
no ``date_changed`` and are compared whole, so an edit to a shared interval
rebuilds the tasks on it. The run fields (``last_run_at``,
``total_run_count``) are left out of the comparison: they are the leader's
own writes, and the ledger, not the row, decides them.

Tasks are read before schedules: a task can only point to a schedule row
that was committed before it, so every schedule a task of the read needs
is in the same read. One that is not (the schedule was deleted since, and
the task with it by cascade) is left out and the read is reported
incomplete, so that the scheduler reads again at its next pass.

Each read builds the model objects itself from the rows it read (one query
for marks and models, so the two cannot disagree), with every schedule
attached: building an entry from them sends no query.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from django.db.models import CharField, Model
from django.db.models.base import ModelState
from django.db.models.functions import Cast
from django.db.models.signals import post_init, pre_init
from django_celery_beat.models import ClockedSchedule, CrontabSchedule, IntervalSchedule, PeriodicTask, SolarSchedule

from ._rows import ZoneCheck

__all__ = ["Changes", "TaskTable"]

#: The schedule tables a task row points to, in the order of its foreign keys.
SCHEDULES: tuple[tuple[str, type[Model]], ...] = (
    ("interval", IntervalSchedule),
    ("crontab", CrontabSchedule),
    ("solar", SolarSchedule),
    ("clocked", ClockedSchedule),
)
#: Columns the leader itself writes (zkbeat.contrib._runs), left out of the comparison.
RUN_FIELDS = ("last_run_at", "total_run_count")
#: Ids per ``id IN (...)`` when fetching the changed rows.
FETCH_CHUNK = 500
#: Past this share of the enabled rows changed, a quick read fetches every row instead.
FETCH_ALL_SHARE = 0.25

#: A schedule row: (index into SCHEDULES, primary key).
ScheduleKey = tuple[int, int]


@dataclass(frozen=True, slots=True)
class Mark:
    """What the last read built one enabled task row from."""

    name: str
    quick: int  # hash of (date_changed, schedule ids)
    full: int  # hash of every column but the run fields
    schedules: tuple[ScheduleKey, ...]


@dataclass
class Changes:
    """What a read found; :meth:`TaskTable.commit` makes it the table's new state."""

    full: bool
    #: New or changed rows to build entries from, schedules attached (only wanted names).
    rows: list[Any] = field(default_factory=list)
    #: Names to drop: rows deleted, disabled, renamed away or not wanted.
    gone: set[str] = field(default_factory=set)
    #: New name -> old name of each row read under another name than it was marked with (the same id).
    renamed: dict[str, str] = field(default_factory=dict)
    #: Task name -> (crontab pk, why its time zone cannot be loaded): left out.
    unloadable: dict[str, tuple[int, str]] = field(default_factory=dict)
    #: Crontab pk -> why its time zone cannot be loaded, for those no enabled task uses.
    unused_zones: dict[int, str] = field(default_factory=dict)
    #: False: a row changed under the read; read again soon.
    complete: bool = True
    #: Enabled task rows read (all of them, by id).
    enabled: int = 0
    #: Task rows fetched whole.
    fetched: int = 0
    _marks: dict[int, Mark | None] = field(default_factory=dict, repr=False)
    _schedules: dict[ScheduleKey, int] = field(default_factory=dict, repr=False)


class TaskTable:
    """The leader's marks of django-celery-beat's enabled rows; see the module docstring.

    ``wanted`` (a predicate on task names) restricts what is built: a row
    whose name it refuses is marked but never built, so a leader of part
    of the schedule holds only that part.
    """

    def __init__(self, model: type[Model] = PeriodicTask, wanted: Callable[[str], bool] | None = None) -> None:
        self.model = model
        self.wanted = wanted
        self.fields = tuple(f.attname for f in model._meta.concrete_fields)
        self._id = self.fields.index("id")
        self._name = self.fields.index("name")
        self._date = self.fields.index("date_changed")
        self._keys = tuple(self.fields.index(f"{kind}_id") for kind, _ in SCHEDULES)
        self._relations = tuple(model._meta.get_field(kind) for kind, _ in SCHEDULES)
        # The run fields are the leader's own writes (the ledger decides them): a row
        # whose run times were synced is not a changed row.
        self._compared = operator.itemgetter(*(i for i, name in enumerate(self.fields) if name not in RUN_FIELDS))
        self.quick_fields = ("id", "date_changed", *(f"{kind}_id" for kind, _ in SCHEDULES))
        self.zones = ZoneCheck()
        self.marks: dict[int, Mark] = {}
        self.schedules: dict[ScheduleKey, int] = {}
        self._plain: bool | None = None  # rows made without Django's constructor (see _instance)
        self._db = ""

    def clear(self) -> None:
        """Forget every mark: the next read builds every row."""
        self.marks = {}
        self.schedules = {}
        self._plain = None

    def names(self) -> set[str]:
        return {mark.name for mark in self.marks.values()}

    def forget(self, names: Callable[[str], bool]) -> None:
        """Forget the marks of the rows whose name ``names`` accepts: the next read builds them (if wanted).

        For a ``wanted`` that has grown (a shard this replica now leads): its
        rows were marked while unwanted and never built.
        """
        self.marks = {pk: mark for pk, mark in self.marks.items() if not names(mark.name)}

    # -- reading -----------------------------------------------------------

    def read(self, full: bool) -> Changes:
        """Read the tables (quick or full, see the module docstring); nothing changes until :meth:`commit`."""
        changes = Changes(full=full)
        enabled = self.model._default_manager.filter(enabled=True)
        if full:
            rows = {row[self._id]: row for row in enabled.values_list(*self.fields)}
            present: dict[int, tuple] = rows
            quick = None
        else:
            quick = {row[0]: row[1:] for row in enabled.values_list(*self.quick_fields)}
            present = quick
            rows = {}
        schedules = _Schedules(self.zones)
        touched = {key for key, digest in schedules.digests.items() if self.schedules.get(key) != digest}
        touched |= self.schedules.keys() - schedules.digests.keys()
        changes.enabled = len(present)

        wanted_ids = []
        for pk in present:
            mark = self.marks.get(pk)
            if mark is None or any(key in touched for key in mark.schedules):
                wanted_ids.append(pk)
            elif full and mark.full != hash(self._compared(rows[pk])):
                wanted_ids.append(pk)
            elif quick is not None and mark.quick != hash(quick[pk]):
                wanted_ids.append(pk)
        if quick is not None and wanted_ids:
            rows = self._fetch(enabled, wanted_ids, len(quick))
        changes.fetched = len(rows) if quick is not None else len(present)

        for pk in self.marks.keys() - present.keys():
            changes.gone.add(self.marks[pk].name)
            changes._marks[pk] = None
        for pk in wanted_ids:
            self._build(pk, rows.get(pk), schedules, changes)
        changes._schedules = schedules.digests
        changes.unused_zones = self._unused_zones(schedules, changes)
        return changes

    def _fetch(self, enabled: Any, ids: list[int], total: int) -> dict[int, tuple]:
        """Every column of these rows (of all rows, when most of them changed)."""
        if len(ids) > FETCH_ALL_SHARE * total:
            wanted = set(ids)
            return {row[self._id]: row for row in enabled.values_list(*self.fields) if row[self._id] in wanted}
        rows = {}
        for start in range(0, len(ids), FETCH_CHUNK):
            chunk = ids[start : start + FETCH_CHUNK]
            rows.update((row[self._id], row) for row in enabled.filter(id__in=chunk).values_list(*self.fields))
        return rows

    def _build(self, pk: int, row: tuple | None, schedules: _Schedules, changes: Changes) -> None:
        """Mark one new or changed row and, if it can be built and is wanted, add its model to ``changes``."""
        old = self.marks.get(pk)
        if row is None:  # disabled or deleted since its id was read
            changes._marks[pk] = None
            if old is not None:
                changes.gone.add(old.name)
            return
        name = row[self._name]
        if old is not None and old.name != name:
            changes.gone.add(old.name)
            changes.renamed[name] = old.name
        keys = tuple((index, row[column]) for index, column in enumerate(self._keys) if row[column] is not None)
        if any(key not in schedules.digests for key in keys):
            # Its schedule row is gone since (deleted, and the task with it) or newer than the read.
            changes._marks[pk] = None
            changes.gone.add(name)
            changes.complete = False
            return
        quick = (row[self._date], *(row[column] for column in self._keys))
        changes._marks[pk] = Mark(name, hash(quick), hash(self._compared(row)), keys)
        if self.wanted is not None and not self.wanted(name):
            changes.gone.add(name)
            return
        zone = next(((key[1], schedules.unloadable[key]) for key in keys if key in schedules.unloadable), None)
        if zone is not None:
            changes.unloadable[name] = zone
            return
        model = self._instance(row)
        for key in keys:
            self._relations[key[0]].set_cached_value(model, schedules.instance(key, SCHEDULES[key[0]][1]))
        changes.rows.append(model)

    def _instance(self, row: tuple) -> Any:
        """The row as a model object, as the ORM would make it (``Model.from_db``), only cheaper.

        Django's constructor sets each of the 23 fields through its
        descriptor and sends ``pre_init``/``post_init``: a third of a
        takeover's read. Without receivers for the model, the fields go
        straight into the object's ``__dict__``, which is where the
        constructor puts them; with any, the constructor runs.
        """
        model = self.model
        if self._plain is None:
            self._plain = not (pre_init.has_listeners(model) or post_init.has_listeners(model))
            self._db = model._default_manager.db
        if not self._plain:
            return model.from_db(self._db, self.fields, row)
        made = model.__new__(model)
        made.__dict__.update(zip(self.fields, row))
        state = made._state = ModelState()
        state.adding = False
        state.db = self._db
        return made

    def _unused_zones(self, schedules: _Schedules, changes: Changes) -> dict[int, str]:
        """Crontab rows whose time zone cannot be loaded and that no enabled task uses."""
        if not schedules.unloadable:
            return {}
        marks = {**self.marks, **changes._marks}
        used = {key for mark in marks.values() if mark is not None for key in mark.schedules}
        return {key[1]: why for key, why in schedules.unloadable.items() if key not in used}

    def commit(self, changes: Changes) -> None:
        """Make what ``changes`` found the table's state (after the scheduler applied it)."""
        for pk, mark in changes._marks.items():
            if mark is None:
                self.marks.pop(pk, None)
            else:
                self.marks[pk] = mark
        self.schedules = changes._schedules


class _Schedules:
    """Every schedule row, read whole: a digest per row, and model objects made on demand.

    A crontab's time zone is read as text and loaded once per distinct
    value (zkbeat.contrib._rows.ZoneCheck): one unknown zone must not fail
    the read of every other row.
    """

    def __init__(self, zones: ZoneCheck) -> None:
        self.zones = zones
        self.digests: dict[ScheduleKey, int] = {}
        self.unloadable: dict[ScheduleKey, str] = {}
        self._rows: dict[ScheduleKey, tuple] = {}
        self._made: dict[ScheduleKey, Any] = {}
        self._fields: dict[int, tuple[str, ...]] = {}
        self._zone_at: int | None = None
        for index, (_, model) in enumerate(SCHEDULES):
            fields = tuple(f.attname for f in model._meta.concrete_fields)
            self._fields[index] = fields
            query = model._default_manager.all()
            columns: list[Any] = list(fields)
            if model is CrontabSchedule:
                self._zone_at = fields.index("timezone")
                columns[self._zone_at] = "zkbeat_zone"
                query = query.annotate(zkbeat_zone=Cast("timezone", CharField()))
            pk_at = fields.index("id")
            for row in query.values_list(*columns):
                key = (index, row[pk_at])
                self.digests[key] = hash(row)
                self._rows[key] = row
                if model is CrontabSchedule:
                    problem = zones.problem(row[self._zone_at])
                    if problem is not None:
                        self.unloadable[key] = problem

    def instance(self, key: ScheduleKey, model: type[Model]) -> Any:
        """The schedule row as a model object (one per row and read: tasks on it share it)."""
        made = self._made.get(key)
        if made is None:
            values = list(self._rows[key])
            if model is CrontabSchedule and self._zone_at is not None:
                values[self._zone_at] = self.zones.zone(values[self._zone_at])
            made = self._made[key] = model.from_db(model._default_manager.db, self._fields[key[0]], values)
        return made

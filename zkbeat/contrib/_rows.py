"""Which django-celery-beat rows cannot be scheduled, and saying so once per row.

Rows written around the admin (raw SQL, ``QuerySet.update``, a script)
skip every check the admin makes, and django-celery-beat trusts them: a
crontab row whose time zone is unknown fails every query that loads it
(even the time-zone list behind its crontab pre-filter), and a row its own
``save()`` refuses fails every sync. Each such row is found here before it
can fail a whole read or write, so that the scheduler can leave it out and
run the rest.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

from django.core.exceptions import ValidationError
from django.db.models import CharField
from django.db.models.functions import Cast
from django_celery_beat.models import CrontabSchedule, PeriodicTask
from kombu.utils.json import loads

__all__ = ["Complaints", "crontab_zones", "reason", "unfit", "write_fields"]

#: The JSON fields of a task row and the type django-celery-beat needs each to be.
JSON_FIELDS = (("args", list, "a list"), ("kwargs", dict, "an object"), ("headers", dict, "an object"))


def reason(exc: BaseException) -> str:
    """What an error says, without ValidationError's list brackets or repeats."""
    if isinstance(exc, ValidationError):
        return "; ".join(dict.fromkeys(exc.messages))
    return str(exc) or repr(exc)


def crontab_zones() -> tuple[set[str], dict[int, str]]:
    """The time zones of all crontab rows that load, and why each other row does not.

    The column is read as text, so that no row's value goes through the
    time-zone field on the way (that is what raises); each distinct value is
    then loaded exactly as the field would load it.
    """
    field = CrontabSchedule._meta.get_field("timezone")
    rows = CrontabSchedule.objects.annotate(zkbeat_zone=Cast("timezone", CharField())).values_list("pk", "zkbeat_zone")
    verdicts: dict[str, str | None] = {}
    known: set[str] = set()
    unknown: dict[int, str] = {}
    for pk, zone in rows:
        if zone not in verdicts:
            verdicts[zone] = _zone_problem(field, zone)
        problem = verdicts[zone]
        if problem is None:
            known.add(zone)
        else:
            unknown[pk] = problem
    return known, unknown


def _zone_problem(field: Any, zone: str | None) -> str | None:
    try:
        if field.to_python(zone) is None:
            return "no time zone is set"
    except Exception as exc:  # noqa: BLE001 - zoneinfo raises ValueError as well as ValidationError
        return reason(exc)
    return None


def unfit(model: PeriodicTask) -> str | None:
    """Why django-celery-beat could not schedule or save this row; None if it can.

    The JSON fields must parse to the types the message needs (Celery would
    otherwise refuse it on every tick), and the row must pass the checks
    ``PeriodicTask.save()`` makes (one schedule type, clocked only as a
    one-off, not both ``expires`` and ``expire_seconds``), or its first sync
    would fail. The uniqueness checks are skipped: they query, and the
    database enforces them anyway.
    """
    for field, kind, wanted in JSON_FIELDS:
        text = getattr(model, field)
        if not text:
            continue  # django-celery-beat reads an empty field as [] or {}
        try:
            value = loads(text)
        except ValueError as exc:
            return f"{field} is not JSON ({exc})"
        if not isinstance(value, kind):
            return f"{field} is JSON {type(value).__name__} where {wanted} is needed"
    try:
        model._clean_expires()
        model.validate_unique(exclude={f.name for f in model._meta.fields})
    except ValidationError as exc:
        return reason(exc)
    return None


def write_fields(model: PeriodicTask, fields: Iterable[str]) -> None:
    """Write only these fields of the row, bypassing the checks of ``save()`` that it fails."""
    type(model)._default_manager.filter(pk=model.pk).update(**{field: getattr(model, field) for field in fields})


class Complaints:
    """Logs what is wrong with a row once, not on every pass, until the row is fine again.

    Keyed by row and reason: a row that turns bad in another way is news.
    """

    def __init__(self, logger: logging.Logger) -> None:
        self._logger = logger
        self._said: set[tuple[str, str]] = set()
        self._seen: set[tuple[str, str]] = set()

    def say(self, row: str, why: str, message: str, *args: Any, level: int = logging.ERROR) -> None:
        """Log ``message % args`` unless this row was already reported for this reason."""
        key = (row, why)
        self._seen.add(key)
        if key not in self._said:
            self._said.add(key)
            self._logger.log(level, message, *args)

    def begin_read(self) -> None:
        """A full read of the schedule starts: what it does not find again was fixed."""
        self._seen = set()

    def end_read(self) -> None:
        self._said &= self._seen

"""Which django-celery-beat rows cannot be scheduled, and saying so once per row.

Rows written around the admin (raw SQL, ``QuerySet.update``, a script)
skip every check the admin makes, and django-celery-beat trusts them: a
crontab row whose time zone is unknown fails every query that loads it,
and a row that breaks the model's rules would be scheduled by guesswork
(two schedule types: whichever django-celery-beat looks at first). Each
such row is found here before it can fail a whole read, so that the
scheduler can leave it out and run the rest.

The checks run on every row a read builds (100,000 at a takeover), so the
common case is cheap: ``[]`` and ``{}`` need no JSON parser, and a time zone
is loaded once per distinct name.
"""

from __future__ import annotations

import functools
import logging
from typing import Any

from django.core.exceptions import ValidationError
from django_celery_beat.models import CrontabSchedule, PeriodicTask
from kombu.utils.json import loads

__all__ = ["Complaints", "ZoneCheck", "reason", "unfit"]

#: The JSON fields of a task row and the type django-celery-beat needs each to be.
JSON_FIELDS = (("args", list, "a list"), ("kwargs", dict, "an object"), ("headers", dict, "an object"))
#: The schedule a task row points to: django-celery-beat allows exactly one.
SCHEDULE_FIELDS = ("interval_id", "crontab_id", "solar_id", "clocked_id")
#: What the JSON texts nearly every row holds parse to, without parsing them.
_OBVIOUS = {"": None, "[]": list, "{}": dict}


def reason(exc: BaseException) -> str:
    """What an error says, without ValidationError's list brackets or repeats."""
    if isinstance(exc, ValidationError):
        return "; ".join(dict.fromkeys(exc.messages))
    return str(exc) or repr(exc)


class ZoneCheck:
    """Whether a crontab row's time zone loads, decided once per distinct value.

    The column is read as text (zkbeat.contrib._table), so that no row's
    value goes through the time-zone field on the way (that is what raises);
    each distinct value is then loaded exactly as the field would load it.
    """

    def __init__(self) -> None:
        self.field = CrontabSchedule._meta.get_field("timezone")
        self._problems: dict[str | None, str | None] = {}
        self._zones: dict[str | None, Any] = {}

    def problem(self, zone: str | None) -> str | None:
        """Why this time zone cannot be loaded; None if it can."""
        if zone not in self._problems:
            self._problems[zone] = self._load(zone)
        return self._problems[zone]

    def zone(self, zone: str | None) -> Any:
        """The time-zone object the field makes of this text (only for a value without a problem)."""
        return self._zones[zone]

    def _load(self, zone: str | None) -> str | None:
        try:
            loaded = self.field.to_python(zone)
        except Exception as exc:  # noqa: BLE001 - zoneinfo raises ValueError as well as ValidationError
            return reason(exc)
        if loaded is None:
            return "no time zone is set"
        self._zones[zone] = loaded
        return None


def unfit(model: PeriodicTask) -> str | None:
    """Why django-celery-beat could not schedule this row as written; None if it can.

    The JSON fields must parse to the types the message needs (Celery would
    otherwise refuse it on every tick, and django-celery-beat disables a row
    whose arguments do not parse, writing the operator's row). The row must
    follow the model's rules that ``PeriodicTask.save()`` enforces: exactly
    one schedule type, a clocked schedule only as a one-off, not both
    ``expires`` and ``expire_seconds``.
    """
    for field, kind, wanted in JSON_FIELDS:
        found = _json_type(getattr(model, field))
        if isinstance(found, str) and found.startswith("!"):
            return f"{field} is not JSON ({found[1:]})"
        if found is not None and found is not kind:
            return f"{field} is JSON {found.__name__} where {wanted} is needed"
    loaded = model.__dict__  # every field is loaded: the descriptors' way there costs a third of this check
    chosen = [
        field[: -len("_id")]
        for field in SCHEDULE_FIELDS
        if (loaded[field] if field in loaded else getattr(model, field)) is not None
    ]
    if not chosen:
        return "one of clocked, interval, crontab or solar must be set"
    if len(chosen) > 1:
        return f"only one of clocked, interval, crontab or solar may be set, not {' and '.join(chosen)}"
    if chosen == ["clocked"] and not model.one_off:
        return "a clocked schedule must be a one-off task"
    try:
        model._clean_expires()
    except ValidationError as exc:
        return reason(exc)
    return None


def _json_type(text: str | None) -> type | str | None:
    """The type a JSON text parses to, ``"!why"`` if it does not parse, None for an empty field."""
    if not text or text in _OBVIOUS:
        return _OBVIOUS.get(text or "")
    return _parsed_type(text)


@functools.lru_cache(maxsize=4096)
def _parsed_type(text: str) -> type | str:
    try:
        return type(loads(text))
    except ValueError as exc:
        return f"!{exc}"


class Complaints:
    """Logs what is wrong with a row once, not on every read, until the row is fine again.

    Keyed by row and reason: a row that turns bad in another way is news. A
    row read again is put under :meth:`recheck`; what is not said of it again
    before :meth:`settle` was fixed, and is news again if it comes back.
    """

    def __init__(self, logger: logging.Logger) -> None:
        self._logger = logger
        self._said: dict[str, set[str]] = {}
        self._unconfirmed: set[tuple[str, str]] = set()

    def say(self, row: str, why: str, message: str, *args: Any, level: int = logging.ERROR) -> None:
        """Log ``message % args`` unless this row was already reported for this reason."""
        said = self._said.setdefault(row, set())
        self._unconfirmed.discard((row, why))
        if why not in said:
            said.add(why)
            self._logger.log(level, message, *args)

    def recheck(self, row: str) -> None:
        """The row is being read again: what was said of it holds only if it is said again."""
        said = self._said.get(row)
        if said:
            self._unconfirmed.update((row, why) for why in said)

    def forget(self, row: str) -> None:
        """The row is gone (deleted, disabled): nothing said of it holds."""
        self._said.pop(row, None)

    def rows(self) -> list[str]:
        """Every row something is said of now."""
        return [row for row, said in self._said.items() if said]

    def settle(self) -> None:
        """What was not said again since its row's recheck was fixed."""
        for row, why in self._unconfirmed:
            said = self._said.get(row)
            if said is not None:
                said.discard(why)
                if not said:
                    del self._said[row]
        self._unconfirmed = set()

"""Jitter: publish each tick a little after its slot, at a moment every replica agrees on.

Every Celery install fires its crontabs at second 0 of the minute. With
``zkbeat_jitter`` (or an entry's ``options={'zkbeat_jitter': J}``) a tick
planned for ``slot`` is published at ``slot + offset``, the offset in
``[0, J)`` taken from a hash of (root, entry, slot). Nothing random: every
replica, and every leader after a failover, computes the same moment for
the same slot. The slot itself does not move: headers, task id and the
ledger keep the nominal one.

A J that is not below the entry's period (an interval's length, a crontab's
gap from this slot to its next) would let one tick be published after the
next one is due: the entry then runs without jitter, and the log says so once.
"""

from __future__ import annotations

import hashlib
import logging
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING

from celery import beat

from ..conf import ENTRY_JITTER_OPTION, parse_jitter
from ..exceptions import ConfigurationError
from .ticks import slot_after, tick_slot

if TYPE_CHECKING:
    from .policy import Policies

__all__ = ["offset", "jitter_for", "Jitter"]

logger = logging.getLogger(__name__)

#: Bits of the digest that make the fraction (a float holds 53 exactly).
_BITS = 53


def offset(root: str, name: str, slot: datetime, jitter: float) -> float:
    """Seconds in ``[0, jitter)`` after ``slot`` at which entry ``name`` of ``root`` publishes it."""
    if jitter <= 0:
        return 0.0
    stamp = slot.astimezone(timezone.utc).isoformat()
    digest = hashlib.sha256(f"zkbeat-jitter\0{root}\0{name}\0{stamp}".encode()).digest()
    fraction = (int.from_bytes(digest[:8], "big") >> (64 - _BITS)) / (1 << _BITS)
    return fraction * jitter


def jitter_for(entry: beat.ScheduleEntry, default: float) -> tuple[float, str | None]:
    """The entry's jitter (its option, or its headers' for a django-celery-beat row) or ``default``.

    Returns the seconds and, for an option that is not a valid jitter, the
    error to log (``default`` is used then).
    """
    options = entry.options or {}
    headers = options.get("headers") if isinstance(options.get("headers"), dict) else {}
    if ENTRY_JITTER_OPTION in options:
        where, value = "options", options[ENTRY_JITTER_OPTION]
    elif ENTRY_JITTER_OPTION in headers:
        where, value = "headers", headers[ENTRY_JITTER_OPTION]
    else:
        return default, None
    try:
        return parse_jitter(f"{entry.name}.{where}.{ENTRY_JITTER_OPTION}", value), None
    except ConfigurationError as exc:
        return default, f"{exc}; using zkbeat_jitter ({default:g}) instead"


class Jitter:
    """The jitter of a scheduler's entries: offsets, and each bad option logged once per entry.

    Used from beat's loop only (not thread-safe, and needs not be).
    """

    def __init__(self, root: str, default: float, policies: Policies | None = None) -> None:
        self.root = root
        self.default = default
        #: Each entry's parsed options (zkbeat.ticking.policy), if the scheduler keeps them.
        self.policies = policies
        #: The last complaint logged for each entry, so it is logged once.
        self._logged: dict[str, str] = {}

    def offset_for(self, entry: beat.ScheduleEntry, slot: datetime) -> float:
        """Seconds after ``slot`` at which ``entry`` publishes it; 0 when its jitter is off or too long."""
        if self.policies is not None:
            policy = self.policies.of(entry)
            jitter, complaint = policy.jitter, policy.jitter_complaint
        else:
            jitter, complaint = jitter_for(entry, self.default)
        if jitter <= 0:
            self._complain(entry.name, complaint)
            return 0.0
        period = (slot_after(entry, slot) - slot).total_seconds()
        if jitter >= period:
            complaint = (
                f"{entry.name}: zkbeat_jitter of {jitter:g}s is not below its period of {period:g}s; "
                "it runs without jitter"
            )
            jitter = 0.0
        self._complain(entry.name, complaint)
        return offset(self.root, entry.name, slot, jitter)

    def wait(self, entry: beat.ScheduleEntry, now: datetime | None = None) -> float:
        """Seconds until the jittered moment of the entry's due tick; 0 (or less) when it may go now."""
        if self.policies is not None:
            policy = self.policies.of(entry)
            if policy.jitter <= 0 and policy.jitter_complaint is None:
                return 0.0  # jitter off: no need to ask the schedule
        elif self.default <= 0 and ENTRY_JITTER_OPTION not in _options_and_headers(entry):
            return 0.0  # jitter off: no need to ask the schedule
        try:
            slot = tick_slot(entry)
            moment = slot + timedelta(seconds=self.offset_for(entry, slot))
        except Exception:  # noqa: BLE001 - an entry whose clock fails runs unjittered; its errors are logged elsewhere
            return 0.0
        return (moment - (now or datetime.now(timezone.utc))).total_seconds()

    def _complain(self, name: str, complaint: str | None) -> None:
        if complaint is not None and self._logged.get(name) != complaint:
            self._logged[name] = complaint
            logger.warning("zkbeat: %s", complaint)


def _options_and_headers(entry: beat.ScheduleEntry) -> set:
    options = entry.options or {}
    headers = options.get("headers") if isinstance(options.get("headers"), dict) else {}
    return set(options) | set(headers)

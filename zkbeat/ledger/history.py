"""An entry's recent runs: a short list kept in its own ledger znode.

Each publish the leader claims adds one :class:`Run` to the entry's ledger
state (``recent``, newest first, at most :data:`RECENT_RUNS`, fewer with
``zkbeat_recent_runs``), in the same
fenced transaction that records the run itself: no ZooKeeper write of its
own, and it moves with the ledger across failovers. A run-now adds a run of
kind ``manual``; a skipped tick, a paused entry's tick and a withdrawn claim
add none (nothing was published).

ZooKeeper is not a history store: it holds every znode in every server's
memory and writes each change to its log. So the list is bounded: at most
:data:`RECENT_RUNS` runs (times in whole milliseconds, the replica's
identity cut to :data:`MAX_REPLICA` characters): about 67 bytes a run with
an identity like ``worker-3.example.com:4242``, 0.7 KB per entry; at most
:data:`MAX_RUN_BYTES` a run (an identity of 64 characters that JSON writes
as escapes), :data:`MAX_RECENT_BYTES` (8.4 KB) per entry. The longer
history is where each run ends up anyway: the workers' result backend and
logs (each message carries the ``zkbeat-entry``, ``zkbeat-slot`` and
``zkbeat-epoch`` headers), and the replicas' metrics.

A run is recorded by its claim, before its publish: a leader killed between
the two (at most one batch of ticks, never sent again) or a tick whose
unconfirmed claim a later leader found too late to publish stays in the
list as run, as it stays in the ledger as the entry's last run.

A release that does not know ``recent`` ignores it when it reads the entry,
and its claim rewrites the entry without it: the list starts again from the
next claim of a release that keeps it. A list zkbeat cannot read (bad data
in ZooKeeper) is logged and read as empty; the entry's state is kept.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from datetime import datetime, timedelta, timezone
from functools import partial
from typing import Any, NamedTuple

from celery import beat

from .._decode import brief
from ..conf import MAX_RECENT_RUNS
from ..ticking.ticks import slot_after

__all__ = [
    "RECENT_RUNS",
    "MAX_REPLICA",
    "MAX_RUN_BYTES",
    "MAX_RECENT_BYTES",
    "KINDS",
    "Run",
    "cut_identity",
    "kind_of",
    "add_run",
    "encoded_bytes",
    "encode_runs",
    "decode_runs",
    "shown",
]

logger = logging.getLogger(__name__)

#: Most runs kept per entry, newest first (``zkbeat_recent_runs`` may keep fewer).
RECENT_RUNS = MAX_RECENT_RUNS
#: Characters of the replica's identity kept with a run (a longer one is cut, ending in "…").
MAX_REPLICA = 64
#: An encoded run's bytes besides its replica's characters: brackets, the slot (15 digits at
#: most), the lateness (16 with its sign), the replica's quotes, an epoch of up to 10 digits,
#: the quoted kind (11 at most), and the ", " between fields and runs.
_FIXED_RUN_BYTES = 1 + 15 + 2 + 16 + 2 + 2 + 2 + 10 + 2 + 11 + 1 + 2
#: Largest encoded run: JSON writes a character of the replica as at most 12 bytes (an escaped
#: surrogate pair).
MAX_RUN_BYTES = _FIXED_RUN_BYTES + 12 * MAX_REPLICA
#: The most ``recent`` adds to an entry's ledger record: its key and RECENT_RUNS of the largest runs.
MAX_RECENT_BYTES = len(', "recent": []') + RECENT_RUNS * MAX_RUN_BYTES
#: What a run was: a tick on time, a run-now, or a tick published after its next slot had come
#: (missed: a failover, an outage, a pause).
KINDS = ("scheduled", "manual", "catch-up")
#: Seconds late below which a tick is not checked for being a catch-up: no period is that short
#: in practice, and the check costs a slot computation (about a millisecond for a crontab).
_CATCH_UP_CHECK = 1.0
#: Milliseconds from the Unix epoch to the end of year 9999: later than any time a datetime holds.
_LAST_MS = 253402300800000


_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
_MS = timedelta(milliseconds=1)


def _ms(value: datetime) -> int:
    """Milliseconds since the Unix epoch (UTC; a naive time is taken as UTC), as the encoding keeps it."""
    if value.tzinfo is None:
        value = value.replace(tzinfo=timezone.utc)
    return (value - _EPOCH) // _MS


def cut_identity(identity: str) -> str:
    """A replica's identity as a run keeps it (at most MAX_REPLICA characters)."""
    return identity if len(identity) <= MAX_REPLICA else identity[: MAX_REPLICA - 1] + "…"


class Run(NamedTuple):
    """One publish of an entry, as its claim recorded it: the five values of its JSON list.

    Whole numbers of milliseconds rather than ISO text: half the bytes, and a
    leader taking over parses every entry's runs with its ledger (the
    datetimes are made only when shown: :attr:`slot`, :attr:`at`).
    """

    #: The tick's due time (for a run-now, when it was requested), in milliseconds since the Unix epoch.
    slot_ms: int
    #: Its claim (just before its publish, by the leader's clock) minus its slot, in milliseconds.
    late_ms: int
    #: The identity of the replica that claimed it (zkbeat_identity, cut to MAX_REPLICA).
    replica: str
    #: The epoch it led under.
    epoch: int
    #: One of KINDS.
    kind: str

    @classmethod
    def of(cls, slot: datetime, at: datetime, replica: str, epoch: int, kind: str) -> Run:
        """A run as it is kept (and read back): times to the millisecond, the identity cut."""
        if kind not in KINDS:
            raise ValueError(f"run kind must be one of {KINDS}, got {kind!r}")
        slot_ms = _ms(slot)
        return cls(slot_ms, _ms(at) - slot_ms, cut_identity(str(replica)), epoch, kind)

    @property
    def slot(self) -> datetime:
        return _EPOCH + self.slot_ms * _MS

    @property
    def at(self) -> datetime:
        """When the leader claimed it."""
        return _EPOCH + (self.slot_ms + self.late_ms) * _MS

    @property
    def late_seconds(self) -> float:
        """Claim time minus slot: how late the run was (the entry's jitter included)."""
        return self.late_ms / 1000

    def as_dict(self) -> dict[str, Any]:
        """As ``zkbeat history --json`` and the dashboard show it."""
        return {
            "slot": self.slot.isoformat(),
            "at": self.at.isoformat(),
            "late_seconds": self.late_seconds,
            "replica": self.replica,
            "epoch": self.epoch,
            "kind": self.kind,
        }


#: Run(*item) of a list of its five values, built in C: the same tuple without a Python call per run.
_run_of_list = partial(tuple.__new__, Run)


def kind_of(entry: beat.ScheduleEntry, slot: datetime, at: datetime) -> str:
    """``catch-up`` for a tick claimed once its next slot had come too, else ``scheduled``.

    The dashboard's last-run kind follows the same rule (zkbeat.ops.dashboard.describe).
    A schedule that raises here says ``scheduled``: what a run is called must
    never keep it from being published.
    """
    if (at - slot).total_seconds() <= _CATCH_UP_CHECK:
        return "scheduled"
    try:
        return "catch-up" if at >= slot_after(entry, slot) else "scheduled"
    except Exception:  # noqa: BLE001 - the schedule's own error is logged where it is planned
        return "scheduled"


def add_run(recent: Sequence[Run], run: Run, keep: int = RECENT_RUNS) -> tuple[Run, ...]:
    """``recent`` with ``run`` first, bounded at ``keep`` (at most RECENT_RUNS; 0 keeps none)."""
    return (run, *recent)[: max(0, min(keep, RECENT_RUNS))]


def encoded_bytes(recent: Sequence[Run]) -> int:
    """At least the bytes ``recent`` adds to a ledger record: what packing claims into a transaction counts.

    Not the worst case of every run (MAX_RUN_BYTES, 8 times the usual size),
    which would pack 8 times fewer claims into each transaction.
    """
    if not recent:
        return 0
    return len(', "recent": []') + sum(_FIXED_RUN_BYTES + _replica_bytes(r.replica) for r in recent)


def _replica_bytes(replica: str) -> int:
    """The replica's bytes as ``json.dumps`` writes them, quotes left out.

    Measured rather than guessed from the characters: a control character
    is written as six bytes (``\\u0001``), a character outside ASCII as six
    or twelve, and a count of one byte each would pack a transaction past
    ZooKeeper's request limit.
    """
    return len(json.dumps(replica)) - 2


def encode_runs(recent: Sequence[Run]) -> list[list[Any]]:
    return [list(run) for run in recent[:RECENT_RUNS]]


def decode_runs(value: Any) -> tuple[Run, ...]:
    """The runs of a ledger record's ``recent``; a list zkbeat cannot read is logged and read as none.

    Each run must be a list of five: a slot and lateness in whole milliseconds whose times a
    datetime can hold (year 1970 to 9999), a replica of at most MAX_REPLICA characters, an epoch
    and one of KINDS. One loop checks them all, without a call per run: a leader taking over
    checks every run of every entry.
    """
    if value is None:
        return ()
    if type(value) is list and len(value) <= RECENT_RUNS:
        for item in value:
            if type(item) is not list or len(item) != 5:
                break
            slot_ms, late_ms, replica, epoch, kind = item
            if not (
                type(slot_ms) is int
                and type(late_ms) is int
                and 0 <= slot_ms < _LAST_MS
                and 0 <= slot_ms + late_ms < _LAST_MS
                and type(replica) is str
                and len(replica) <= MAX_REPLICA
                and type(epoch) is int
                and kind in KINDS
            ):
                break
        else:
            return tuple(map(_run_of_list, value))
    logger.warning(
        "zkbeat: a ledger entry holds a 'recent' runs record zkbeat cannot read (%.200s); "
        "reading it as no recent runs (the entry's state is kept)",
        brief(value),
    )
    return ()


def shown(recent: Sequence[Run]) -> list[dict[str, Any]]:
    """The runs as ``zkbeat history --json``, ``zkbeat status --json`` and the dashboard show them."""
    return [run.as_dict() for run in recent]

"""What a term works with, handed to it when it is made.

A :class:`~zkbeat.leading.term.Term` leads one shard for one epoch. It gets
everything it uses when it begins, and never reaches back into the object
that made it:

=====================  =========================================================
collaborator           what the term (and its publisher) use it for
=====================  =========================================================
``ledger``             load, claim, write back (zkbeat.ledger.store)
``view``               the shard's schedule and the host's hooks on its entries
                       (:class:`ScheduleView`)
``settings``           zkbeat's settings (root, identity, catch-up limit, recent runs)
``policies``           each entry's grace, catch-up and jitter, parsed once
                       (zkbeat.ticking.policy)
``jitter``             each tick's publish moment after its slot (zkbeat.ticking.jitter)
``metrics``            counters and gauges (zkbeat.ops.metrics.Metrics)
``max_interval``       beat's longest wait: how long an entry left out stays out
``publisher``          the broker side (zkbeat.leading.publisher), itself given a
                       :class:`BeatBroker`
the clock              the term's ``clock_offset``: this replica's clock less
                       ZooKeeper's, measured when it took over
=====================  =========================================================

The hooks are callables looked up when they are called, so a host that
rebuilds its schedule (a database scheduler) or a test that replaces one of
its methods is seen by the term that runs at the time.
"""

from __future__ import annotations

from collections.abc import Callable, MutableMapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from celery.beat import ScheduleEntry

    from ..conf import Settings
    from ..ledger.store import EntryState, Ledger
    from ..ticking.jitter import Jitter
    from ..ticking.policy import Policies

__all__ = ["BeatBroker", "Collaborators", "ScheduleView"]


@dataclass(frozen=True)
class ScheduleView:
    """The host's schedule as a shard's term sees it, and the host's hooks on its entries.

    The schedule is the host's as it holds it: with shards, zkbeat.Scheduler
    holds every shard's entries and a DatabaseScheduler those of the shards
    it leads; beat's heap and the run-now requests are what is split per shard.
    """

    #: The schedule now (name -> entry); read once per use: a database scheduler's may be rebuilt between reads.
    read: Callable[[], MutableMapping[str, ScheduleEntry]]
    #: Celery's ``reserve()``: the entry's successor, stored in the schedule.
    reserve: Callable[[ScheduleEntry], ScheduleEntry]
    #: ``entry.is_due()`` as beat asks it: (is due, seconds to the next check, whether the entry's own clock answered,
    #: read as it was asked: its wait then counts from that moment, else from the pass's reading); an entry that
    #: raises is left out (zkbeat.leading.heap_pass.HeapPass.ask).
    ask: Callable[[ScheduleEntry], tuple[bool, float, bool]]
    #: Log (once per distinct error) that an entry cannot run now: ``leave_out(entry, exc)``.
    leave_out: Callable[[ScheduleEntry, BaseException], None]
    #: Rebuild beat's heap from the schedule at the next pass.
    invalidate_heap: Callable[[], None]
    #: True to keep the entry's own last run over the ledger's state (a database row that vouches for one).
    keeps_own_run: Callable[[ScheduleEntry, EntryState], bool]
    #: Whether the schedule is the host's whole schedule (False: its last read failed).
    loaded: Callable[[], bool]
    #: Whether reserve() gave this successor the pass's clock reading as its last run (an interval's next wait then
    #: counts from that reading); False: from the moment reserve() returned.
    reserved_at_reading: Callable[[ScheduleEntry], bool] = lambda successor: False
    #: Whether entry ``name`` is the term's shard's (zkbeat.coordination.shards): a term reads, merges and
    #: keeps the ledger of its own shard's entries only. Fixed when the term is made.
    holds: Callable[[str], bool] = lambda name: True
    #: What the host built the entry from, recorded with each run claimed (``EntryState.source``), for its
    #: ``keeps_own_run`` to tell a run of the row it holds now from another's; None: nothing to record.
    source_of: Callable[[ScheduleEntry], str | None] = lambda entry: None


@dataclass(frozen=True)
class BeatBroker:
    """Beat's way to the broker, as a term's publisher uses it."""

    #: The Celery app (its configuration; whether the Redis batch path applies).
    app: Any
    #: Beat's broker connection, made if need be.
    connection: Callable[[], Any]
    #: The connection made so far, None if none (to tell a broker error from another).
    made_connection: Callable[[], Any]
    #: Beat's producer on that connection, made if need be.
    producer: Callable[[], Any]
    #: Drop the cached connection and producer, so the next use reconnects (zkbeat.leading.broker.forget).
    forget: Callable[[], None]
    #: Celery's ``apply_async(entry, producer=..., advance=False)``: send one entry's message.
    apply_async: Callable[..., Any]


@dataclass(frozen=True)
class Collaborators:
    """What a term is given besides its publisher and its fence (the table in the module docstring)."""

    ledger: Ledger
    view: ScheduleView
    settings: Settings
    policies: Policies
    jitter: Jitter
    #: zkbeat.ops.metrics.Metrics (ops lies beside leading, not below it: not imported here).
    metrics: Any
    max_interval: float

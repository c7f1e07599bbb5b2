"""One term: what a replica knows and does during one epoch of leadership.

A term is created when the replica becomes leader under an epoch and
dropped when it stops leading, so nothing one term learnt (entry versions,
the broker's state) can mislead the next. It runs the leader's part of a
pass: plan the due ticks, claim them in fenced ledger transactions of a part each,
publish what committed, withdraw what the broker could not take, re-read
what someone else wrote.

The one thing that outlives a term is a claim whose commit was never
confirmed (the reply was lost with the connection): it may have landed. The
shard's leadership hands such :class:`PendingClaim` records to its next
term explicitly; that term settles each against the ledger before it claims
the entry again:

===========================================  ==================================
the ledger holds, for a pending claim         the next term
===========================================  ==================================
exactly the state the claim wrote             it landed: publish the tick now
                                              (late), unless the entry's grace
                                              or catch-up policy skips a tick
                                              that late (logged); broker down:
                                              withdraw it (write the pre-claim
                                              state back)
the pre-claim version                         it did not land: forget it
anything else                                 another leader has run the entry
                                              since: forget it, take the ledger
===========================================  ==================================

An entry with a pending claim is never claimed again until it is settled.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any

from celery import beat, schedules
from celery.utils.time import maybe_make_aware
from kazoo.exceptions import ConnectionClosedError, ConnectionLoss, SessionExpiredError
from kazoo.handlers.threading import KazooTimeoutError

from ..coordination.election import Fence, events
from ..exceptions import ClaimConflictError, ClaimRefusedError, FencedError
from ..ledger import clock
from ..ledger.controls import UNKNOWN_ENTRY_PATIENCE, TriggerInbox, TriggerRequest
from ..ledger.history import Run, add_run, kind_of
from ..ledger.pending import PendingClaim, report_unlanded, write_back
from ..ledger.store import ABSENT, Claim, ClaimInFlight, ClaimResult, EntryState, LedgerRecord, Pause
from ..ticking import catchup
from ..ticking.ticks import slot_after, tick_slot
from ._signals import hold_shutdown_signals
from .batch_publish import Send
from .publisher import BROKER_WAIT, Publisher

if TYPE_CHECKING:
    from collections.abc import MutableMapping

    from ..conf import Settings
    from ..ledger.store import Ledger
    from .host import Collaborators, ScheduleView

__all__ = ["Fence", "Due", "Requeue", "PendingClaim", "Term", "RETRY_DELAY", "BROKER_WAIT"]

logger = logging.getLogger(__name__)

#: Seconds before a tick that ZooKeeper or the broker failed is tried again.
RETRY_DELAY = 1.0
#: Longest beat's shutdown signals are held over one claim-and-publish. A
#: publish hung on a broker that went silent must not keep SIGTERM from
#: working until TCP gives up (minutes): past this a signal goes through at
#: once. The claims it leaves unsent are pending and written back at close().
SIGNAL_HOLD_LIMIT = 30.0
#: Seconds (at most half the interval) an interval entry's publish may come
#: after its slot and still count as on time: its successor goes on from the
#: slot, so its ticks keep their grid. Counted from the moment the pass read
#: the clock, every slot came that pass's lateness after the one before (the
#: heap holds an entry until just past its due moment, and a pass takes
#: time), period after period. Later than this (a burst of thousands due at
#: once, an overloaded leader), the entry goes on from the moment it ran, as
#: Celery's own beat does: entries due together then spread over the rounds
#: instead of all coming due together again, each round as late as the last.
ON_TIME = 0.1
#: Ticks claimed per fenced transaction within a pass: while one part's
#: messages go out, the next part's claim is on its way to ZooKeeper. Small
#: enough that a burst's first message waits for one part's claim, large
#: enough that a transaction's own cost (the fence's check, a round trip) is
#: shared by many ticks.
CLAIM_PART = 250
#: Overdue entries re-read at most per pass while the broker is down (one multiRead; see Term._learn_pauses).
PAUSE_READ_LIMIT = 1000
#: Missed ticks a resume counts for its log line, at most ("more than N" beyond).
RESUME_COUNT_LIMIT = 100
#: Errors after which a ZooKeeper write may or may not have landed.
UNCERTAIN = (ConnectionLoss, SessionExpiredError, ConnectionClosedError, KazooTimeoutError)


@dataclass(frozen=True)
class Due:
    """An entry beat's heap says is due, with its heap priority and Celery's next delay."""

    entry: beat.ScheduleEntry
    priority: int
    next_time: float
    #: When the entry's own clock answered ``next_time`` (monotonic; None: the pass's clock answered it).
    asked: float | None = None


@dataclass(frozen=True)
class Requeue:
    """Put ``entry`` back on beat's heap, due ``delay`` seconds from now."""

    entry: beat.ScheduleEntry
    priority: int
    delay: float
    #: When the entry's own clock read the moment ``delay`` counts from (monotonic; None: the pass's reading).
    asked: float | None = None


@dataclass
class _Tick:
    """One due entry on its way through claim and publish."""

    due: Due
    next_entry: beat.ScheduleEntry
    slot: datetime
    skip: bool
    claim: Claim
    previous: EntryState
    settled: bool = False
    #: Its message was being handed to kombu (it may have gone out).
    sending: bool = False
    #: The entry's pause: its tick is only a check of the ledger (zkbeat.ledger.controls).
    paused: Pause | None = None
    #: The trigger request of a run-now.
    request: TriggerRequest | None = None
    #: Why it is skipped (the catch-up policy's words), and when the entry is due
    #: next if not as Celery says (catch-up 'all' goes on from the slot).
    why: str = ""
    next_delay: float | None = None
    #: The moment (monotonic) Celery's next delay counts from where the entry's own clock read it
    #: (zkbeat.leading.heap_pass ``_push``): an interval's, reserve() reading it for the successor's last
    #: run; any other schedule's, its is_due answer. None: the pass's clock reading.
    next_from: float | None = None

    #: The entry's name (looked up many times a tick: kept, not asked of the entry each time).
    name: str = field(init=False)

    def __post_init__(self) -> None:
        self.name = self.due.entry.name


@dataclass
class _Known:
    """An entry's znode as this term last saw or wrote it."""

    version: int
    state: EntryState | None = None
    #: ZooKeeper's time of that write, if known (zkbeat.ledger.clock reads the state against it).
    written: datetime | None = None

    def trusted(self, offset: float, entry: beat.ScheduleEntry | None = None) -> EntryState | None:
        """The state as a leader ``offset`` seconds ahead of ZooKeeper's clock goes by it (zkbeat.ledger.clock)."""
        return None if self.state is None else clock.as_trusted(self.state, self.written, offset, entry)


@dataclass
class Term:
    """The leader's state for one epoch; see the module docstring."""

    #: The ledger, the shard's schedule view, settings, policies, jitter, metrics (zkbeat.leading.host).
    parts: Collaborators
    fence: Fence
    #: The broker side (zkbeat.leading.publisher), made for the term.
    publisher: Publisher
    pending: dict[str, PendingClaim] = field(default_factory=dict)
    #: The monotonic moment of the clock reading run() plans by (an on-time interval's next wait counts from it).
    _planned_at: float = field(default=0.0, init=False)
    known: dict[str, _Known] = field(default_factory=dict)
    #: Monotonic time of each entry's last conflict, to back off a repeat.
    conflicted: dict[str, float] = field(default_factory=dict)
    #: Ledger records read when the term began.
    records_loaded: int = 0
    #: Run-now requests (zkbeat.ledger.controls); its Event also wakes an idle leader.
    triggers: TriggerInbox | None = None
    #: Pauses already logged, so a paused entry is reported once, not every tick.
    paused_logged: set[tuple[str, Pause]] = field(default_factory=set)
    #: Missed slots of catch-up 'all', counted a bounded amount per pass (zkbeat.ticking.catchup).
    backlog: catchup.Backlog = field(default_factory=catchup.Backlog)
    #: Seconds this replica's clock is ahead of ZooKeeper's, as measured on taking over (zkbeat.ledger.clock).
    clock_offset: float = 0.0
    #: This leader's own claims were found ahead of ZooKeeper's clock (warned once a term).
    ahead_warned: bool = False
    #: The schedule's own last runs were checked since the host last rebuilt it (:meth:`check_own_runs`).
    own_runs_checked: bool = True
    #: Overdue entries re-read so far while the broker was down (where the next bounded read starts).
    pause_reads: int = 0

    @classmethod
    def begin(
        cls,
        parts: Collaborators,
        publisher: Publisher,
        fence: Fence,
        inherited: dict[str, PendingClaim] | None = None,
        clock_offset: float = 0.0,
    ) -> Term:
        """A new term: load the whole ledger, settle inherited claims, merge the rest.

        ``inherited`` becomes the term's own ``pending``: if the term cannot
        begin, what it holds then is what is still unsettled (a send that a
        signal cut short is no longer in it). ``clock_offset``: this
        replica's clock minus ZooKeeper's, in seconds.
        """
        pending = inherited if inherited is not None else {}
        term = cls(parts, fence, publisher, pending=pending, clock_offset=clock_offset)
        ledger = parts.ledger
        settings = parts.settings
        term.triggers = TriggerInbox(ledger.client, settings.root, settings.identity, fence.epoch)
        term.publisher.triggers = term.triggers
        ledger.ensure()
        if term.pending:
            ledger.sync()  # a commit still in flight from our last session lands before we read
        holds = term.view.holds
        records = ledger.load(keep=holds)  # this shard's entries only
        term.merge(records)
        for name in term.schedule:
            if holds(name):
                term.known.setdefault(name, _Known(ABSENT))
        term.records_loaded = len(records)
        if term.pending:
            term.settle(records)
        return term

    @property
    def epoch(self) -> int:
        return self.fence.epoch

    @property
    def ledger(self) -> Ledger:
        return self.parts.ledger

    @property
    def view(self) -> ScheduleView:
        """The shard's schedule and the host's hooks on its entries (zkbeat.leading.host)."""
        return self.parts.view

    @property
    def schedule(self) -> MutableMapping[str, beat.ScheduleEntry]:
        """The host's schedule now: read again at each use (a database host may rebuild it)."""
        return self.parts.view.read()

    @property
    def settings(self) -> Settings:
        return self.parts.settings

    @property
    def metrics(self) -> Any:
        return self.parts.metrics

    @property
    def max_interval(self) -> float:
        return self.parts.max_interval

    @property
    def broker_down(self) -> bool:
        """A send failed for want of the broker this term, and it has not answered since."""
        return self.publisher.broker_down

    @property
    def identity(self) -> str:
        return self.settings.identity

    # -- the ledger's view -------------------------------------------------

    def merge(self, records: dict[str, LedgerRecord]) -> list[str]:
        """Trust the ledger over local memory: it is what the last leader did.

        Entries with a pending claim are left to :meth:`settle`. A host may
        keep an entry's own last run (``keeps_own_run``) when it is newer.
        No last run later than ZooKeeper's clock allows is trusted, the
        ledger's or the host's (zkbeat.ledger.clock's table): the entries whose
        ledger state was ahead are logged, counted and returned.
        """
        schedule = self.schedule  # once: a database host's may query
        zones: dict[tuple, Any] = {}
        ahead = []
        for name, record in records.items():
            if name in self.pending:
                continue
            before = self.known.get(name)
            known = self.known[name] = _Known(record.version, record.state, record.written)
            entry = schedule.get(name)
            state = known.trusted(self.clock_offset, entry)
            pause = before.state.paused if before is not None and before.state is not None else None
            if pause is not None and entry is not None and (state is None or state.paused is None):
                self._report_resumed(entry, pause, state)
            if entry is None or state is None:
                continue
            recorded = record.state.last_run_at if record.state is not None else None
            if record.written is not None and state.last_run_at != recorded:
                ahead.append((name, recorded, record.written))
            self._take_run(entry, state, zones)
        if ahead:
            self._report_ahead(ahead)
        return [name for name, _, _ in ahead]

    def _take_run(self, entry: beat.ScheduleEntry, state: EntryState, zones: dict[tuple, Any]) -> None:
        """The ledger's last run and count onto ``entry``, unless the host keeps the entry's own, newer, run."""
        try:
            if self.view.keeps_own_run(entry, state) and not self._ahead_of_now(entry.last_run_at):
                return
            entry.last_run_at = as_entry_time(entry, state.last_run_at, zones)
        except Exception as exc:  # noqa: BLE001 - one entry's clock must not stop the rest
            self.view.leave_out(entry, exc)
            return
        entry.total_run_count = state.total_run_count

    def replaced(self, names: Sequence[str], added: Collection[str] = ()) -> None:
        """The host rebuilt (or dropped) these entries: each is read from the ledger again before its next claim.

        Meanwhile a rebuilt entry takes the run this term knows (the ledger's,
        or its own since), as a merge would: one built from a database row
        that says nothing of its last run (its leader never wrote it back)
        would count from "now", and come due a whole interval after the
        rebuild, where the ledger's run says sooner; it is read again only
        once it comes due.

        Not one in ``added``, which the host did not hold before (a row
        enabled again, created again under a deleted one's name): it counts
        from its own run, as django-celery-beat counts it (an empty one: from
        now), not from a namesake's older run the ledger kept, which would
        make it due, and published, the moment it came.
        """
        schedule = self.schedule
        zones: dict[tuple, Any] = {}
        for name in names:
            known = self.known.pop(name, None)
            if known is None or name in self.pending or name in added:
                continue
            entry = schedule.get(name)
            state = known.trusted(self.clock_offset, entry) if entry is not None else None
            if entry is not None and state is not None:
                self._take_run(entry, state, zones)

    def check_own_runs(self) -> bool:
        """Entries whose own last run is later than this replica's clock: go by the ledger (zkbeat.ledger.clock).

        Such an entry (a database row a leader whose clock was ahead wrote)
        is not due, so it would not be read against the ledger until its
        future date. Each is read now and merged; one the ledger does not
        know goes on from now. Logged and counted; True if any.
        """
        schedule = self.schedule
        holds = self.view.holds
        ahead = [
            name
            for name, entry in schedule.items()
            if name not in self.pending and holds(name) and self._own_run_ahead(entry)
        ]
        if not ahead:
            self.own_runs_checked = True
            return False
        counted = set(self.merge(self.ledger.load(ahead)))  # ZooKeeper errors: checked again next pass
        self.own_runs_checked = True
        now = datetime.now(timezone.utc)
        for name in ahead:
            self.known.setdefault(name, _Known(ABSENT))
            entry = schedule.get(name)
            if entry is not None and self._own_run_ahead(entry):
                try:
                    entry.last_run_at = as_entry_time(entry, now)
                except Exception as exc:  # noqa: BLE001 - one entry's clock must not stop the rest
                    self.view.leave_out(entry, exc)
        self.metrics.ledger_ahead(len([name for name in ahead if name not in counted]))
        logger.warning(
            "zkbeat: %d entries held a last run of their own in the future (written by a leader whose clock was "
            "ahead): %s; they go by the ledger, or go on from now where it has none (%s, epoch %s)",
            len(ahead),
            ", ".join(ahead[:10]) + (f" and {len(ahead) - 10} more" if len(ahead) > 10 else ""),
            self.identity,
            self.epoch,
        )
        return True

    def _own_run_ahead(self, entry: beat.ScheduleEntry) -> bool:
        try:
            return self._ahead_of_now(entry.last_run_at)
        except Exception:  # noqa: BLE001 - an entry whose clock raises is left out when it is planned
            return False

    def _zookeeper_now(self) -> datetime:
        """ZooKeeper's clock now, as far as this replica knows it (its clock less the measured offset)."""
        return datetime.now(timezone.utc) - timedelta(seconds=self.clock_offset)

    def _ahead_of_now(self, moment: datetime | None) -> bool:
        """Whether ``moment`` is later than this replica's clock now, plus the tolerance.

        Its own clock, not ZooKeeper's: a replica whose clock is ahead runs
        its schedule on it, and its own runs are not in its future.
        """
        if moment is None:
            return False
        return maybe_make_aware(moment) > datetime.now(timezone.utc) + timedelta(seconds=clock.LEDGER_TOLERANCE)

    def _report_ahead(self, ahead: list[tuple[str, datetime, datetime]]) -> None:
        """Warn and count ledger entries whose last run a leader with a clock ahead wrote (zkbeat.ledger.clock)."""
        self.metrics.ledger_ahead(len(ahead))
        most = max((recorded - written).total_seconds() for _, recorded, written in ahead)
        shown = ", ".join(f"{name} (last run {recorded.isoformat()}, written at {written.isoformat()})"
                          for name, recorded, written in ahead[:10])  # fmt: skip
        more = f" and {len(ahead) - 10} more" if len(ahead) > 10 else ""
        logger.warning(
            "zkbeat: ledger entries ahead of ZooKeeper's time of their write by up to %.1fs, written by a leader "
            "whose clock was ahead: %s%s; they go on from ZooKeeper's time of that write (plus %gs), and the "
            "ticks that leader published early are not published again (%s, epoch %s)",
            most,
            shown,
            more,
            clock.LEDGER_TOLERANCE,
            self.identity,
            self.epoch,
        )

    def settle(self, records: dict[str, LedgerRecord] | None = None) -> None:
        """Decide every pending claim against the ledger (table in the module docstring)."""
        if not self.pending:
            return
        ledger = self.ledger
        if records is None:
            ledger.sync()  # after a session move, a read could be served before our commit lands
            records = ledger.load(list(self.pending))
        landed = []
        for name, claim in list(self.pending.items()):
            record = records.get(name)
            if record is not None and record.state == claim.state:
                landed.append((claim, record))
                continue
            del self.pending[name]
            report_unlanded(claim, record)
            if record is not None:
                self.merge({name: record})
        if landed:
            self._settle_landed(landed)
        self.view.invalidate_heap()

    def _settle_landed(self, landed: list[tuple[PendingClaim, LedgerRecord]]) -> None:
        """Our unconfirmed claims committed: publish them late, or write them back if the broker is down.

        A tick that is now later than its entry's policy allows (its misfire
        grace time, its catch-up policy) is skipped and logged, as it would
        have been had it come due now; the ledger already holds the entry's
        next state, so the entry goes on from it. A run-now is never skipped.
        """
        now = datetime.now(timezone.utc)
        publish = []
        for claim, record in landed:
            decision = None if claim.request is not None else self._decide(claim.entry, claim.slot, now)[0]
            if decision is not None and decision.defer:
                continue  # its catch-up count goes on in the next pass; it stays pending until then
            if decision is None or not decision.skip:
                publish.append((claim, record))
                continue
            self._report_skip(claim.name, claim.slot, now, f"{decision.why} (its claim had committed unconfirmed)")
            del self.pending[claim.name]
            self.known[claim.name] = _Known(record.version, record.state, record.written)
            self._apply(claim.name, claim.state)
        if not publish:
            return
        landed = publish
        producer = None if self.broker_down else self.publisher.producer(len(landed))
        unsent = []
        sending: PendingClaim | None = None
        with hold_shutdown_signals(limit=SIGNAL_HOLD_LIMIT):
            try:
                for claim, record in landed:
                    self.known[claim.name] = _Known(record.version, record.state, record.written)
                    if producer is not None and not self.broker_down:
                        slot = claim.slot.isoformat()
                        logger.info("zkbeat: the claim of %s at %s had committed; publishing it now", claim.name, slot)
                        sending = claim
                        sent = self.publisher.publish(claim.entry, claim.slot, producer, claim.request)
                        sending = None
                        if sent:
                            del self.pending[claim.name]
                            self._apply(claim.name, claim.state)
                            continue
                    unsent.append(claim)
            except BaseException:
                if sending is not None:
                    # As in _interrupted: it may have reached the broker, so it
                    # is not written back (at most once); the rest stay pending.
                    del self.pending[sending.name]
                    logger.error(
                        "zkbeat: the send of %s at %s was cut short; it may or may not have reached the broker, "
                        "and is not sent again",
                        sending.name,
                        sending.slot.isoformat(),
                    )
                raise
        if unsent:
            versions = {claim.name: self.known[claim.name].version for claim in unsent}
            written = write_back(self.ledger, unsent, self.fence.candidate, versions)
            for claim in unsent:
                if claim.name in written:
                    del self.pending[claim.name]
                    self.known[claim.name] = _Known(written[claim.name], claim.previous)
                    self._apply(claim.name, claim.previous)

    def _apply(self, name: str, state: EntryState) -> None:
        """Set the schedule's entry to ``state`` (the ledger's, as this term just wrote it)."""
        entry = self.schedule.get(name)
        if entry is None:
            return
        try:
            entry.last_run_at = as_entry_time(entry, state.last_run_at)
        except Exception as exc:  # noqa: BLE001 - one entry's clock must not stop the rest
            self.view.leave_out(entry, exc)
            return
        entry.total_run_count = state.total_run_count

    def resolve_conflict(self, conflicting: list[str], rolled_back: list[str]) -> None:
        """Someone else wrote ``conflicting``: re-read every entry of the rolled-back batch, trust the ledger.

        All of them in one read, not only the one ZooKeeper named: when
        entries/ itself was deleted every one of them would conflict in
        turn, one pass each. The entries are updated in place, so what the
        pass puts back on beat's heap is already right.
        """
        ledger = self.ledger
        names = list(dict.fromkeys([*conflicting, *rolled_back]))
        records = ledger.load(names)
        if any(name not in records for name in names):
            ledger.ensure()  # entries/ itself may be gone: claims create under it again
        for name in conflicting:
            if _paused(self.known.get(name)) != _paused(records.get(name)):
                continue  # an operator's pause or resume: each is reported as what it is
            logger.warning("zkbeat: ledger entry %s changed underneath epoch %s; re-reading it", name, self.epoch)
        for name in names:
            if name not in records and name not in self.pending:
                self.known[name] = _Known(ABSENT)
        self.merge(records)

    # -- a pass ------------------------------------------------------------

    def new_pass(self) -> None:
        """A pass of the leader's loop begins: work bounded per pass starts afresh."""
        self.backlog.new_pass()

    def run(self, dues: list[Due]) -> list[Requeue]:
        """Claim the due entries in fenced parts (:meth:`_claim_and_publish`), publish what committed.

        The caller settles pending claims first. Returns what goes back on
        beat's heap. ZooKeeper errors propagate (after the claims they may
        have landed were recorded as pending); broker errors do not. An
        entry that cannot be planned (its clock raises, its name cannot be a
        znode) is logged and left out for ``max_interval``.
        """
        requeue: list[Requeue] = []
        waiting = []
        for due in dues:
            if due.entry.name in self.pending:
                requeue.append(Requeue(due.entry, due.priority, RETRY_DELAY))
            elif not self._storable(due.entry):
                requeue.append(Requeue(due.entry, due.priority, self.max_interval))
            else:
                waiting.append(due)
        waiting = self._recheck_unknown(waiting, requeue)
        if not waiting:
            return requeue
        now = datetime.now(timezone.utc)
        self._planned_at = time.monotonic()  # the moment of ``now``: an on-time interval's next slot counts from it
        ticks = []
        try:
            for due in waiting:
                try:
                    tick = self._plan(due, now)
                except Exception as exc:  # noqa: BLE001 - one entry's clock must not stop the rest
                    self.view.leave_out(due.entry, exc)
                    requeue.append(Requeue(due.entry, due.priority, self.max_interval))
                    continue
                if tick is None:  # its catch-up is still being counted: the next pass goes on
                    requeue.append(Requeue(due.entry, due.priority, 0))
                else:
                    ticks.append(tick)
            if not ticks:
                return requeue
            producer = self.publisher.producer(len(ticks))  # the broker answers, before anything is claimed
            if producer is None:
                requeue.extend(Requeue(t.due.entry, t.due.priority, RETRY_DELAY) for t in ticks)
                for tick in ticks:
                    self._unreserve(tick)  # before the re-read below, which lands on the entries put back
                self._learn_pauses(ticks)
                return requeue
            self._claim_and_publish(ticks, producer, now, requeue)
        finally:
            # A tick that did not run keeps its entry unadvanced (reserve() ran in _plan).
            for tick in ticks:
                if not tick.settled:
                    self._unreserve(tick)
        return requeue

    def _learn_pauses(self, ticks: list[_Tick]) -> None:
        """While the broker is down, re-read the overdue entries' ledger state: one paused meanwhile is not overdue.

        A leader learns of a pause through a claim (it conflicts), and claims
        nothing while the broker is down; without this an entry paused during
        the outage would count in zkbeat_entries_overdue until it ended. One
        read per pass (a multiRead), of the entries the metric counts (none
        when metrics are off), at most PAUSE_READ_LIMIT of them. An entry it
        finds paused is known paused from now on (its ticks are held back, not
        planned), as after a conflicting claim.
        """
        metrics = self.metrics
        overdue = set(metrics.overdue_names())
        names = [t.name for t in ticks if t.name in overdue and t.request is None and t.name not in self.pending]
        if not names:
            return
        start = self.pause_reads % len(names)  # past PAUSE_READ_LIMIT, each pass reads the next ones
        chosen = (names[start:] + names[:start])[:PAUSE_READ_LIMIT]
        self.pause_reads += len(chosen)
        records = self.ledger.load(chosen)
        self.merge(records)
        for name, record in records.items():
            if _paused(record):
                metrics.tick_settled(name)

    def _storable(self, entry: beat.ScheduleEntry) -> bool:
        """Whether the ledger can hold this entry's name (a znode name); logged once if not."""
        try:
            self.ledger.entry_path(entry.name)
        except (ValueError, TypeError) as exc:
            self.view.leave_out(entry, exc)
            return False
        return True

    def _claim_and_publish(self, ticks: list[_Tick], producer: Any, now: datetime, requeue: list[Requeue]) -> None:
        """The claims and the sends under held shutdown signals; withdrawals and re-reads after them.

        The ticks are claimed in parts of CLAIM_PART, each one fenced
        transaction; the next part's claim is on its way to ZooKeeper while
        this part's messages go out, and is sent only once this part's
        committed. A part that does not commit stops the rest, as a failed
        transaction of one claim would (the rest are put back unclaimed).

        Nothing that may wait on ZooKeeper beyond the claims themselves runs
        while the signals are held: withdrawing unsent ticks is one
        transaction after the sends, and the ticks are pending until it
        commits, so a signal in between leaves nothing lost (close() writes
        them back).
        """
        unsent: list[_Tick] = []
        parts = [ticks[start : start + CLAIM_PART] for start in range(0, len(ticks), CLAIM_PART)]
        result = ClaimResult(committed={})
        error: BaseException | None = None
        uncertain = False
        with hold_shutdown_signals(limit=SIGNAL_HOLD_LIMIT):
            claiming: list[_Tick] | None = parts[0]  # the part whose claim's outcome is not known yet
            try:
                in_flight = self._start_claim(parts[0])
                for index, part in enumerate(parts):
                    part_result, error, uncertain = self._claim_result(in_flight, timed=index == 0)
                    result.committed.update(part_result.committed)
                    claiming = None  # only now: a signal in between would leave its committed ticks nowhere
                    result.written.update(part_result.written)
                    following = parts[index + 1] if index + 1 < len(parts) else None
                    if following is not None and error is None and not self.broker_down:
                        claiming = following
                        in_flight = self._start_claim(following)
                    self._send_part(part, part_result, error, uncertain, producer, now, requeue, unsent)
                    if following is not None and claiming is None:
                        self._not_claimed([tick for later in parts[index + 1 :] for tick in later], error, requeue)
                        break
            except BaseException:
                if claiming is not None:
                    # A signal past the hold limit (or a send that raised) while this
                    # part's claim was on its way: whether it committed is unknown, as
                    # after a lost reply; pending, close() settles them.
                    for tick in claiming:
                        if not tick.skip and tick.paused is None:
                            self.pending[tick.name] = self._pending(tick)
                self._interrupted(ticks, result)
                raise
        if unsent:
            self._withdraw_unsent(unsent, requeue)
        self._check_own_clock(ticks, result)
        if isinstance(error, ClaimConflictError):
            rolled_back = [tick.name for tick in ticks if tick.name not in result.committed]
            self.resolve_conflict(error.names, rolled_back)
        if error is not None and any(tick.request is not None for tick in ticks) and self.triggers:
            self.triggers.again()
        if isinstance(error, FencedError) or uncertain:
            raise error

    def _not_claimed(self, ticks: list[_Tick], error: BaseException | None, requeue: list[Requeue]) -> None:
        """Ticks whose claim was never sent (a part before them failed, or the broker went down): put them back.

        A run-now's request is still in the inbox: read again after RETRY_DELAY, when the broker went down.
        """
        for tick in ticks:
            if error is None:  # the broker went down: the rest wait for it, unclaimed, as in Term.run
                self._unreserve(tick)
                if tick.request is None:
                    requeue.append(Requeue(tick.due.entry, tick.due.priority, RETRY_DELAY))
            else:
                self._not_committed(tick, error, False, requeue)
        if error is None and any(tick.request is not None for tick in ticks) and self.triggers:
            self.triggers.retry_after(RETRY_DELAY)  # the broker went: read again once a withdrawn tick is due

    def _send_part(
        self,
        part: list[_Tick],
        result: ClaimResult,
        error: BaseException | None,
        uncertain: bool,
        producer: Any,
        now: datetime,
        requeue: list[Requeue],
        unsent: list[_Tick],
    ) -> None:
        """Publish one part's committed ticks; put back (or keep pending) the rest of the part."""
        sent = self._publish_together(part, result, producer)
        estimated: datetime | None = None  # ZooKeeper's time of a part of creates, read once for the part
        for tick in part:
            version = result.committed.get(tick.name)
            if version is None:
                self._not_committed(tick, error, uncertain, requeue)
                continue
            written = result.written.get(tick.name)
            if written is None:  # creates only: estimated
                written = estimated = estimated or self._zookeeper_now()
            self.known[tick.name] = _Known(version, tick.claim.state, written)
            if self._finish(tick, producer, now, requeue, sent.get(tick.name)):
                continue
            self.pending[tick.name] = self._pending(tick)
            unsent.append(tick)

    def _check_own_clock(self, ticks: list[_Tick], result: ClaimResult) -> None:
        """Warn (once a term) when ZooKeeper's time of our claims shows this leader's ticks go out early."""
        if self.ahead_warned:
            return
        for tick in ticks:
            written = result.written.get(tick.name)
            if written is None or tick.request is not None or tick.paused is not None:
                continue
            early = (tick.slot - written).total_seconds()
            if early > clock.LEDGER_TOLERANCE:
                self.ahead_warned = True
                logger.warning(
                    "zkbeat: this leader publishes ticks ahead of ZooKeeper's time: %s at %s was claimed at %s "
                    "by ZooKeeper's clock, %.1fs early; keep the replicas' clocks in sync (NTP): a leader with a "
                    "correct clock skips these ticks when they come due (%s, epoch %s)",
                    tick.name,
                    tick.slot.isoformat(),
                    written.isoformat(),
                    early,
                    self.identity,
                    self.epoch,
                )
                return

    def _start_claim(self, ticks: list[_Tick]) -> ClaimInFlight:
        """The fenced claim of ``ticks``, sent to ZooKeeper; :meth:`_claim_result` waits for its answer."""
        return self.ledger.start_claim([tick.claim for tick in ticks], self.fence.candidate)

    def _claim_result(
        self, in_flight: ClaimInFlight, timed: bool = True
    ) -> tuple[ClaimResult, BaseException | None, bool]:
        """The fenced claim's answer: (what committed, why the rest did not, whether that is unknown).

        ``timed``: the answer was waited for as soon as the claim was sent,
        so this replica's clock now is ZooKeeper's time of the commit plus
        the offset (and a round trip). A part's claim answered while the
        part before went out is not: its answer may have waited for as long
        as the sends took, which is no skew.
        """
        try:
            result = in_flight.result()
        except UNCERTAIN as exc:
            return ClaimResult(committed=dict(getattr(exc, "committed", {}))), exc, True
        if result.written and timed:  # ZooKeeper's time of the commit, just now: this replica's offset from it
            self.clock_offset = (datetime.now(timezone.utc) - max(result.written.values())).total_seconds()
        self.metrics.claims("committed", len(result.committed))
        if result.error is not None:
            kind = "fenced" if isinstance(result.error, FencedError) else "conflicted"
            self.metrics.claims(kind, len(in_flight.claims) - len(result.committed))
        return result, result.error, False

    def _not_committed(self, tick: _Tick, error: BaseException | None, uncertain: bool, requeue: list[Requeue]) -> None:
        """A tick whose claim did not commit (or may have): put it back, or keep it pending.

        Its entry is unadvanced at once, before a conflict's re-read
        (:meth:`resolve_conflict`) updates the schedule's entry in place: the
        re-read state must land on the entry that goes back on the heap, not
        on the advanced one that is about to be dropped.
        """
        self._unreserve(tick)
        entry = tick.due.entry
        if uncertain:
            # The commit may or may not have landed; remember what we wrote
            # so that a later term (or close()) can tell whether it did.
            if not tick.skip and tick.paused is None:
                self.pending[tick.name] = self._pending(tick)
            requeue.append(Requeue(entry, tick.due.priority, RETRY_DELAY))
        elif isinstance(error, ClaimRefusedError) and tick.name in error.names and tick.request is not None:
            # ZooKeeper will not let us consume this run-now request (or write
            # its entry): leave the request out, so it cannot hold back the rest.
            if self.triggers is not None:
                self.triggers.refuse(tick.request.path, f"ZooKeeper refused its claim ({type(error.cause).__name__})")
        elif isinstance(error, ClaimRefusedError) and tick.name in error.names:
            logger.warning(
                "zkbeat: ZooKeeper refused the claim of entry %r under %s (%s): someone else's ACL is on it; "
                "leaving it out for %gs, the other entries go on (epoch %s)",
                tick.name,
                self.ledger.path,
                type(error.cause).__name__,
                self.max_interval,
                self.epoch,
            )
            requeue.append(Requeue(entry, tick.due.priority, self.max_interval))
        elif tick.request is None:
            requeue.append(Requeue(entry, tick.due.priority, self._conflict_delay(tick.name, error)))

    def _publish_together(self, ticks: list[_Tick], result: ClaimResult, producer: Any) -> dict[str, bool]:
        """The committed ticks to send, sent in one go where the broker allows (zkbeat.leading.batch_publish).

        name -> whether it counts as sent (as Publisher.publish says); empty
        when they go one at a time. Each is marked as being sent before its
        first byte is written, for :meth:`_interrupted`.
        """
        batch = [t for t in ticks if t.name in result.committed and not t.skip and t.paused is None and not t.request]
        if not batch or self.broker_down:
            return {}

        def writing(indices: Sequence[int]) -> None:
            for index in indices:
                batch[index].sending = True

        sends = [Send(tick.due.entry, tick.slot) for tick in batch]
        sent = self.publisher.publish_many(sends, producer, writing)
        return {} if sent is None else {tick.name: ok for tick, ok in zip(batch, sent)}

    def _finish(
        self, tick: _Tick, producer: Any, now: datetime, requeue: list[Requeue], sent: bool | None = None
    ) -> bool:
        """Publish (or skip, or hold back) one committed tick. False if the broker could not take it.

        ``sent``: it went out with others already (:meth:`_publish_together`), with that result.
        """
        entry = tick.due.entry
        if tick.paused is not None:
            self._report_paused(tick)
        elif tick.skip:
            self._report_skip(tick.name, tick.slot, now, tick.why)
        elif sent is not None:
            if not sent:
                tick.sending = False
                return False
        else:
            # Once the broker is gone the rest of the batch is withdrawn
            # unsent, instead of each waiting out kombu's retries in turn.
            if self.broker_down:
                return False
            tick.sending = True
            if not self.publisher.publish(entry, tick.slot, producer, tick.request):
                tick.sending = False
                return False
        tick.settled = True
        if tick.request is not None:
            return True  # a run-now leaves the schedule alone, its run count included
        self.metrics.tick_settled(tick.name)
        self.schedule[tick.name] = tick.next_entry
        delay = tick.due.next_time if tick.next_delay is None else tick.next_delay
        if tick.paused is not None:
            # Checked again within beat's max interval, not at its next run
            # (tomorrow, for a daily entry): a resume takes effect on this
            # leader as soon as it would on a new one.
            delay = min(delay, self.max_interval)
        requeue.append(Requeue(tick.next_entry, tick.due.priority, delay, tick.next_from))
        return True

    def _interrupted(self, ticks: list[_Tick], result: ClaimResult) -> None:
        """A signal (or anything) cut the sends short: what committed and was not sent stays pending.

        The tick whose send was cut may have reached the broker: it is not
        written back (at most once), and the log says so.
        """
        for tick in ticks:
            if tick.settled or tick.name not in result.committed or tick.name in self.pending:
                continue
            if tick.sending:
                logger.error(
                    "zkbeat: the send of %s at %s was cut short; it may or may not have reached the broker, "
                    "and is not sent again",
                    tick.name,
                    tick.slot.isoformat(),
                )
            elif not tick.skip and tick.paused is None:
                self.pending[tick.name] = self._pending(tick)

    def _withdraw_unsent(self, unsent: list[_Tick], requeue: list[Requeue]) -> None:
        """Write the pre-claim state of every unsent tick back, in one transaction, so they stay due."""
        claims = [self.pending[tick.name] for tick in unsent]
        versions = {tick.name: self.known[tick.name].version for tick in unsent}
        withdrawn = write_back(self.ledger, claims, self.fence.candidate, versions)
        for tick in unsent:
            if tick.name in withdrawn:
                del self.pending[tick.name]
                self.known[tick.name] = _Known(withdrawn[tick.name], tick.previous)
            if tick.request is None:
                requeue.append(Requeue(tick.due.entry, tick.due.priority, RETRY_DELAY))
        if any(tick.request is not None for tick in unsent) and self.triggers is not None:
            self.triggers.retry_after(RETRY_DELAY)  # put back in the inbox: tried again as a scheduled tick is

    def run_manual(self, requests: list[TriggerRequest]) -> None:
        """Run each trigger request once, consumed by the fenced claim that records the run.

        It runs while the entry is paused (an operator asked for it) and
        leaves the schedule where it was. A request for an entry this
        leader's schedule lacks is kept pending while that schedule is empty
        or did not load, and otherwise for UNKNOWN_ENTRY_PATIENCE (a replica
        whose schedule has it may lead soon: a rollout), then refused (see
        zkbeat.ledger.controls). One whose entry has a pending claim, or a second
        for the same entry, waits for a later pass.
        """
        if not requests or self.triggers is None:
            return
        schedule = self.schedule
        unknown = [r.entry for r in requests if r.entry in schedule and r.entry not in self.known]
        if unknown:
            self.merge(self.ledger.load(unknown))
        now = datetime.now(timezone.utc)
        ticks: list[_Tick] = []
        for request in requests:
            entry = schedule.get(request.entry)
            if entry is None:
                self._not_in_schedule(request, schedule, now)
                continue
            if request.entry in self.pending or any(tick.name == request.entry for tick in ticks):
                self.triggers.again()
                continue
            known = self.known.setdefault(request.entry, _Known(ABSENT))
            previous = known.trusted(self.clock_offset, entry) or EntryState(
                last_run_at=maybe_make_aware(entry.last_run_at),
                total_run_count=entry.total_run_count,
                epoch=self.epoch,
                updated_at=now,
            )
            # Not counted among the entry's runs: the count is schedule state (a
            # django-celery-beat one-off whose count is above 0 is done).
            run = Run.of(request.at, now, self.identity, self.epoch, "manual")
            state = replace(previous, epoch=self.epoch, updated_at=now, manual=request.name,
                            recent=add_run(previous.recent, run, self.settings.recent_runs))  # fmt: skip
            claim = Claim(entry.name, state, known.version, consume=request.path)
            ticks.append(_Tick(Due(entry, 0, 0), entry, request.at, False, claim, previous, request=request))
        if not ticks:
            return
        producer = self.publisher.producer(len(ticks))
        if producer is None:  # the broker is down: read again once a scheduled tick of this pass is tried again
            self.triggers.retry_after(RETRY_DELAY)
            return
        self._claim_and_publish(ticks, producer, now, [])  # a run-now puts nothing back on the heap

    def _not_in_schedule(self, request: TriggerRequest, schedule: dict[str, Any], now: datetime) -> None:
        """Keep a request for an entry this leader does not know pending, or refuse it once past patience."""
        assert self.triggers is not None
        recheck = self.max_interval
        if not schedule or not self.view.loaded():
            why = (
                f"this leader's schedule is {'empty' if not schedule else 'not loaded'}, so entry {request.entry!r} "
                "may only be missing from it for now; kept until a leader's schedule has it"
            )
            self.triggers.hold(request, why, recheck)
            return
        left = UNKNOWN_ENTRY_PATIENCE - (now - request.at).total_seconds()
        if left > 0:
            until = (now + timedelta(seconds=left)).isoformat(timespec="seconds")
            why = (
                f"entry {request.entry!r} is not in this leader's schedule; kept until {until} in case a replica "
                "whose schedule has it leads (a rollout), then refused"
            )
            self.triggers.hold(request, why, min(recheck, left))
            return
        self.triggers.discard(
            request.path,
            f"entry {request.entry!r} is not in the leader's schedule ({self.identity}, epoch {self.epoch}), "
            f"{UNKNOWN_ENTRY_PATIENCE:g}s after the request",
            request.entry,
        )

    def _report_skip(self, name: str, slot: datetime, now: datetime, why: str) -> None:
        logger.warning(
            "zkbeat: skipping %s: its tick at %s is %.1fs late, %s (%s, epoch %s)",
            name,
            slot.isoformat(),
            (now - slot).total_seconds(),
            why,
            self.identity,
            self.epoch,
        )

    def _report_resumed(self, entry: beat.ScheduleEntry, pause: Pause, state: EntryState | None) -> None:
        """Say that an operator resumed ``entry``, and what its catch-up policy does with the ticks it missed."""
        settings = self.settings
        policy = self.parts.policies.of(entry).catchup
        missed = "ticks missed unknown"
        if state is not None:
            try:
                # Counted for the log line only, so bounded well below the
                # catch-up limit (a slot of a crontab costs ~1 ms to compute).
                limit = min(settings.catchup_limit, RESUME_COUNT_LIMIT)
                count = catchup.missed_since(entry, state.last_run_at, datetime.now(timezone.utc), limit)
                shown = f"more than {limit}" if count > limit else str(count)
                missed = f"{shown} tick{'' if count == 1 else 's'} missed"
            except Exception:  # noqa: BLE001 - its schedule's own error is logged where it is planned
                pass
        events.info(
            "zkbeat: resumed %s (paused by %s at %s, %s: catch-up '%s') (epoch %s)",
            entry.name,
            pause.by,
            pause.at.isoformat() if pause.at else "?",
            missed,
            policy,
            self.epoch,
        )

    def _report_paused(self, tick: _Tick) -> None:
        """Say once per pause that an entry's ticks are held back, and by whom."""
        pause = tick.paused
        assert pause is not None
        if (tick.name, pause) in self.paused_logged:
            logger.debug("zkbeat: %s is paused; its tick at %s is not published", tick.name, tick.slot.isoformat())
            return
        self.paused_logged.add((tick.name, pause))
        events.info(
            "zkbeat: %s is paused (by %s at %s%s): none of its ticks is published until it is resumed (epoch %s)",
            tick.name,
            pause.by,
            pause.at.isoformat() if pause.at else "?",
            f", note: {pause.note}" if pause.note else "",
            self.epoch,
        )

    def _conflict_delay(self, name: str, error: Exception | None) -> float:
        """Claim a conflicted entry again at once, but not in a loop as fast as ZooKeeper answers."""
        if not isinstance(error, ClaimConflictError) or name not in error.names:
            return 0.0  # rolled back with another entry's conflict: nothing wrong with this one
        now = time.monotonic()
        last = self.conflicted.get(name)
        self.conflicted[name] = now
        return RETRY_DELAY if last is not None and now - last < 2 * RETRY_DELAY else 0.0

    def _decide(self, entry: beat.ScheduleEntry, slot: datetime, now: datetime) -> tuple[catchup.Decision, datetime]:
        """The entry's grace and catch-up policy for its tick at ``slot``: (the decision, the nominal now).

        Lateness counts from the jittered moment: a jitter is not a misfire.
        """
        policy = self.parts.policies.of(entry)
        jitter = self.parts.jitter.offset_for(entry, slot)
        self.metrics.tick_planned(entry.name, lambda: _overdue_at(entry, slot, jitter))
        nominal_now = now - timedelta(seconds=jitter) if jitter else now
        decision = catchup.decide(
            entry, slot, nominal_now, policy.catchup, policy.grace, self.settings.catchup_limit, self.backlog
        )
        return decision, nominal_now

    def _plan(self, due: Due, now: datetime) -> _Tick | None:
        """Decide publish-or-skip for one due entry and the ledger state to claim.

        None: not decided in this pass (its catch-up count goes on in the next).
        """
        entry = due.entry
        slot = tick_slot(entry)
        known = self.known.get(entry.name, _Known(ABSENT))
        if known.state is not None and known.state.paused is not None:
            # Nothing to write: a check that the pause still holds (a resume conflicts).
            # The entry is not advanced (no reserve()): it stays at the ledger's last
            # run, so after the resume what it missed follows its catch-up policy,
            # on this leader as on any other, and a database row records no run.
            claim = Claim(entry.name, known.state, known.version, check_only=True)
            return _Tick(due, entry, slot, True, claim, known.state, paused=known.state.paused)
        decision, nominal_now = self._decide(entry, slot, now)
        if decision.defer:
            return None
        trusted = known.trusted(self.clock_offset, entry)
        early = trusted.early if trusted is not None else ()
        span = clock.near_early(entry, slot, early) if early else None
        if span is not None:
            # Published already, early, by a leader whose clock was ahead (zkbeat.ledger.clock):
            # never again. The entry goes on from this slot, so the first slot past the
            # early ones follows the entry's own policy; all of them due already: past
            # them in one claim, not one pass each.
            why = (
                f"a leader whose clock was ahead published the slots from {span[0].isoformat()} to "
                f"{span[1].isoformat()} early, and this one is among them or nearer to them than a period"
            )
            decision = catchup.Decision(skip=True, advance_to=span[1] if span[1] <= nominal_now else slot, why=why)
        skip = decision.skip
        previous = trusted or EntryState(
            last_run_at=maybe_make_aware(entry.last_run_at),
            total_run_count=entry.total_run_count,
            epoch=self.epoch,
            updated_at=now,
        )
        next_entry = self.view.reserve(entry)
        reserved_run = next_entry.last_run_at
        if isinstance(entry.schedule, schedules.schedule):  # an interval: from its successor's last run
            next_from = None if self.view.reserved_at_reading(next_entry) else time.monotonic()
        else:  # a crontab's, a solar's wait: from the moment its is_due answered
            next_from = due.asked
        try:
            if skip:
                next_entry.total_run_count = entry.total_run_count  # a skip is not a run
            next_delay = None
            if decision.advance_to is not None:
                next_entry.last_run_at = as_entry_time(next_entry, decision.advance_to)
                # Counted from ``now``: from the moment it was read, as below.
                next_from = self._planned_at
                next_delay = max(0.0, (slot_after(next_entry, decision.advance_to) - now).total_seconds())
            elif (
                _aware(reserved_run)  # naive: a frame of its own, left as it was
                and (on_time := _on_time(entry, slot, nominal_now)) is not None
            ):
                # An interval on time goes on from its slot (see ON_TIME), placed on the heap at its next slot:
                # its wait counts from the moment ``now`` was read, not from the pass's reading (earlier by the
                # scan and any ledger read, it would place the entry that much before its slot, asked in vain).
                next_entry.last_run_at = slot.astimezone(reserved_run.tzinfo)  # in the zone reserve() gave it
                next_from, next_delay = self._planned_at, max(0.0, on_time - (now - slot).total_seconds())
            elif nominal_now != now and isinstance(entry.schedule, schedules.schedule):
                next_from = None  # counts from the nominal moment, before reserve() read the clock: as before
                # An interval counts from the last run, which reserve() sets to
                # now: the jittered moment. Counting from it would move every
                # next slot later by this slot's offset, period after period.
                # Count from the nominal moment of this publish instead: Celery's "go on from now" when late.
                next_entry.last_run_at = as_entry_time(next_entry, max(slot, nominal_now))
            if (
                next_entry.last_run_at is not reserved_run
                and getattr(next_entry, "row_last_run_at", None) is reserved_run
            ):
                # A database row's entry (zkbeat.contrib.django) vouches for the run its row will hold: this one.
                next_entry.row_last_run_at = next_entry.last_run_at
            last_run_at = maybe_make_aware(next_entry.last_run_at)
        except BaseException:
            if self.schedule.get(entry.name) is next_entry:
                self.schedule[entry.name] = entry  # reserve() stored it: not advanced after all
            raise
        state = EntryState(
            last_run_at=last_run_at,
            total_run_count=next_entry.total_run_count,
            epoch=self.epoch,
            updated_at=now,
            slot=slot,
            # The last run-now stays named across scheduled runs: it is how
            # `zkbeat trigger` tells a consumed request whose receipt was lost.
            manual=known.state.manual if known.state is not None else None,
            early=early,
            # The run joins the entry's recent runs in this same claim (zkbeat.ledger.history); a skip is no run.
            recent=previous.recent if skip else self._add_run(previous.recent, entry, slot, now),
            source=self.view.source_of(entry),
        )
        claim = Claim(entry.name, state, known.version)
        return _Tick(
            due, next_entry, slot, skip, claim, previous, why=decision.why, next_delay=next_delay, next_from=next_from
        )

    def _add_run(self, recent: tuple[Run, ...], entry: beat.ScheduleEntry, slot: datetime, now: datetime
                 ) -> tuple[Run, ...]:  # fmt: skip
        """``recent`` with the run of ``entry``'s tick at ``slot``, claimed ``now`` (zkbeat_recent_runs of them)."""
        keep = self.settings.recent_runs
        if keep <= 0:
            return ()  # none kept: no slot computed for a kind nobody reads
        return add_run(recent, Run.of(slot, now, self.identity, self.epoch, kind_of(entry, slot, now)), keep)

    def _unreserve(self, tick: _Tick) -> None:
        schedule = self.schedule
        if schedule.get(tick.name) is tick.next_entry:
            schedule[tick.name] = tick.due.entry

    def _pending(self, tick: _Tick) -> PendingClaim:
        return PendingClaim(
            name=tick.name,
            priority=tick.due.priority,
            entry=tick.due.entry,
            next_entry=tick.next_entry,
            slot=tick.slot,
            epoch=self.epoch,
            state=tick.claim.state,
            previous_version=tick.claim.version,
            previous=tick.previous,
            request=tick.request,
        )

    def _recheck_unknown(self, dues: list[Due], requeue: list[Requeue]) -> list[Due]:
        """Entries that appeared after the term began: read their ledger state first.

        One may have been run by an earlier leader; if the ledger says so it is
        not due after all, and goes back on the heap.
        """
        unknown = [due.entry.name for due in dues if due.entry.name not in self.known]
        if not unknown:
            return dues
        records = self.ledger.load(unknown)
        self.merge(records)
        for name in unknown:
            self.known.setdefault(name, _Known(ABSENT))
        still_due = []
        for due in dues:
            if due.entry.name in records:
                is_due, next_time, asked = self._ask_again(due.entry)
                if not is_due:
                    requeue.append(Requeue(due.entry, due.priority, next_time, asked))
                    continue
                due = Due(due.entry, due.priority, next_time, asked)
            still_due.append(due)
        return still_due

    def _ask_again(self, entry: beat.ScheduleEntry) -> tuple[bool, float, float | None]:
        """The entry's is_due answer now, and when its own clock read it (monotonic; None: the pass's reading).

        Asked after a ledger read (a ZooKeeper round trip): a wait its own
        clock counted from then, counted from the pass's reading instead,
        would put it back on beat's heap early by that read, to be asked
        again in vain (zkbeat.leading.heap_pass ``_push``).
        """
        is_due, next_time, own_clock = self.view.ask(entry)
        return is_due, next_time, time.monotonic() if own_clock else None


def _aware(moment: Any) -> bool:
    """Whether ``moment`` is an aware datetime (a zone that gives its offset), as Python defines it."""
    try:
        return isinstance(moment, datetime) and moment.utcoffset() is not None
    except Exception:  # noqa: BLE001 - a zone of the user's own that raises: not one to express a slot in
        return False


def _on_time(entry: beat.ScheduleEntry, slot: datetime, nominal_now: datetime) -> float | None:
    """The interval in seconds of an entry of Celery's own interval schedule that runs on time (``nominal_now``
    at most ON_TIME, and half its interval, after ``slot``); None for any other entry or a late run.

    Only Celery's own class, absolute: a relative interval rounds to its own
    grid, a subclass may count its own way, and an interval of 0 never
    moves on from its slot.
    """
    schedule = entry.schedule
    if type(schedule) is not schedules.schedule or schedule.relative:
        return None
    seconds = schedule.run_every.total_seconds()
    late = (nominal_now - slot).total_seconds()
    return seconds if seconds > 0 and 0 <= late <= min(ON_TIME, seconds / 2) else None


def _overdue_at(entry: beat.ScheduleEntry, slot: datetime, jitter: float) -> float:
    """When a tick planned for ``slot`` is one period late (epoch seconds): the metric "it did not fire"."""
    period = slot_after(entry, slot) - slot
    return (slot + timedelta(seconds=jitter) + period).timestamp()


def _paused(known: _Known | LedgerRecord | None) -> bool:
    """Whether ``known`` (what this term knew, or what the ledger holds now) is an entry's pause."""
    state = known.state if known is not None else None
    return state is not None and state.paused is not None


def as_entry_time(entry: beat.ScheduleEntry, moment: datetime, zones: dict[tuple, Any] | None = None) -> datetime:
    """Express a ledger time in the zone Celery's own entry uses.

    Asking an entry for "now" costs ~15 µs (Celery's app.now), a third of a
    10,000-entry takeover; ``zones`` remembers the answer for entries that
    get "now" the same way (same entry and schedule class, nowfun and app).
    """
    schedule = entry.schedule
    key = (type(entry), type(schedule), getattr(schedule, "nowfun", None), id(entry.app))
    zone = zones.get(key) if zones is not None else None
    if zone is None:
        zone = maybe_make_aware(entry.default_now()).tzinfo
        if zones is not None:
            zones[key] = zone
    return moment.astimezone(zone)

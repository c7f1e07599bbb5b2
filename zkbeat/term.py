"""One term: what a replica knows and does during one epoch of leadership.

A term is created when the replica becomes leader under an epoch and
dropped when it stops leading, so nothing one term learnt (entry versions,
the broker's state) can mislead the next. It runs the leader's part of a
pass: plan the due ticks, claim them in one fenced ledger transaction,
publish what committed, withdraw what the broker could not take, re-read
what someone else wrote.

The one thing that outlives a term is a claim whose commit was never
confirmed (the reply was lost with the connection): it may have landed. The
scheduler hands such :class:`PendingClaim` records to its next term
explicitly; that term settles each against the ledger before it claims the
entry again:

===========================================  ==================================
the ledger holds, for a pending claim         the next term
===========================================  ==================================
exactly the state the claim wrote             it landed: publish the tick now
                                              (late); broker down: withdraw it
                                              (write the pre-claim state back)
the pre-claim version                         it did not land: forget it
anything else                                 another leader has run the entry
                                              since: forget it, take the ledger
===========================================  ==================================

An entry with a pending claim is never claimed again until it is settled.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any

from celery import beat, schedules
from celery.utils.time import maybe_make_aware
from kazoo.exceptions import ConnectionClosedError, ConnectionLoss, SessionExpiredError
from kazoo.handlers.threading import KazooTimeoutError

from . import catchup
from ._signals import hold_shutdown_signals
from .controls import TriggerInbox, TriggerRequest
from .election import Fence
from .exceptions import ClaimConflictError, ClaimRefusedError, FencedError
from .ledger import ABSENT, Claim, ClaimResult, EntryState, LedgerRecord, Pause
from .pending import PendingClaim, report_unlanded, write_back
from .publisher import BROKER_WAIT, Publisher
from .ticks import grace_time, slot_after, tick_slot

if TYPE_CHECKING:
    from .scheduler import LeaderScheduleMixin

__all__ = ["Fence", "Due", "Requeue", "PendingClaim", "Term", "RETRY_DELAY", "BROKER_WAIT"]

logger = logging.getLogger(__name__)

#: Seconds before a tick that ZooKeeper or the broker failed is tried again.
RETRY_DELAY = 1.0
#: Longest beat's shutdown signals are held over one claim-and-publish. A
#: publish hung on a broker that went silent must not keep SIGTERM from
#: working until TCP gives up (minutes): past this a signal goes through at
#: once. The claims it leaves unsent are pending and written back at close().
SIGNAL_HOLD_LIMIT = 30.0
#: Errors after which a ZooKeeper write may or may not have landed.
UNCERTAIN = (ConnectionLoss, SessionExpiredError, ConnectionClosedError, KazooTimeoutError)


@dataclass(frozen=True)
class Due:
    """An entry beat's heap says is due, with its heap priority and Celery's next delay."""

    entry: beat.ScheduleEntry
    priority: int
    next_time: float


@dataclass(frozen=True)
class Requeue:
    """Put ``entry`` back on beat's heap, due ``delay`` seconds from now."""

    entry: beat.ScheduleEntry
    priority: int
    delay: float


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
    #: The entry's pause: its tick is only a check of the ledger (zkbeat.controls).
    paused: Pause | None = None
    #: The trigger request of a run-now.
    request: TriggerRequest | None = None
    #: Why it is skipped (the catch-up policy's words), and when the entry is due
    #: next if not as Celery says (catch-up 'all' goes on from the slot).
    why: str = ""
    next_delay: float | None = None

    @property
    def name(self) -> str:
        return self.due.entry.name


@dataclass
class _Known:
    """An entry's znode as this term last saw or wrote it."""

    version: int
    state: EntryState | None = None


@dataclass
class Term:
    """The leader's state for one epoch; see the module docstring."""

    scheduler: LeaderScheduleMixin
    fence: Fence
    pending: dict[str, PendingClaim] = field(default_factory=dict)
    known: dict[str, _Known] = field(default_factory=dict)
    #: The broker side (zkbeat.publisher), made with the term.
    publisher: Publisher = field(init=False)
    #: Monotonic time of each entry's last conflict, to back off a repeat.
    conflicted: dict[str, float] = field(default_factory=dict)
    #: Ledger records read when the term began.
    records_loaded: int = 0
    #: Run-now requests (zkbeat.controls); its Event also wakes an idle leader.
    triggers: TriggerInbox | None = None
    #: Pauses already logged, so a paused entry is reported once, not every tick.
    paused_logged: set[tuple[str, Pause]] = field(default_factory=set)

    @classmethod
    def begin(
        cls, scheduler: LeaderScheduleMixin, fence: Fence, inherited: dict[str, PendingClaim] | None = None
    ) -> Term:
        """A new term: load the whole ledger, settle inherited claims, merge the rest.

        ``inherited`` becomes the term's own ``pending``: if the term cannot
        begin, what it holds then is what is still unsettled (a send that a
        signal cut short is no longer in it).
        """
        term = cls(scheduler, fence, pending=inherited if inherited is not None else {})
        ledger = scheduler.ledger
        term.triggers = TriggerInbox(ledger.client, scheduler.zk_settings.root)
        term.publisher.triggers = term.triggers
        ledger.ensure()
        if term.pending:
            ledger.sync()  # a commit still in flight from our last session lands before we read
        records = ledger.load()
        term.merge(records)
        for name in scheduler.schedule:
            term.known.setdefault(name, _Known(ABSENT))
        term.records_loaded = len(records)
        if term.pending:
            term.settle(records)
        return term

    def __post_init__(self) -> None:
        self.publisher = Publisher(self.scheduler, self.fence.epoch, self.triggers)

    @property
    def epoch(self) -> int:
        return self.fence.epoch

    @property
    def broker_down(self) -> bool:
        """A send failed for want of the broker this term, and it has not answered since."""
        return self.publisher.broker_down

    @property
    def identity(self) -> str:
        return self.scheduler.zk_settings.identity

    # -- the ledger's view -------------------------------------------------

    def merge(self, records: dict[str, LedgerRecord]) -> None:
        """Trust the ledger over local memory: it is what the last leader did.

        Entries with a pending claim are left to :meth:`settle`. A host may
        keep an entry's own last run (``keeps_own_run``) when it is newer.
        """
        scheduler = self.scheduler
        schedule = scheduler.schedule  # once: a database scheduler's property may query
        zones: dict[tuple, Any] = {}
        for name, record in records.items():
            if name in self.pending:
                continue
            self.known[name] = _Known(record.version, record.state)
            entry = schedule.get(name)
            state = record.state
            if entry is None or state is None:
                continue
            try:
                if scheduler.keeps_own_run(entry, state):
                    continue
                entry.last_run_at = _as_entry_time(entry, state.last_run_at, zones)
            except Exception as exc:  # noqa: BLE001 - one entry's clock must not stop the rest
                scheduler.leave_out(entry, exc)
                continue
            entry.total_run_count = state.total_run_count

    def settle(self, records: dict[str, LedgerRecord] | None = None) -> None:
        """Decide every pending claim against the ledger (table in the module docstring)."""
        if not self.pending:
            return
        ledger = self.scheduler.ledger
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
        self.scheduler.invalidate_heap()

    def _settle_landed(self, landed: list[tuple[PendingClaim, LedgerRecord]]) -> None:
        """Our unconfirmed claims committed: publish them late, or write them back if the broker is down."""
        producer = None if self.broker_down else self.publisher.producer(len(landed))
        unsent = []
        sending: PendingClaim | None = None
        with hold_shutdown_signals(limit=SIGNAL_HOLD_LIMIT):
            try:
                for claim, record in landed:
                    self.known[claim.name] = _Known(record.version, record.state)
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
            written = write_back(self.scheduler.ledger, unsent, self.fence.candidate, versions)
            for claim in unsent:
                if claim.name in written:
                    del self.pending[claim.name]
                    self.known[claim.name] = _Known(written[claim.name], claim.previous)
                    self._apply(claim.name, claim.previous)

    def _apply(self, name: str, state: EntryState) -> None:
        """Set the schedule's entry to ``state`` (the ledger's, as this term just wrote it)."""
        entry = self.scheduler.schedule.get(name)
        if entry is None:
            return
        try:
            entry.last_run_at = _as_entry_time(entry, state.last_run_at)
        except Exception as exc:  # noqa: BLE001 - one entry's clock must not stop the rest
            self.scheduler.leave_out(entry, exc)
            return
        entry.total_run_count = state.total_run_count

    def resolve_conflict(self, conflicting: list[str], rolled_back: list[str]) -> None:
        """Someone else wrote ``conflicting``: re-read every entry of the rolled-back batch, trust the ledger.

        All of them in one read, not only the one ZooKeeper named: when
        entries/ itself was deleted every one of them would conflict in
        turn, one pass each. The entries are updated in place, so what the
        pass puts back on beat's heap is already right.
        """
        ledger = self.scheduler.ledger
        names = list(dict.fromkeys([*conflicting, *rolled_back]))
        records = ledger.load(names)
        if any(name not in records for name in names):
            ledger.ensure()  # entries/ itself may be gone: claims create under it again
        for name in conflicting:
            logger.warning("zkbeat: ledger entry %s changed underneath epoch %s; re-reading it", name, self.epoch)
        for name in names:
            if name not in records and name not in self.pending:
                self.known[name] = _Known(ABSENT)
        self.merge(records)

    # -- a pass ------------------------------------------------------------

    def run(self, dues: list[Due]) -> list[Requeue]:
        """Claim the due entries in one fenced transaction, publish what committed.

        The caller settles pending claims first. Returns what goes back on
        beat's heap. ZooKeeper errors propagate (after the claims they may
        have landed were recorded as pending); broker errors do not. An
        entry that cannot be planned (its clock raises, its name cannot be a
        znode) is logged and left out for ``max_interval``.
        """
        scheduler = self.scheduler
        requeue: list[Requeue] = []
        waiting = []
        for due in dues:
            if due.entry.name in self.pending:
                requeue.append(Requeue(due.entry, due.priority, RETRY_DELAY))
            elif not self._storable(due.entry):
                requeue.append(Requeue(due.entry, due.priority, scheduler.max_interval))
            else:
                waiting.append(due)
        waiting = self._recheck_unknown(waiting, requeue)
        if not waiting:
            return requeue
        now = datetime.now(timezone.utc)
        ticks = []
        try:
            for due in waiting:
                try:
                    ticks.append(self._plan(due, now))
                except Exception as exc:  # noqa: BLE001 - one entry's clock must not stop the rest
                    scheduler.leave_out(due.entry, exc)
                    requeue.append(Requeue(due.entry, due.priority, scheduler.max_interval))
            if not ticks:
                return requeue
            producer = self.publisher.producer(len(ticks))  # the broker answers, before anything is claimed
            if producer is None:
                requeue.extend(Requeue(t.due.entry, t.due.priority, RETRY_DELAY) for t in ticks)
                return requeue
            self._claim_and_publish(ticks, producer, now, requeue)
        finally:
            # A tick that did not run keeps its entry unadvanced (reserve() ran in _plan).
            for tick in ticks:
                if not tick.settled:
                    self._unreserve(tick)
        return requeue

    def _storable(self, entry: beat.ScheduleEntry) -> bool:
        """Whether the ledger can hold this entry's name (a znode name); logged once if not."""
        try:
            self.scheduler.ledger.entry_path(entry.name)
        except (ValueError, TypeError) as exc:
            self.scheduler.leave_out(entry, exc)
            return False
        return True

    def _claim_and_publish(self, ticks: list[_Tick], producer: Any, now: datetime, requeue: list[Requeue]) -> None:
        """The claim and the sends under held shutdown signals; withdrawals and re-reads after them.

        Nothing that may wait on ZooKeeper beyond the claim itself runs while
        the signals are held: withdrawing unsent ticks is one transaction
        after the sends, and the ticks are pending until it commits, so a
        signal in between leaves nothing lost (close() writes them back).
        """
        unsent: list[_Tick] = []
        with hold_shutdown_signals(limit=SIGNAL_HOLD_LIMIT):
            try:
                result, error, uncertain = self._claim(ticks)
            except BaseException:
                # A signal past the hold limit, mid-claim: whether it committed is
                # unknown, as after a lost reply; pending, close() settles them.
                for tick in ticks:
                    if not tick.skip and tick.paused is None:
                        self.pending[tick.name] = self._pending(tick)
                raise
            try:
                for tick in ticks:
                    version = result.committed.get(tick.name)
                    if version is None:
                        self._not_committed(tick, error, uncertain, requeue)
                        continue
                    self.known[tick.name] = _Known(version, tick.claim.state)
                    if self._finish(tick, producer, now, requeue):
                        continue
                    self.pending[tick.name] = self._pending(tick)
                    unsent.append(tick)
            except BaseException:
                self._interrupted(ticks, result)
                raise
        if unsent:
            self._withdraw_unsent(unsent, requeue)
        if isinstance(error, ClaimConflictError):
            rolled_back = [tick.name for tick in ticks if tick.name not in result.committed]
            self.resolve_conflict(error.names, rolled_back)
        if error is not None and any(tick.request is not None for tick in ticks) and self.triggers:
            self.triggers.again()
        if isinstance(error, FencedError) or uncertain:
            raise error

    def _claim(self, ticks: list[_Tick]) -> tuple[ClaimResult, BaseException | None, bool]:
        """The fenced claim: (what committed, why the rest did not, whether that is unknown)."""
        scheduler = self.scheduler
        try:
            result = scheduler.ledger.claim([tick.claim for tick in ticks], self.fence.candidate)
        except UNCERTAIN as exc:
            return ClaimResult(committed=dict(getattr(exc, "committed", {}))), exc, True
        scheduler.metrics.claims("committed", len(result.committed))
        if result.error is not None:
            kind = "fenced" if isinstance(result.error, FencedError) else "conflicted"
            scheduler.metrics.claims(kind, len(ticks) - len(result.committed))
        return result, result.error, False

    def _not_committed(self, tick: _Tick, error: BaseException | None, uncertain: bool, requeue: list[Requeue]) -> None:
        """A tick whose claim did not commit (or may have): put it back, or keep it pending."""
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
                self.scheduler.ledger.path,
                type(error.cause).__name__,
                self.scheduler.max_interval,
                self.epoch,
            )
            requeue.append(Requeue(entry, tick.due.priority, self.scheduler.max_interval))
        elif tick.request is None:
            requeue.append(Requeue(entry, tick.due.priority, self._conflict_delay(tick.name, error)))

    def _finish(self, tick: _Tick, producer: Any, now: datetime, requeue: list[Requeue]) -> bool:
        """Publish (or skip, or hold back) one committed tick. False if the broker could not take it."""
        entry = tick.due.entry
        if tick.paused is not None:
            self._report_paused(tick)
        elif tick.skip:
            logger.warning(
                "zkbeat: skipping %s: its tick at %s is %.1fs late, %s (%s, epoch %s)",
                tick.name,
                tick.slot.isoformat(),
                (now - tick.slot).total_seconds(),
                tick.why,
                self.identity,
                self.epoch,
            )
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
        self.scheduler.schedule[tick.name] = tick.next_entry
        delay = tick.due.next_time if tick.next_delay is None else tick.next_delay
        if tick.paused is not None:
            # Checked again within beat's max interval, not at its next run
            # (tomorrow, for a daily entry): a resume takes effect on this
            # leader as soon as it would on a new one.
            delay = min(delay, self.scheduler.max_interval)
        requeue.append(Requeue(tick.next_entry, tick.due.priority, delay))
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
        withdrawn = write_back(self.scheduler.ledger, claims, self.fence.candidate, versions)
        for tick in unsent:
            if tick.name in withdrawn:
                del self.pending[tick.name]
                self.known[tick.name] = _Known(withdrawn[tick.name], tick.previous)
            if tick.request is None:
                requeue.append(Requeue(tick.due.entry, tick.due.priority, RETRY_DELAY))

    def run_manual(self, requests: list[TriggerRequest]) -> None:
        """Run each trigger request once, consumed by the fenced claim that records the run.

        It runs while the entry is paused (an operator asked for it) and
        leaves the schedule where it was. A request for an entry this
        leader's schedule lacks is logged and removed; one whose entry has a
        pending claim, or a second for the same entry, waits for a later pass.
        """
        if not requests or self.triggers is None:
            return
        schedule = self.scheduler.schedule
        unknown = [r.entry for r in requests if r.entry in schedule and r.entry not in self.known]
        if unknown:
            self.merge(self.scheduler.ledger.load(unknown))
        now = datetime.now(timezone.utc)
        ticks: list[_Tick] = []
        for request in requests:
            entry = schedule.get(request.entry)
            if entry is None:
                self.triggers.discard(request.path, f"entry {request.entry!r} is not in the leader's schedule")
                continue
            if request.entry in self.pending or any(tick.name == request.entry for tick in ticks):
                self.triggers.again()
                continue
            known = self.known.setdefault(request.entry, _Known(ABSENT))
            previous = known.state or EntryState(
                last_run_at=maybe_make_aware(entry.last_run_at),
                total_run_count=entry.total_run_count,
                epoch=self.epoch,
                updated_at=now,
            )
            # Not counted among the entry's runs: the count is schedule state (a
            # django-celery-beat one-off whose count is above 0 is done).
            state = replace(previous, epoch=self.epoch, updated_at=now, manual=request.name)
            claim = Claim(entry.name, state, known.version, consume=request.path)
            ticks.append(_Tick(Due(entry, 0, 0), entry, request.at, False, claim, previous, request=request))
        if not ticks:
            return
        producer = self.publisher.producer(len(ticks))
        if producer is None:
            self.triggers.again()
            return
        self._claim_and_publish(ticks, producer, now, [])  # a run-now puts nothing back on the heap

    def _report_paused(self, tick: _Tick) -> None:
        """Say once per pause that an entry's ticks are held back, and by whom."""
        pause = tick.paused
        assert pause is not None
        if (tick.name, pause) in self.paused_logged:
            logger.debug("zkbeat: %s is paused; its tick at %s is not published", tick.name, tick.slot.isoformat())
            return
        self.paused_logged.add((tick.name, pause))
        logger.info(
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

    def _plan(self, due: Due, now: datetime) -> _Tick:
        """Decide publish-or-skip for one due entry and the ledger state to claim."""
        entry = due.entry
        slot = tick_slot(entry)
        settings = self.scheduler.zk_settings
        grace = grace_time(entry, settings.misfire_grace_time)
        policy = catchup.policy_for(entry, settings.catchup)
        jitter = self.scheduler.jitter.offset_for(entry, slot)
        # Lateness counts from the jittered moment: a jitter is not a misfire.
        nominal_now = now - timedelta(seconds=jitter)
        decision = catchup.decide(entry, slot, nominal_now, policy, grace, settings.catchup_limit)
        skip = decision.skip
        known = self.known.get(entry.name, _Known(ABSENT))
        if known.state is not None and known.state.paused is not None:
            # Nothing to write: a check that the pause still holds (a resume conflicts).
            # The entry is not advanced (no reserve()): it stays at the ledger's last
            # run, so after the resume what it missed follows its catch-up policy,
            # on this leader as on any other, and a database row records no run.
            claim = Claim(entry.name, known.state, known.version, check_only=True)
            return _Tick(due, entry, slot, True, claim, known.state, paused=known.state.paused)
        previous = known.state or EntryState(
            last_run_at=maybe_make_aware(entry.last_run_at),
            total_run_count=entry.total_run_count,
            epoch=self.epoch,
            updated_at=now,
        )
        next_entry = self.scheduler.reserve(entry)
        try:
            if skip:
                next_entry.total_run_count = entry.total_run_count  # a skip is not a run
            next_delay = None
            if decision.advance_to is not None:
                next_entry.last_run_at = _as_entry_time(next_entry, decision.advance_to)
                next_delay = max(0.0, (slot_after(next_entry, decision.advance_to) - now).total_seconds())
            elif jitter and isinstance(entry.schedule, schedules.schedule):
                # An interval counts from the last run, which reserve() sets to
                # now: the jittered moment. Counting from it would move every
                # next slot later by this slot's offset, period after period.
                # Count from the nominal moment of this publish instead: the
                # slot when on time, Celery's "go on from now" when late.
                next_entry.last_run_at = _as_entry_time(next_entry, max(slot, nominal_now))
            last_run_at = maybe_make_aware(next_entry.last_run_at)
        except BaseException:
            if self.scheduler.schedule.get(entry.name) is next_entry:
                self.scheduler.schedule[entry.name] = entry  # reserve() stored it: not advanced after all
            raise
        state = EntryState(
            last_run_at=last_run_at,
            total_run_count=next_entry.total_run_count,
            epoch=self.epoch,
            updated_at=now,
            slot=slot,
        )
        claim = Claim(entry.name, state, known.version)
        return _Tick(due, next_entry, slot, skip, claim, previous, why=decision.why, next_delay=next_delay)

    def _unreserve(self, tick: _Tick) -> None:
        schedule = self.scheduler.schedule
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
        records = self.scheduler.ledger.load(unknown)
        self.merge(records)
        for name in unknown:
            self.known.setdefault(name, _Known(ABSENT))
        still_due = []
        for due in dues:
            if due.entry.name in records:
                is_due, next_time = self.scheduler.entry_is_due(due.entry)
                if not is_due:
                    requeue.append(Requeue(due.entry, due.priority, next_time))
                    continue
                due = Due(due.entry, due.priority, next_time)
            still_due.append(due)
        return still_due


def _as_entry_time(entry: beat.ScheduleEntry, moment: datetime, zones: dict[tuple, Any] | None = None) -> datetime:
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

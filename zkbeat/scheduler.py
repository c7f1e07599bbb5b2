"""Leadership and the fenced ledger as a mixin for any ``celery.beat.Scheduler``.

``Scheduler`` is that mixin on Celery's base scheduler, with the schedule taken
from ``beat_schedule``. Celery's own heap and ``is_due`` decide what is due;
the mixin decides whether this replica may publish it, and records each tick
in ZooKeeper before the message goes out.
"""

from __future__ import annotations

import copy
import heapq
import logging
import os
import socket
import time
import uuid
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from celery import beat
from celery.utils.time import maybe_make_aware
from kazoo.client import KazooClient
from kazoo.exceptions import (
    ConnectionClosedError,
    ConnectionLoss,
    KazooException,
    SessionExpiredError,
    ZookeeperError,
)
from kazoo.handlers.threading import KazooTimeoutError
from kazoo.protocol.states import KazooState

from . import __version__
from ._signals import hold_shutdown_signals
from ._zookeeper import make_client
from .broker import forget as forget_broker
from .broker import is_broker_error, wait_for_broker
from .clock import measure_skew
from .conf import ENTRY_MISFIRE_OPTION, Settings, parse_misfire_grace_time, read_settings
from .election import LeaderElection
from .exceptions import ClaimConflictError, ConfigurationError, FencedError
from .ledger import ABSENT, LAYOUT_VERSION, Claim, EntryState, Ledger, LedgerRecord
from .metrics import Metrics
from .peers import LAYOUT, PeerCheck, schedule_hash

__all__ = ["LeaderScheduleMixin", "Scheduler"]

logger = logging.getLogger(__name__)

#: Errors of a ZooKeeper conversation; none of them may end beat.
ZOOKEEPER_ERRORS = (KazooException, ZookeeperError, KazooTimeoutError)
#: Of those, the ones that say "the connection broke", not "ZooKeeper said no".
CONNECTION_ERRORS = (ConnectionLoss, SessionExpiredError, ConnectionClosedError, KazooTimeoutError)
#: Due entries claimed (and then published) per pass of the beat loop: one
#: ledger transaction's worth, so in a burst of 10,000 the first message goes
#: out after 1,000 claims, not 5,000, and signals are held for one transaction.
MAX_BATCH = 1000
#: Seconds before a leader retries after ZooKeeper or the broker failed it.
RETRY_DELAY = 1.0
#: Longest a leader waits inside kombu's retry policy for the broker per pass
#: (bounded by beat's max interval), so beat's loop still turns while it is down.
BROKER_WAIT = 5.0
#: Seconds a replica that refused to lead (a newer layout is here) holds back
#: before it looks again, so that refusing replicas do not pass leadership
#: around as fast as ZooKeeper answers.
LAYOUT_RECHECK = 30.0


class LeaderScheduleMixin:
    """Publish only while leading, and only what the ledger let us claim.

    Mixed in before a ``celery.beat.Scheduler`` subclass. Overrides
    ``setup_schedule`` (connect), ``tick`` (follow or lead), ``close`` (hand
    over) and ``info``; everything else is the host scheduler's.
    """

    #: ZooKeeper client class; tests may swap it.
    Client = KazooClient

    def __init__(self, app: Any, *args: Any, **kwargs: Any) -> None:
        # No I/O here: beat builds a lazy instance only to print its banner.
        self.zk_settings: Settings = read_settings(app.conf, app.main)
        self.metrics = Metrics(self.zk_settings)
        self.zk_client: KazooClient | None = None
        self.election: LeaderElection | None = None
        self.ledger: Ledger | None = None
        self._leading = False
        self._epoch: int | None = None
        self._fence: str | None = None
        self._versions: dict[str, int] = {}
        self._unconfirmed: dict[str, tuple[beat.ScheduleEntry, beat.ScheduleEntry, datetime, EntryState]] = {}
        self._closed = False
        self._broker_down = False
        self.peers: PeerCheck | None = None
        self._refused_until = 0.0
        if kwargs.get("schedule_filename"):
            logger.debug(
                "zkbeat: ignoring -s %s: the ZooKeeper ledger replaces the shelve file", kwargs["schedule_filename"]
            )
        super().__init__(app, *args, **kwargs)

    # -- lifecycle ---------------------------------------------------------

    def setup_schedule(self) -> None:
        self._setup_host_schedule()
        self._connect()

    # Hooks for host schedulers whose schedule lives in shared storage (see
    # zkbeat.contrib.django): what only a leader may read or write goes there.

    def _setup_host_schedule(self) -> None:
        """The host scheduler's own setup, on every replica at start-up.

        A host whose setup writes shared state overrides this to do nothing
        and does that work in ``_on_promote`` instead.
        """
        super().setup_schedule()

    def _on_promote(self) -> None:
        """Leadership begins: called before the ledger is loaded and merged."""

    def _on_demote(self) -> None:
        """Leadership ends: drop whatever only a leader may still write."""

    def _connect(self) -> None:
        settings = self.zk_settings
        self.zk_client = make_client(settings, self.Client)
        self.zk_client.add_listener(self._on_connection_state)
        self.ledger = Ledger(self.zk_client, settings.root, timeout=settings.session_timeout)
        self.election = LeaderElection(
            self.zk_client,
            f"{settings.root}/{LAYOUT_VERSION}/election",
            {
                "identity": settings.identity,
                "host": socket.gethostname(),
                "pid": os.getpid(),
                "started_at": datetime.now(timezone.utc).isoformat(),
                "version": __version__,
                # For rolling upgrades: a newer release sees our layout, and
                # the leader (and `zkbeat status`) sees whose schedule differs.
                "layout": LAYOUT,
                "schedule_hash": self._schedule_hash(),
            },
        )
        self.peers = PeerCheck(
            self.zk_client, settings.root, self.election.path, self._schedule_hash(), timeout=settings.session_timeout
        )
        logger.info("zkbeat: joining the election at %s%s as %s", settings.hosts, settings.root, settings.identity)
        # start_async: an unreachable ZooKeeper is retried in the background;
        # until it answers this replica is simply a follower.
        self.zk_client.start_async()
        self.election.start()
        self.metrics.serve()

    def _on_connection_state(self, state: str) -> None:
        """kazoo's listener: record and log only (it runs on kazoo's thread)."""
        self.metrics.connection(state)
        if self._closed:
            return  # our own close() ends the session: nothing to warn about
        identity, epoch = self.zk_settings.identity, self._epoch
        if state == KazooState.SUSPENDED:
            logger.warning("zkbeat: connection to ZooKeeper suspended; not publishing (%s, epoch %s)", identity, epoch)
        elif state == KazooState.LOST:
            logger.warning("zkbeat: ZooKeeper session lost; rejoining the election (%s, epoch %s)", identity, epoch)
        elif self._epoch is not None or self._leading:
            logger.info("zkbeat: reconnected to ZooKeeper (%s)", identity)

    def close(self) -> None:
        """Hand leadership over first (delete the candidate), then close.

        Celery calls this twice on SIGTERM; the second call only repeats the
        host scheduler's close, which is idempotent.
        """
        if not self._closed:
            self._closed = True
            if self._leading:
                self._demote("shutting down")
            if self.election is not None:
                self.election.close()
            self.metrics.close()
            if self.zk_client is not None:
                try:
                    self.zk_client.stop()
                    self.zk_client.close()
                except Exception:  # noqa: BLE001 - shutdown must finish
                    logger.debug("zkbeat: error stopping the ZooKeeper client", exc_info=True)
        super().close()

    @property
    def info(self) -> str:
        s = self.zk_settings
        return f"    . zkbeat -> {s.hosts}{s.root} as {s.identity} (session {s.session_timeout:g}s)"

    # -- the loop ----------------------------------------------------------

    def tick(self, *args: Any, **kwargs: Any) -> float:
        """Follow (wait for leadership) or lead (claim, then publish what is due)."""
        election = self.election
        if election is None or self._closed:
            return self.max_interval
        if not election.is_leader:
            if self._leading:
                self._demote("lost leadership")
            # Wake the moment the election's watch makes us leader; beat's
            # loop comes straight back because we return 0.
            election.wait_for_leadership(self.max_interval)
            return 0
        try:
            wait = self._refuse_to_lead()
            if wait is not None:
                return wait
            if not self._leading or self._epoch != election.epoch:
                self._promote()
            return self._leader_tick()
        except FencedError as exc:
            logger.warning(
                "zkbeat: claim fenced, publishing nothing (%s, epoch %s): %s",
                self.zk_settings.identity,
                self._epoch,
                exc,
            )
            self._demote("fenced")
            election.recheck()
            return 0
        except CONNECTION_ERRORS as exc:
            # The election hears about the connection too; re-verify before
            # leading again (same session: we resume, new one: we rejoin).
            logger.warning("zkbeat: connection to ZooKeeper interrupted while leading (epoch %s): %r", self._epoch, exc)
            self._demote("connection interrupted")
            election.recheck()
            return 0
        except ZOOKEEPER_ERRORS as exc:
            # Name the root: kazoo's errors (NoAuth above all) never say where.
            logger.warning(
                "zkbeat: ZooKeeper error while leading %s (epoch %s): %r; stepping down",
                self.zk_settings.root,
                self._epoch,
                exc,
            )
            self._demote("ZooKeeper error")
            election.step_down()
            return RETRY_DELAY
        except Exception:  # noqa: BLE001 - beat outlives any one bad pass; another replica may do better
            logger.exception("zkbeat: unexpected error while leading (epoch %s); stepping down", self._epoch)
            self._demote("unexpected error")
            election.step_down()
            return RETRY_DELAY

    def _promote(self) -> None:
        assert self.election is not None and self.ledger is not None
        started = time.monotonic()
        epoch, fence = self.election.epoch, self.election.candidate
        if epoch is None or fence is None:
            raise FencedError("the election has no candidate for this replica any more")
        self._on_promote()
        self.ledger.ensure()
        records = self.ledger.load()
        self._versions = {}
        self._merge(records)
        for name in self.schedule:
            self._versions.setdefault(name, ABSENT)
        self._heap = None
        self._leading, self._epoch, self._fence = True, epoch, fence
        self.metrics.leadership(True, epoch)
        self.metrics.ledger_loaded(time.monotonic() - started)
        logger.info(
            "zkbeat: became leader (epoch %s) as %s; ledger of %d entries loaded in %.1f ms",
            epoch,
            self.zk_settings.identity,
            len(records),
            (time.monotonic() - started) * 1000,
        )
        self._check_clock()

    def _check_clock(self) -> None:
        """Warn when this new leader's clock is far from ZooKeeper's (see zkbeat.clock)."""
        path = f"{self.zk_settings.root}/{LAYOUT_VERSION}/clock"
        try:
            skew = measure_skew(self.zk_client, path, self.zk_settings.identity)
        except ZOOKEEPER_ERRORS as exc:
            logger.debug("zkbeat: could not compare clocks with ZooKeeper: %r", exc)
            return
        if skew.worth_a_warning:
            logger.warning(
                "zkbeat: this leader's clock is %s (%s, epoch %s); the schedule runs on the leader's clock, so "
                "ticks come late or early by that much across a handover: keep the replicas' clocks in sync (NTP)",
                skew.describe(),
                self.zk_settings.identity,
                self._epoch,
            )

    def _schedule_hash(self) -> str | None:
        """The digest of this replica's schedule for its candidate data (zkbeat.peers)."""
        try:
            return schedule_hash(self.schedule)
        except Exception:  # noqa: BLE001 - a host whose schedule cannot be read yet just does not say
            logger.debug("zkbeat: could not hash the schedule", exc_info=True)
            return None

    def _refuse_to_lead(self) -> float | None:
        """Seconds to hold back instead of leading while a newer zkbeat layout is here.

        Checked before taking over and, while leading, whenever the root or
        the candidates change (zkbeat.peers). A refusing replica steps down to
        the back of the line, so that a newer release's candidate can lead,
        and looks again after LAYOUT_RECHECK; until then it publishes nothing
        even if the line comes round to it again.
        """
        if self.peers is None:
            return None
        now = time.monotonic()
        if now < self._refused_until:
            return min(self.max_interval, self._refused_until - now)
        # Before taking over (or over again, under a new epoch: watches die
        # with a session) read everything; while leading, only what changed.
        reason = self.peers.check(force=not self._leading or self._epoch != self.election.epoch)
        if reason is None:
            return None
        logger.error("zkbeat: refusing to lead (%s): %s", self.zk_settings.identity, reason)
        if self._leading:
            self._demote("a newer zkbeat layout is here")
        self._refused_until = now + LAYOUT_RECHECK
        self.election.step_down()
        return min(self.max_interval, LAYOUT_RECHECK)

    def _demote(self, reason: str) -> None:
        logger.info("zkbeat: stopped leading (%s, epoch %s): %s", self.zk_settings.identity, self._epoch, reason)
        self.metrics.leadership(False, None)
        if self._unconfirmed:
            logger.warning(
                "zkbeat: claims whose commit was never confirmed are published when this replica leads "
                "again, unless another leader has run those entries since: %s",
                ", ".join(sorted(self._unconfirmed)),
            )
        self._leading = False
        self._epoch = self._fence = None
        self._versions = {}
        self._heap = None
        self._on_demote()

    def _settle_unconfirmed(self, records: dict[str, LedgerRecord]) -> None:
        """Publish our claims whose commit landed although its reply was lost.

        If the ledger still holds exactly the state we wrote, the commit went
        through and nobody has run the entry since (any leader in between saw
        the tick as run and skipped it), so publishing it now, late, is the
        only way it is not lost. Anything else means it was not ours to send.
        """
        producer = self._producer(len(self._unconfirmed))
        if producer is None:
            return
        with hold_shutdown_signals():
            for name, (entry, next_entry, slot, state) in list(self._unconfirmed.items()):
                del self._unconfirmed[name]
                record = records.get(name)
                if record is None or record.state != state:
                    logger.info("zkbeat: unconfirmed claim of %s at %s did not commit", name, slot.isoformat())
                    continue
                logger.info("zkbeat: claim of %s at %s had committed; publishing it now", name, slot.isoformat())
                self._versions[name] = record.version
                if self._publish(entry, slot, producer):
                    if name in self.schedule:
                        self.schedule[name] = next_entry
                else:
                    self._revert(entry, Claim(name, state, record.version), record.version)
        self._heap = None

    def _merge(self, records: dict[str, LedgerRecord]) -> None:
        """Trust the ledger over local memory: it is what the last leader did."""
        schedule = self.schedule  # once: a database scheduler's property may query
        zones: dict[tuple, Any] = {}
        for name, record in records.items():
            entry = schedule.get(name)
            if entry is None:
                continue
            self._versions[name] = record.version
            state = record.state
            if state is not None:
                entry.last_run_at = _as_entry_time(entry, state.last_run_at, zones)
                entry.total_run_count = state.total_run_count

    def _leader_tick(self) -> float:
        """Celery's tick, batched: claim every due entry at once, then publish."""
        if self._unconfirmed:
            self._settle_unconfirmed(self.ledger.load(list(self._unconfirmed)))
        if self._heap is None or not self.schedules_equal(self.old_schedulers, self.schedule):
            self.old_schedulers = copy.copy(self.schedule)
            self.populate_heap()
        heap = self._heap
        if not heap:
            return self.max_interval
        due: list[tuple[Any, beat.ScheduleEntry, float]] = []
        later = []
        while heap and len(due) < MAX_BATCH:
            event = heap[0]
            entry = event[2]
            if event[0] > self._when(entry, 0):
                break
            heapq.heappop(heap)
            try:
                is_due, next_time = self.is_due(entry)
            except Exception:  # noqa: BLE001 - one broken entry must not stop the rest
                is_due, next_time = self._is_due_failed(entry)
            if is_due:
                due.append((event, entry, next_time))
            else:
                delay = next_time if isinstance(next_time, (int, float)) else self.max_interval
                later.append(beat.event_t(self._when(entry, delay), event[1], entry))
        for event in later:
            heapq.heappush(heap, event)
        if due:
            self._run_due(due)
        if len(due) >= MAX_BATCH:
            return 0
        if not heap:
            return self.max_interval
        top = heap[0]
        return max(0.0, min(top[0] - self._when(top[2], 0), self.max_interval))

    def _run_due(self, due: list[tuple[Any, beat.ScheduleEntry, float]]) -> None:
        """Claim the due entries in one fenced transaction, publish what committed."""
        assert self.ledger is not None and self._fence is not None
        due = self._recheck_unknown(due)
        now = datetime.now(timezone.utc)
        ticks = [self._plan(event, entry, next_time, now) for event, entry, next_time in due]
        if not ticks:
            return
        producer = self._producer(len(ticks))  # the broker answers, before anything is claimed
        if producer is None:
            self._requeue([tick.retry_event(self, RETRY_DELAY) for tick in ticks])
            return
        requeue = []
        with hold_shutdown_signals():
            try:
                result = self.ledger.claim([tick.claim for tick in ticks], self._fence)
            except ZOOKEEPER_ERRORS:
                # The commit may or may not have landed; remember what we wrote
                # so that, leading again, we can tell whether it did.
                for tick in ticks:
                    if not tick.skip:
                        self._unconfirmed[tick.entry.name] = (tick.entry, tick.next_entry, tick.slot, tick.claim.state)
                self._requeue([tick.retry_event(self, RETRY_DELAY) for tick in ticks])
                raise
            self.metrics.claims("committed", len(result.committed))
            if result.error is not None:
                kind = "fenced" if isinstance(result.error, FencedError) else "conflicted"
                self.metrics.claims(kind, len(ticks) - len(result.committed))
            for tick in ticks:
                version = result.committed.get(tick.entry.name)
                if version is None:
                    requeue.append(tick.retry_event(self, 0))
                    continue
                self._versions[tick.entry.name] = version
                if tick.skip:
                    logger.warning(
                        "zkbeat: skipping %s: its tick at %s is %.1fs late, past its misfire grace time (%s, epoch %s)",
                        tick.entry.name,
                        tick.slot.isoformat(),
                        (now - tick.slot).total_seconds(),
                        self.zk_settings.identity,
                        self._epoch,
                    )
                elif self._broker_down or not self._publish(tick.entry, tick.slot, producer):
                    # Once the broker is gone the rest of the batch is withdrawn
                    # unsent, instead of each waiting out kombu's retries in turn.
                    self._revert(tick.entry, tick.claim, version)
                    requeue.append(tick.retry_event(self, RETRY_DELAY))
                    continue
                self.schedule[tick.entry.name] = tick.next_entry
                requeue.append(
                    beat.event_t(self._when(tick.next_entry, tick.next_time), tick.event[1], tick.next_entry)
                )
        self._requeue(requeue)
        if isinstance(result.error, ClaimConflictError):
            self._resolve_conflict(result.error.names)
        if isinstance(result.error, FencedError):
            raise result.error

    def _producer(self, waiting: int) -> Any:
        """Beat's producer once kombu has (re)connected to the broker; None if it is down.

        The wait runs under kombu's retry policy (zkbeat.broker), at most
        BROKER_WAIT seconds per pass, before anything is claimed: ticks that
        come due meanwhile stay due, unclaimed, and go out once it is back.
        """
        error = wait_for_broker(self.connection, min(self.max_interval, BROKER_WAIT))
        if error is None:
            try:
                producer = self.producer
            except Exception as exc:  # noqa: BLE001 - a broker outage must not end beat
                error = exc
        if error is not None:
            if not self._broker_down:
                logger.error(
                    "zkbeat: broker unreachable (%r); %d due ticks wait, unclaimed, while kombu reconnects (%s)",
                    error,
                    waiting,
                    self.zk_settings.identity,
                )
            self._broker_down = True
            forget_broker(self)
            return None
        if self._broker_down:
            logger.info("zkbeat: broker reachable again; publishing what came due (%s)", self.zk_settings.identity)
            self._broker_down = False
        return producer

    def _plan(self, event: Any, entry: beat.ScheduleEntry, next_time: float, now: datetime) -> _Tick:
        """Decide publish-or-skip for one due entry and the ledger state to claim."""
        slot = tick_slot(entry)
        grace = self._grace_time(entry)
        skip = grace is not None and (now - slot).total_seconds() > grace
        next_entry = next(entry)
        if skip:
            next_entry.total_run_count = entry.total_run_count  # a skip is not a run
        state = EntryState(
            last_run_at=maybe_make_aware(next_entry.last_run_at),
            total_run_count=next_entry.total_run_count,
            epoch=self._epoch,
            updated_at=now,
            slot=slot,
        )
        claim = Claim(entry.name, state, self._versions.get(entry.name, ABSENT))
        return _Tick(event, entry, next_time, next_entry, slot, skip, claim)

    def _recheck_unknown(self, due: list[tuple[Any, beat.ScheduleEntry, float]]) -> list:
        """Entries that appeared after we became leader: read their ledger state first.

        One may have been run by an earlier leader; if the ledger says so it is
        not due after all, and goes back on the heap.
        """
        unknown = [entry.name for _, entry, _ in due if entry.name not in self._versions]
        if not unknown:
            return due
        records = self.ledger.load(unknown)
        self._merge(records)
        for name in unknown:
            self._versions.setdefault(name, ABSENT)
        still_due, later = [], []
        for event, entry, next_time in due:
            if entry.name in records:
                is_due, next_time = self.is_due(entry)
                if not is_due:
                    later.append(beat.event_t(self._when(entry, next_time), event[1], entry))
                    continue
            still_due.append((event, entry, next_time))
        self._requeue(later)
        return still_due

    def _requeue(self, events: list[Any]) -> None:
        if self._heap is not None:
            for event in events:
                heapq.heappush(self._heap, event)

    def _resolve_conflict(self, names: list[str]) -> None:
        """Someone else wrote these entries: re-read them and trust what they say."""
        records = self.ledger.load(names)
        for name in names:
            if name not in self._unconfirmed:
                logger.warning("zkbeat: ledger entry %s changed underneath epoch %s; re-reading it", name, self._epoch)
            record = records.get(name)
            self._versions[name] = record.version if record else ABSENT
        self._merge(records)
        if self._unconfirmed:
            self._settle_unconfirmed(records)
        self._heap = None

    def _revert(self, entry: beat.ScheduleEntry, claim: Claim, version: int) -> None:
        """Undo a claim whose publish failed, so the tick stays due."""
        previous = EntryState(
            last_run_at=maybe_make_aware(entry.last_run_at),
            total_run_count=entry.total_run_count,
            epoch=self._epoch,
            updated_at=datetime.now(timezone.utc),
        )
        try:
            result = self.ledger.claim([Claim(entry.name, previous, version)], self._fence)
        except ZOOKEEPER_ERRORS as exc:
            result = None
            error: Exception | None = exc
        else:
            error = result.error
        if error is None and result is not None:
            self._versions[entry.name] = result.committed[entry.name]
            logger.info("zkbeat: %s will be retried: its claim is withdrawn", entry.name)
        else:
            logger.error(
                "zkbeat: the tick of %s at %s was recorded but not published, and could not be withdrawn (%r)",
                entry.name,
                claim.state.slot,
                error,
            )
            self._versions.pop(entry.name, None)

    def _publish(self, entry: beat.ScheduleEntry, slot: datetime, producer: Any) -> bool:
        """Send one claimed tick. False only when the broker was unreachable.

        Then the caller withdraws the claim and the tick stays due. A message
        the broker can never take (arguments that do not serialise, say) is
        logged and the tick counts as run, as celery beat itself does: trying
        it again every second would fail the same way forever.
        """
        slot_text = slot.isoformat()
        logger.info(
            "Scheduler: Sending due task %s (%s) slot %s epoch %s", entry.name, entry.task, slot_text, self._epoch
        )
        try:
            options = dict(entry.options)
            options.pop(ENTRY_MISFIRE_OPTION, None)
            headers = dict(options.get("headers") or {})
            headers.update({"zkbeat-entry": entry.name, "zkbeat-slot": slot_text, "zkbeat-epoch": self._epoch})
            options["headers"] = headers
            options["task_id"] = task_id_for(self.zk_settings.root, entry.name, slot)
            sending = copy.copy(entry)
            sending.options = options
            self.apply_async(sending, producer=producer, advance=False)
        except Exception as exc:  # noqa: BLE001 - a broker error must not end beat
            self.metrics.publish_error()
            if is_broker_error(exc, self.__dict__.get("connection")):
                logger.error("zkbeat: could not publish %s (slot %s): %r", entry.name, slot_text, exc)
                self._broker_down = True
                forget_broker(self)
                return False
            logger.error(
                "zkbeat: %s (slot %s) cannot be sent and is dropped, as celery beat would: %r",
                entry.name,
                slot_text,
                exc,
            )
            return True
        self.metrics.published()
        return True

    def _grace_time(self, entry: beat.ScheduleEntry) -> float | None:
        if ENTRY_MISFIRE_OPTION in (entry.options or {}):
            try:
                return parse_misfire_grace_time(
                    f"{entry.name}.options.{ENTRY_MISFIRE_OPTION}", entry.options[ENTRY_MISFIRE_OPTION]
                )
            except ConfigurationError as exc:
                logger.error("zkbeat: %s; using zkbeat_misfire_grace_time instead", exc)
        return self.zk_settings.misfire_grace_time


@dataclass
class _Tick:
    """One due entry on its way through claim and publish."""

    event: Any
    entry: beat.ScheduleEntry
    next_time: float
    next_entry: beat.ScheduleEntry
    slot: datetime
    skip: bool
    claim: Claim

    def retry_event(self, scheduler: beat.Scheduler, delay: float) -> Any:
        """The heap event that brings the unchanged entry back after ``delay``."""
        return beat.event_t(scheduler._when(self.entry, delay), self.event[1], self.entry)


def tick_slot(entry: beat.ScheduleEntry) -> datetime:
    """The UTC time entry's due tick was planned for, from its last run alone.

    The schedule's clock is pinned while it is asked, so every replica that
    holds the same ``last_run_at`` (from the ledger) computes the same slot
    to the microsecond; the slot names the tick in headers and task ids.
    """
    last_run_at = entry.last_run_at
    pinned = datetime.now(timezone.utc)
    try:
        schedule = copy.copy(entry.schedule)
        schedule.nowfun = lambda: pinned
        slot = pinned + schedule.remaining_estimate(last_run_at)
    except Exception:  # noqa: BLE001 - custom schedules may not support this
        slot = pinned
    return maybe_make_aware(slot).astimezone(timezone.utc)


def task_id_for(root: str, name: str, slot: datetime) -> str:
    """A task id that is the same for the same tick on every replica (uuid5)."""
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"zkbeat:{root}:{name}:{slot.isoformat()}"))


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


class Scheduler(LeaderScheduleMixin, beat.Scheduler):
    """Celery's scheduler (schedule from ``beat_schedule``) with zkbeat's leadership.

    ``celery -A proj beat --scheduler zkbeat.Scheduler``
    """

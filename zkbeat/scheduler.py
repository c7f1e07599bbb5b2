"""Leadership and the fenced ledger as a mixin for any ``celery.beat.Scheduler``.

``Scheduler`` is that mixin on Celery's base scheduler, with the schedule taken
from ``beat_schedule``. Celery's own heap and ``is_due`` decide what is due;
the mixin decides whether this replica may publish it, and one
:class:`~zkbeat.term.Term` per epoch of leadership records each tick in
ZooKeeper before the message goes out. This module is the glue to Celery:
lifecycle, the loop's error policy, and the batched scan of beat's heap.
"""

from __future__ import annotations

import contextlib
import heapq
import logging
import os
import socket
import time
from collections.abc import Iterator
from datetime import datetime, timezone
from typing import Any

from celery import beat
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
from kombu.utils.objects import cached_property

from . import __version__
from ._signals import hold_shutdown_signals, inside_shutdown_handler
from ._zookeeper import make_client
from .broker import beat_connection
from .clock import measure_skew
from .conf import Settings, read_settings
from .election import Fence, LeaderElection
from .exceptions import FencedError
from .jitter import Jitter
from .ledger import LAYOUT_VERSION, EntryState, Ledger
from .liveness import Beacon, Watcher, local_address
from .metrics import Metrics
from .peers import LAYOUT, PeerCheck, schedule_hash
from .pending import PendingClaim, release
from .term import RETRY_DELAY, SIGNAL_HOLD_LIMIT, Due, Requeue, Term
from .ticks import task_id_for, tick_slot
from .watchdog import Watchdog

__all__ = ["LeaderScheduleMixin", "Scheduler", "task_id_for", "tick_slot"]

logger = logging.getLogger(__name__)

#: Errors of a ZooKeeper conversation; none of them may end beat.
ZOOKEEPER_ERRORS = (KazooException, ZookeeperError, KazooTimeoutError)
#: Of those, the ones that say "the connection broke", not "ZooKeeper said no".
CONNECTION_ERRORS = (ConnectionLoss, SessionExpiredError, ConnectionClosedError, KazooTimeoutError)
#: Due entries claimed (and then published) per pass of the beat loop: one
#: ledger transaction's worth, so in a burst of 10,000 the first message goes
#: out after 1,000 claims, not 5,000, and signals are held for one transaction.
#: A kill -9 while a batch is being sent loses the batch's unsent ticks.
MAX_BATCH = 1000
#: Seconds a replica that refused to lead (a newer layout is here) holds back
#: before it looks again, so that refusing replicas do not pass leadership
#: around as fast as ZooKeeper answers.
LAYOUT_RECHECK = 30.0
#: Unexpected errors in a row before a leader steps down: one bad pass ends
#: the term and starts a fresh one; a leader that keeps failing lets another
#: replica try, instead of passing leadership around once a second.
STEP_DOWN_AFTER = 3
#: Heap priority of every entry (Celery's own value).
_PRIORITY = 5


class LeaderScheduleMixin:
    """Publish only while leading, and only what the ledger let us claim.

    Mixed in before a ``celery.beat.Scheduler`` subclass. Overrides
    ``setup_schedule`` (connect), ``tick`` (follow or lead), ``populate_heap``
    (one entry that raises must not stop the rest), ``close`` (hand over) and
    ``info``; entries advance through the host's own ``reserve()``.

    Hosts whose schedule lives in shared storage (``zkbeat.contrib.django``)
    override the hooks below and read ``leading``; they need no other state.
    """

    #: ZooKeeper client class; tests may swap it.
    Client = KazooClient

    def __init__(self, app: Any, *args: Any, **kwargs: Any) -> None:
        # No I/O here: beat builds a lazy instance only to print its banner.
        self.zk_settings: Settings = read_settings(app.conf, app.main)
        self.metrics = Metrics(self.zk_settings)
        #: Each tick's publish moment after its slot (zkbeat.jitter); off by default.
        self.jitter = Jitter(self.zk_settings.root, self.zk_settings.jitter)
        self.zk_client: KazooClient | None = None
        self.election: LeaderElection | None = None
        self.ledger: Ledger | None = None
        self.peers: PeerCheck | None = None
        #: Liveness socket and the watch on the predecessor's (zkbeat.liveness).
        self.beacon: Beacon | None = None
        self.watcher: Watcher | None = None
        self.watchdog: Watchdog | None = None
        #: The current epoch of leadership, None while following.
        self.term: Term | None = None
        #: Claims of an ended term whose commit was never confirmed (see zkbeat.term).
        self._pending: list[PendingClaim] = []
        self._closed = False
        #: beat's loop has called tick() (see close()).
        self._ticked = False
        self._refused_until = 0.0
        self._failures = 0
        #: Entries whose schedule raised, with the error last logged for each.
        self._broken: dict[tuple[str, str], str] = {}
        if kwargs.get("schedule_filename"):
            logger.debug(
                "zkbeat: ignoring -s %s: the ZooKeeper ledger replaces the shelve file", kwargs["schedule_filename"]
            )
        super().__init__(app, *args, **kwargs)

    # -- hooks for hosts whose schedule is shared storage ------------------

    def setup_host_schedule(self) -> None:
        """The host scheduler's own setup, on every replica at start-up.

        A host whose setup writes shared state overrides this to do nothing
        and does that work once it leads (``on_leadership_start``).
        """
        super().setup_schedule()

    def on_leadership_start(self) -> None:
        """Leadership begins: called before the ledger is loaded and merged."""

    def on_leadership_end(self) -> None:
        """Leadership ends: drop whatever only a leader may still write."""

    def keeps_own_run(self, entry: beat.ScheduleEntry, state: EntryState) -> bool:
        """True to keep the entry's own last run over the ledger's ``state``.

        The ledger is the truth by default; a host whose rows can vouch for a
        newer run (an operator re-armed a one-off) says so here.
        """
        return False

    def schedule_replaced(self) -> None:
        """The host rebuilt ``schedule``: read each entry's ledger state before its next claim."""
        if self.term is not None:
            self.term.known.clear()
        self.invalidate_heap()

    def invalidate_heap(self) -> None:
        """Rebuild beat's heap from the schedule at the next pass."""
        self._heap = None

    @property
    def leading(self) -> bool:
        """True while this replica leads under its current term (what only a leader may write)."""
        election = self.election
        return (
            self.term is not None
            and not self._closed
            and election is not None
            and election.leadership == self.term.fence
        )

    @property
    def closed(self) -> bool:
        return self._closed

    # -- lifecycle ---------------------------------------------------------

    def setup_schedule(self) -> None:
        self.setup_host_schedule()
        self._connect()

    def _connect(self) -> None:
        settings = self.zk_settings
        self.zk_client = make_client(settings, self.Client)
        self.zk_client.add_listener(self._on_connection_state)
        self.ledger = Ledger(self.zk_client, settings.root, timeout=settings.session_timeout)
        self.beacon = self._open_beacon()
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
                **(self.beacon.announcement.as_data() if self.beacon is not None else {}),
            },
        )
        if self.beacon is not None:
            self.watcher = Watcher(self.zk_client).start()
            self.election.add_predecessor_listener(self.watcher.follow)
        election = self.election
        self.watchdog = Watchdog(
            settings.stall_timeout,
            step_down=lambda: election.step_down(hold=True),
            resume=election.resume,
            describe=lambda: f" ({settings.identity}, epoch {self.term.epoch if self.term else None})",
        ).start()
        self.peers = PeerCheck(
            self.zk_client, settings.root, self.election.path, self._schedule_hash(), timeout=settings.session_timeout
        )
        logger.info("zkbeat: joining the election at %s%s as %s", settings.hosts, settings.root, settings.identity)
        # start_async: an unreachable ZooKeeper is retried in the background;
        # until it answers this replica is simply a follower.
        self.zk_client.start_async()
        self.election.start()
        self.metrics.serve()

    def _open_beacon(self) -> Beacon | None:
        """This replica's liveness socket, or None when it is off or cannot bind (then the session decides)."""
        settings = self.zk_settings
        if not settings.liveness:
            return None
        host, port = settings.liveness_address or (local_address(settings.hosts) or "127.0.0.1", 0)
        try:
            beacon = Beacon(host, port).start()
        except OSError as exc:
            logger.warning(
                "zkbeat: cannot listen on %s:%s for liveness (%r); a crash of this replica is seen at its "
                "session timeout instead (set zkbeat_liveness_address)",
                host,
                port,
                exc,
            )
            return None
        logger.info("zkbeat: liveness socket on %s:%s", beacon.host, beacon.port)
        return beacon

    @cached_property
    def connection(self) -> Any:
        """Beat's broker connection, its publish bounded on Redis (zkbeat.broker.beat_connection)."""
        return beat_connection(self.app)

    def _on_connection_state(self, state: str) -> None:
        """kazoo's listener: record and log only (it runs on kazoo's thread)."""
        self.metrics.connection(state)
        if self._closed:
            return  # our own close() ends the session: nothing to warn about
        term = self.term
        identity, epoch = self.zk_settings.identity, term.epoch if term is not None else None
        if state == KazooState.SUSPENDED:
            logger.warning("zkbeat: connection to ZooKeeper suspended; not publishing (%s, epoch %s)", identity, epoch)
        elif state == KazooState.LOST:
            logger.warning("zkbeat: ZooKeeper session lost; rejoining the election (%s, epoch %s)", identity, epoch)
        elif term is not None:
            logger.info("zkbeat: reconnected to ZooKeeper (%s)", identity)

    def close(self) -> None:
        """Hand leadership over first (delete the candidate), then close.

        Celery calls this twice on SIGTERM; the second call only repeats the
        host scheduler's close, which is idempotent. The first, from inside
        celery beat's signal handler, does nothing (see
        zkbeat._signals.inside_shutdown_handler): the handler's SystemExit
        reaches ``Service.start`` at once, and its ``finally`` closes.
        """
        if getattr(self, "_ticked", False) and inside_shutdown_handler():
            # Only once beat's loop runs: before it, Service.start has no
            # ``finally`` around it yet, and nothing of ours holds a lock.
            logger.debug("zkbeat: shutdown signal: closing once beat's loop has unwound")
            return
        if not self._closed:
            # A second SIGTERM or Ctrl-C would raise SystemExit halfway through
            # (claims not written back, the candidate left): held until the end,
            # at most SIGNAL_HOLD_LIMIT, so that a close() that hangs can be cut.
            with hold_shutdown_signals(limit=SIGNAL_HOLD_LIMIT):
                if self.leading:
                    try:
                        self.sync()  # still leading: a host's own record (database rows) is written
                    except Exception:  # noqa: BLE001 - the ledger holds the runs; shutdown must finish
                        logger.warning("zkbeat: could not sync the schedule at shutdown", exc_info=True)
                self._closed = True
                self._shut_down()
                super().close()
            return
        super().close()

    def _shut_down(self) -> None:
        if self.term is not None:
            self._end_term("shutting down")
        self._release_pending(final=True)
        for part in (self.watchdog, self.watcher):
            if part is not None:
                part.close()
        if self.election is not None:
            self.election.close()
        if self.beacon is not None:
            self.beacon.close()  # after the candidate is gone: nobody needs to delete it
        self.metrics.close()
        if self.zk_client is not None:
            try:
                self.zk_client.stop()
                self.zk_client.close()
            except Exception:  # noqa: BLE001 - shutdown must finish
                logger.debug("zkbeat: error stopping the ZooKeeper client", exc_info=True)

    @property
    def info(self) -> str:
        s = self.zk_settings
        return f"    . zkbeat -> {s.hosts}{s.root} as {s.identity} (session {s.session_timeout:g}s)"

    # -- the loop ----------------------------------------------------------

    def tick(self, *args: Any, **kwargs: Any) -> float:
        """Follow (wait for leadership) or lead (claim, then publish what is due).

        No error ends beat's loop. What a leader's pass may raise, and what
        the replica does then:

        ===============================  =====================================  =======
        raised in a leader's pass        action                                 returns
        ===============================  =====================================  =======
        FencedError                      end the term, election re-checks       0
        ZooKeeper connection errors      end the term (claims in flight are     0
        (ConnectionLoss, SessionExpired, kept pending), election re-checks
        closed, timeout)
        other ZooKeeper errors (NoAuth)  end the term, step down, naming root   1 s
        any other exception              end the term; after STEP_DOWN_AFTER    1 s
                                         in a row, step down
        ===============================  =====================================  =======

        Handled inside a pass and never raised: an entry whose schedule or
        clock raises, or whose name cannot be a znode (logged once, left out,
        retried every ``max_interval``); an entry ZooKeeper refuses to write
        (someone else's ACL: left out for ``max_interval``, the rest run); an
        unreachable broker (nothing claimed, ticks stay due); a message the
        broker refuses (logged, counted as run, as celery beat does); a claim
        that conflicts (the rolled-back batch re-read; repeated conflicts back
        off); a send hung on a silent broker (SIGTERM held at most
        ``zkbeat.term.SIGNAL_HOLD_LIMIT``; the watchdog steps a hung leader
        down after ``zkbeat_stall_timeout``).
        """
        self._ticked = True
        election = self.election
        if election is None or self._closed:
            return self.max_interval
        if self.watchdog is not None:
            self.watchdog.turned()  # the loop turns: a replica the watchdog held out may contend again
        fence = election.leadership  # one read: whether we lead, and under which candidate
        if fence is None:
            if self.term is not None:
                self._end_term("lost leadership")
            self._release_pending()
            # Wake the moment the election's watch makes us leader; beat's
            # loop comes straight back because we return 0. Claims still to
            # write back are tried again within a second, not a max_interval.
            election.wait_for_leadership(RETRY_DELAY if self._pending else self.max_interval)
            return 0
        with self.leader_pass():
            interval = self._leader_pass(election, fence)
        # Outside the timed pass: an idle leader waiting for its next entry is not a hung one.
        return self._idle(interval)

    @contextlib.contextmanager
    def leader_pass(self) -> Iterator[None]:
        """Mark leader work that the watchdog times (zkbeat.watchdog).

        ``tick()`` marks its own leader passes; a host that does leader work
        of its own before them (a database read) marks that too, so a query
        that hangs there steps the replica down as well.
        """
        watchdog = self.watchdog
        if watchdog is None:
            yield
            return
        watchdog.entered()
        try:
            yield
        finally:
            watchdog.left()

    def _leader_pass(self, election: LeaderElection, fence: Fence) -> float:
        """One leader's pass of tick(), under the error policy in tick()'s table."""
        epoch = self.term.epoch if self.term is not None else fence.epoch
        try:
            wait = self._refuse_to_lead(fence)
            if wait is not None:
                return wait
            if self.term is None or self.term.fence != fence:
                if self.term is not None:
                    self._end_term("a new epoch began")
                self._begin_term(fence)
            epoch = fence.epoch
            interval = self._lead()
            self._failures = 0
            return interval
        except FencedError as exc:
            logger.warning(
                "zkbeat: claim fenced, publishing nothing (%s, epoch %s): %s", self.zk_settings.identity, epoch, exc
            )
            self._end_term("fenced")
            election.recheck()
            return 0
        except CONNECTION_ERRORS as exc:
            # The election hears about the connection too; re-verify before
            # leading again (same session: we resume, new one: we rejoin).
            logger.warning("zkbeat: connection to ZooKeeper interrupted while leading (epoch %s): %r", epoch, exc)
            self._end_term("connection interrupted")
            election.recheck()
            return 0
        except ZOOKEEPER_ERRORS as exc:
            # Name the root: kazoo's errors (NoAuth above all) never say where.
            logger.warning(
                "zkbeat: ZooKeeper error while leading %s (epoch %s): %r; stepping down",
                self.zk_settings.root,
                epoch,
                exc,
            )
            self._end_term("ZooKeeper error")
            election.step_down()
            return RETRY_DELAY
        except Exception:  # noqa: BLE001 - beat outlives any one bad pass
            self._failures += 1
            if self._failures < STEP_DOWN_AFTER:
                logger.exception(
                    "zkbeat: unexpected error while leading (epoch %s); starting the term afresh in %gs",
                    epoch,
                    RETRY_DELAY,
                )
                self._end_term("unexpected error")
                return RETRY_DELAY
            logger.exception(
                "zkbeat: unexpected error while leading (epoch %s), %d passes in a row; stepping down",
                epoch,
                self._failures,
            )
            self._failures = 0
            self._end_term("unexpected errors")
            election.step_down()
            return RETRY_DELAY

    def _begin_term(self, fence: Fence) -> None:
        assert self.ledger is not None
        started = time.monotonic()
        self.on_leadership_start()
        inherited = {claim.name: claim for claim in self._pending}
        self._pending = []
        try:
            self.term = Term.begin(self, fence, inherited)
        except BaseException:
            self._pending = list(inherited.values())  # what the term did not settle: kept for the next try
            raise
        self._heap = None
        self.metrics.leadership(True, fence.epoch)
        self.metrics.ledger_loaded(time.monotonic() - started)
        logger.info(
            "zkbeat: became leader (epoch %s) as %s; ledger of %d entries loaded in %.1f ms",
            fence.epoch,
            self.zk_settings.identity,
            self.term.records_loaded,
            (time.monotonic() - started) * 1000,
        )
        self._check_clock(fence.epoch)

    def _end_term(self, reason: str) -> None:
        term, self.term = self.term, None
        if term is None:
            return
        logger.info("zkbeat: stopped leading (%s, epoch %s): %s", self.zk_settings.identity, term.epoch, reason)
        self.metrics.leadership(False, None)
        self._pending = list(term.pending.values())
        if self._pending:
            logger.warning(
                "zkbeat: claims never confirmed or never sent are settled against the ledger as soon as "
                "ZooKeeper answers (written back if they landed, so the next leader sends them): %s",
                ", ".join(sorted(claim.name for claim in self._pending)),
            )
        self._heap = None
        self.on_leadership_end()

    def _release_pending(self, final: bool = False) -> None:
        """Not leading: write back our pending claims that landed, so whoever leads sends them.

        Followers try on every pass until ZooKeeper answers; close() tries
        once more, and logs what it leaves behind as possibly lost.
        """
        if not self._pending or self.ledger is None or self.zk_client is None:
            return
        if self.zk_client.state != KazooState.CONNECTED:
            remaining = self._pending
        else:
            try:
                remaining = release(self.ledger, self._pending)
            except ZOOKEEPER_ERRORS as exc:
                logger.debug("zkbeat: could not settle pending claims yet: %r", exc)
                remaining = self._pending
        self._pending = remaining
        if final and remaining:
            logger.error(
                "zkbeat: stopping with claims recorded as run that were never sent and could not be written "
                "back; these ticks are lost unless ZooKeeper did not commit them: %s",
                ", ".join(f"{c.name} at {c.slot.isoformat()}" for c in remaining),
            )

    def _check_clock(self, epoch: int) -> None:
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
                epoch,
            )

    def _schedule_hash(self) -> str | None:
        """The digest of this replica's schedule for its candidate data (zkbeat.peers)."""
        try:
            return schedule_hash(self.schedule)
        except Exception:  # noqa: BLE001 - a host whose schedule cannot be read yet just does not say
            logger.debug("zkbeat: could not hash the schedule", exc_info=True)
            return None

    def _refuse_to_lead(self, fence: Fence) -> float | None:
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
        reason = self.peers.check(force=self.term is None or self.term.fence != fence)
        if reason is None:
            return None
        logger.error("zkbeat: refusing to lead (%s): %s", self.zk_settings.identity, reason)
        if self.term is not None:
            self._end_term("a newer zkbeat layout is here")
        self._refused_until = now + LAYOUT_RECHECK
        self.election.step_down()
        return min(self.max_interval, LAYOUT_RECHECK)

    # -- one leader's pass: Celery's tick, batched ---------------------------

    def _lead(self) -> float:
        """Pop every due entry (up to MAX_BATCH), let the term run them, push them back."""
        term = self.term
        assert term is not None
        if term.pending:
            term.settle()
        if term.triggers is not None:
            term.run_manual(term.triggers.take())
        if self._heap is None or not self.schedules_equal(self.old_schedulers, self.schedule):
            self.old_schedulers = dict(self.schedule)
            self.populate_heap()
        heap = self._heap
        if not heap:
            return self.max_interval
        dues, later = self._scan(heap)
        if dues:
            later.extend(term.run(dues))
        if self._heap is None:
            return 0  # the pass replaced the schedule's entries: rebuild the heap now, not after a sleep
        self._push(later)
        if len(dues) >= MAX_BATCH:
            return 0
        if not self._heap:
            return self.max_interval
        top = self._heap[0]
        return max(0.0, min(top[0] - self._when_safe(top[2], 0), self.max_interval))

    def _idle(self, interval: float) -> float:
        """Wait out ``interval`` here, woken by a trigger request (zkbeat.controls), then come straight back.

        Beat's own sleep cannot be woken; the follower's tick waits the same way.
        """
        term = self.term
        if interval <= 0 or term is None or term.triggers is None:
            return interval
        term.triggers.wait(interval)
        return 0

    def _scan(self, heap: list) -> tuple[list[Due], list[Requeue]]:
        """Pop the entries whose time has come; sort them into due and not due yet."""
        dues: list[Due] = []
        later: list[Requeue] = []
        while heap and len(dues) < MAX_BATCH:
            event = heap[0]
            entry = event[2]
            if event[0] > self._when_safe(entry, 0):
                break
            heapq.heappop(heap)
            is_due, next_time = self.entry_is_due(entry)
            wait = self.jitter.wait(entry) if is_due else 0.0
            if wait > 0:
                later.append(Requeue(entry, event[1], wait))  # due, but its jittered moment is still ahead
            elif is_due:
                dues.append(Due(entry, event[1], next_time))
            else:
                later.append(Requeue(entry, event[1], next_time))
        return dues, later

    def _push(self, requeue: list[Requeue]) -> None:
        heap = self._heap
        if heap is None:
            return  # rebuilt from the schedule at the next pass
        for item in requeue:
            delay = item.delay if isinstance(item.delay, (int, float)) else self.max_interval
            heapq.heappush(heap, beat.event_t(self._when_safe(item.entry, delay), item.priority, item.entry))

    def entry_is_due(self, entry: beat.ScheduleEntry) -> tuple[bool, float]:
        """``entry.is_due()``; an entry whose schedule raises is logged once and left out.

        It is asked again every ``max_interval`` (a fixed row or a clock that
        moved on may cure it), and logged again only when its error changes.
        Celery's own scheduler does the same only from 5.7 on.
        """
        try:
            is_due, next_time = self.is_due(entry)
        except Exception as exc:  # noqa: BLE001 - one broken entry must not stop the rest
            self.leave_out(entry, exc, "schedule")
            return False, self.max_interval
        if self._broken.pop((entry.name, "schedule"), None) is not None:
            logger.info("zkbeat: %s is scheduled again", entry.name)
        return is_due, next_time

    def leave_out(self, entry: beat.ScheduleEntry, exc: BaseException, what: str = "entry") -> None:
        """Log (once per distinct error) that ``entry`` cannot run now; the caller leaves it out.

        Its schedule raised, its clock raised, or its name cannot be a znode.
        It is tried again every ``max_interval``.
        """
        text = repr(exc)
        if self._broken.get((entry.name, what)) == text:
            return
        self._broken[(entry.name, what)] = text
        logger.error(
            "zkbeat: leaving out %r: it cannot be scheduled (%s); trying again every %gs",
            entry.name,
            text,
            self.max_interval,
            exc_info=not isinstance(exc, (ValueError, TypeError)),
        )

    def populate_heap(self, *args: Any, **kwargs: Any) -> None:
        """Celery's heap of entries, built so that one entry that raises cannot stop the rest."""
        heap = []
        for entry in self.schedule.values():
            is_due, delay = self.entry_is_due(entry)
            heap.append(beat.event_t(self._when_safe(entry, 0 if is_due else delay), _PRIORITY, entry))
        heapq.heapify(heap)
        self._heap = heap

    def _when_safe(self, entry: beat.ScheduleEntry, delay: float) -> float:
        """Celery's ``_when`` (the heap's timestamp); now plus the delay if the entry cannot say."""
        try:
            return self._when(entry, delay) or 0
        except Exception:  # noqa: BLE001 - the entry's own clock (its nowfun, its zone) failed
            return time.time() + (delay if isinstance(delay, (int, float)) else self.max_interval)


class Scheduler(LeaderScheduleMixin, beat.Scheduler):
    """Celery's scheduler (schedule from ``beat_schedule``) with zkbeat's leadership.

    ``celery -A proj beat --scheduler zkbeat.Scheduler``
    """

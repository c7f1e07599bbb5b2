"""One shard's leadership over beat's loop: follow, take over, lead a pass, step aside, end the term.

The per-shard part of ``tick()`` (:meth:`ShardLeadership._shard_tick`)
reads the election once. Following, it writes back what an ended term left
pending and waits for leadership. Leading, it checks that this replica may
lead (:meth:`~ShardLeadership._refuse_to_lead`), begins a term under the
election's fence if none runs under it (:meth:`~ShardLeadership._begin_term`:
the term gets its collaborators, zkbeat.leading.host), runs the pass of
zkbeat.leading.heap_pass, steps aside while the host's schedule has not
loaded, and announces itself once a whole pass ran. Every error a pass
raises ends the term under the error policy in ``_shard_tick``'s table.

A mixin of the scheduler (``zkbeat.LeaderScheduleMixin``): it reads the
current shard's state through the scheduler's attributes
(zkbeat.leading.shard_state) and calls the host's hooks
(``on_leadership_start``, ``after_leader_pass``, ``schedule_loaded``...).
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator

from kazoo.exceptions import (
    ConnectionClosedError,
    ConnectionLoss,
    KazooException,
    SessionExpiredError,
    ZookeeperError,
)
from kazoo.handlers.threading import KazooTimeoutError
from kazoo.protocol.states import KazooState

from ..coordination.election import Fence, Handover, LeaderElection, events
from ..exceptions import FencedError
from ..ledger.clock import measure_skew
from ..ledger.pending import release
from ..ledger.store import LAYOUT_VERSION
from .broker import forget as forget_broker
from .host import BeatBroker, Collaborators, ScheduleView
from .publisher import Publisher
from .term import RETRY_DELAY, Term

__all__ = ["ShardLeadership", "ZOOKEEPER_ERRORS", "CONNECTION_ERRORS", "LAYOUT_RECHECK", "LOAD_RECHECK"]

logger = logging.getLogger("zkbeat.scheduler")

#: Errors of a ZooKeeper conversation; none of them may end beat.
ZOOKEEPER_ERRORS = (KazooException, ZookeeperError, KazooTimeoutError)
#: Of those, the ones that say "the connection broke", not "ZooKeeper said no".
CONNECTION_ERRORS = (ConnectionLoss, SessionExpiredError, ConnectionClosedError, KazooTimeoutError)
#: Seconds a replica that refused to lead (a newer layout is here) holds back
#: before it looks again, so that refusing replicas do not pass leadership
#: around as fast as ZooKeeper answers.
LAYOUT_RECHECK = 30.0
#: Seconds a replica that stepped aside because its schedule did not load as
#: leader (a DatabaseScheduler that cannot read its database) stays out of the
#: election before it joins again at the back and tries once more.
LOAD_RECHECK = 30.0
#: Unexpected errors in a row before a leader steps down: one bad pass ends
#: the term and starts a fresh one; a leader that keeps failing lets another
#: replica try, instead of passing leadership around once a second.
STEP_DOWN_AFTER = 3


class ShardLeadership:
    """The current shard's leadership in beat's loop: see the module docstring."""

    def _shard_tick(self) -> float:
        """tick() for the current shard: follow (wait for leadership) or lead (claim, publish what is due), then wait.

        Unlike Celery's own tick(), it waits itself (``wait_in_tick``): a
        follower's call returns once it leads or after ``max_interval``; a
        leader's publishes what is due (up to MAX_BATCH), then waits until
        its next entry is due, at most ``max_interval``, or until a run-now
        request comes. Either way it returns 0 and beat's loop calls again
        at once; it returns sooner (0, or RETRY_DELAY after an error) when
        there is more to do. A caller that drives tick() itself gets a call
        that blocks up to ``max_interval``; with ``wait_in_tick = False`` it
        returns the seconds to wait instead, as Celery's does.

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
        ``zkbeat.leading.term.SIGNAL_HOLD_LIMIT``; the watchdog steps a hung leader
        down after ``zkbeat_stall_timeout``); a host schedule that has not
        loaded since the takeover (not announced, read again each second,
        out of line after ``zkbeat_stall_timeout``). The one thing tick() raises:
        SystemExit, when beat's shutdown signal came and a library call it
        interrupted swallowed its SystemExit (see ``_exit_if_stop_swallowed``).
        """
        self._ticked = True
        self._exit_if_stop_swallowed()
        election = self.election
        if election is None or self._closed:
            return self.max_interval
        if self.watchdog is not None:
            self.watchdog.turned()  # the loop turns: a replica the watchdog held out may contend again
        fence = election.leadership  # one read: whether we lead, and under which candidate
        self._shard.seen = fence
        if fence is None:
            if self.term is not None:
                self._end_term("lost leadership")
            self._release_pending()
            self._exit_if_stop_swallowed()
            wait = self.max_interval
            if self._refused_until:
                left = self._refused_until - time.monotonic()
                if left <= 0:
                    self._refused_until = 0.0
                    logger.info("zkbeat: looking again whether this replica may lead; rejoining the election")
                    election.resume()
                else:
                    wait = min(wait, left)
            # Wake the moment the election's watch makes us leader; beat's
            # loop comes straight back because we return 0. Claims still to
            # write back are tried again within a second, not a max_interval.
            wait = RETRY_DELAY if self._pending else wait
            if not self.wait_in_tick:
                return wait
            election.wait_for_leadership(wait)
            return 0
        with self.leader_pass():
            interval = self._leader_pass(election, fence)
        self._exit_if_stop_swallowed()  # before the wait: a pass a swallowed signal cut short stops now
        # Outside the timed pass: an idle leader waiting for its next entry is not a hung one.
        return self._idle(interval)

    def _exit_if_stop_swallowed(self) -> None:
        """Raise SystemExit if beat's shutdown signal came and its SystemExit did not end the loop.

        celery beat's SIGTERM handler closes the scheduler (which records the
        signal) and raises SystemExit wherever the main thread is. Inside a
        library call that catches everything it is lost: kazoo's ``_call``
        wakes its connection thread inside a bare ``except:`` and turns it
        into ConnectionClosedError, and the replica would lead on, deaf to
        the signal. The next loop step raises it again, where nothing
        swallows it, and beat closes as after any SIGTERM.
        """
        if self._stop_signal is None or self._closed:
            return
        logger.warning(
            "zkbeat: the shutdown signal (%s) was swallowed by a call it interrupted; stopping now (%s)",
            self._stop_reason,
            self.zk_settings.identity,
        )
        raise SystemExit()

    def leader_progressed(self) -> None:
        """A stage of the leader pass under way finished: the watchdog times the next one afresh."""
        if self.watchdog is not None:
            self.watchdog.progressed()

    @contextlib.contextmanager
    def leader_pass(self) -> Iterator[None]:
        """Mark leader work that the watchdog times (zkbeat.leading.watchdog).

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
            interval = self.after_leader_pass(self._lead())
            self._failures = 0
            wait = self._schedule_not_loaded(election)
            if wait is not None:
                return min(interval, wait)
            # Only now does `zkbeat health` count this replica as leading: its
            # term began, its schedule loaded and a whole pass ran (nothing, once announced).
            election.announce(fence)
            self._report_leadership(fence.epoch)  # what the metrics and /healthz say, as `zkbeat health` does
            if self.broker_handover is not None and self.term is not None:
                self.broker_handover.leading(fence, self.term.publisher.down_since)
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
            if isinstance(exc, ConnectionClosedError) and self.zk_client is not None and not self.zk_client.connected:
                # This process closed its own client (a shutdown under way in another shard's part): not an alarm.
                logger.info("zkbeat: ZooKeeper client closed while leading (epoch %s): shutting down", epoch)
            else:
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
            election.step_down(reason=f"ZooKeeper error {type(exc).__name__} while leading", failed=True)
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
            election.step_down(reason=f"{STEP_DOWN_AFTER} unexpected errors in a row", failed=True)
            return RETRY_DELAY

    def _refuse_to_lead(self, fence: Fence) -> float | None:
        """Seconds to hold back instead of leading while a newer zkbeat layout is here.

        Checked before taking over and, while leading, whenever the root or
        the candidates change (zkbeat.coordination.peers). A refusing replica steps out of
        the line (``step_down(hold=True)``), so that any replica that may lead
        does, at once, and no status tool names it as leader; after
        LAYOUT_RECHECK it joins again at the back (tick()'s follower branch)
        and looks again when the line comes round to it.
        """
        if self.peers is None:
            return None
        now = time.monotonic()
        if now < self._refused_until:
            # Back at the head while holding back (the watchdog resumed it):
            # out of line again, so that the head is always one that leads.
            self.election.step_down(hold=True)
            return min(self.max_interval, self._refused_until - now)
        # Before taking over (or over again, under a new epoch: watches die
        # with a session) read everything; while leading, only what changed.
        reason = self.peers.check(force=self.term is None or self.term.fence != fence)
        self.metrics.refusing(reason is not None)
        if reason is None:
            return None
        logger.error(
            "zkbeat: refusing to lead (%s): %s; out of the election for %gs, then looking again",
            self.zk_settings.identity,
            reason,
            LAYOUT_RECHECK,
        )
        if self.term is not None:
            self._end_term("a newer zkbeat layout is here")
        self._refused_until = now + LAYOUT_RECHECK
        self.election.step_down(hold=True, reason="a newer zkbeat layout is here")
        return min(self.max_interval, LAYOUT_RECHECK)

    def _schedule_not_loaded(self, election: LeaderElection) -> float | None:
        """Seconds to the next pass while this term's schedule has not loaded (not announced); None once it has.

        A host whose schedule lives in shared storage (zkbeat.contrib.django)
        may fail to read it when it takes over, and would lead an empty
        schedule while `zkbeat health` says ok. Until ``schedule_loaded()``
        says it has, the replica does not announce itself (health and status
        do not name it leader) and the host tries the read again on every
        pass, each RETRY_DELAY; once ``zkbeat_stall_timeout`` has passed
        since the takeover it steps out of the line for LOAD_RECHECK, as a
        replica that refuses to lead does, so that one that can read its
        schedule leads; then it joins again at the back. A replica already
        marked unready (zkbeat.coordination.shards: it failed so before) does
        not wait for the timeout when a replica that can lead stands behind
        it in this shard's line: it steps aside after its first try. Said
        once per episode (until a load succeeds), counted every time
        (``zkbeat_schedule_load_step_downs_total``). Only a schedule
        that never loaded since the takeover counts: a leader whose later
        reads fail keeps leading the schedule it last read, also in a term
        begun again under the same candidate (a connection blip).
        """
        since = self._unloaded_since
        if since is None:
            return None
        epoch = self.term.epoch if self.term is not None else None
        if self.schedule_loaded():
            self._unloaded_since = None
            if self._fair_share is not None and self._fair_share.unready_why is not None:
                self._fair_share.mark_ready()  # it read its schedule as leader: it can lead
            if self._unloaded_said:
                self._unloaded_said = False
                logger.info("zkbeat: the schedule loaded; leading (%s, epoch %s)", self.zk_settings.identity, epoch)
            return None
        waited = time.monotonic() - since
        timeout = self.zk_settings.stall_timeout
        if waited < timeout:
            successor = self._ready_successor()
            if successor is None:
                return RETRY_DELAY
            # Already marked unready (it failed before): a replica behind it that can lead goes first now.
            self._log_step_aside(
                logging.WARNING,
                "zkbeat: stepping aside at once as leader%s (%s, epoch %s): marked unready (%s), its schedule has "
                "not loaded, and replica %s behind it can lead; out of the election for %gs, then trying again",
                self._shard.label,
                self.zk_settings.identity,
                epoch,
                self._fair_share.unready_why,
                successor,
                LOAD_RECHECK,
            )
        else:
            self._log_step_aside(
                logging.ERROR,
                "zkbeat: stepping aside (%s, epoch %s): the schedule has not loaded in %gs as leader "
                "(zkbeat_stall_timeout); out of the election for %gs so that a replica that can load it leads, "
                "then trying again",
                self.zk_settings.identity,
                epoch,
                timeout,
                LOAD_RECHECK,
            )
            if self._fair_share is not None:  # no replica hands it another shard until its schedule can be read
                self._fair_share.mark_unready(f"its schedule did not load in {timeout:g}s as leader")
        self.metrics.schedule_load_step_down()
        self._end_term("its schedule did not load")
        self._refused_until = time.monotonic() + LOAD_RECHECK
        election.step_down(hold=True, reason="its schedule did not load", failed=True)
        return 0

    def _ready_successor(self) -> str | None:
        """While marked unready: the replica behind this one in the current shard's line that can lead, if any.

        Not marked, or the lines unreadable now: None, and the replica keeps
        trying its schedule as any leader whose schedule has not loaded.
        """
        fair_share = self._fair_share
        if fair_share is None or fair_share.unready_why is None:
            return None
        try:
            return fair_share.ready_successor(self._shard.index)
        except ZOOKEEPER_ERRORS as exc:
            logger.debug("zkbeat: could not read the shards' lines: %r", exc)
            return None

    def _log_step_aside(self, level: int, message: str, *args: object) -> None:
        """Say a step aside for a schedule that did not load: at ``level`` once per episode, then at DEBUG."""
        logger.log(logging.DEBUG if self._unloaded_said else level, message, *args)
        self._unloaded_said = True

    def _begin_term(self, fence: Fence) -> None:
        assert self.ledger is not None
        started = time.monotonic()
        self.on_leadership_start()
        inherited = {claim.name: claim for claim in self._pending}
        self._pending = []
        offset = self._check_clock(fence.epoch)
        try:
            self.term = Term.begin(self._collaborators(), self._publisher(fence), fence, inherited, clock_offset=offset)
        except BaseException:
            self._pending = list(inherited.values())  # what the term did not settle: kept for the next try
            raise
        self._heap = None
        if fence != self._took_over:  # a term begun again under the same candidate keeps what it had loaded
            self._unloaded_since = started  # until schedule_loaded() says otherwise (_schedule_not_loaded)
        self.metrics.ledger_loaded(time.monotonic() - started)
        level, after = self._takeover(fence)
        events.log(
            level,
            "zkbeat: became leader%s (epoch %s) as %s%s; %d ledger entries loaded in %.1f ms",
            self._shard.label,
            fence.epoch,
            self.zk_settings.identity,
            after,
            self.term.records_loaded,
            (time.monotonic() - started) * 1000,
        )

    def _collaborators(self) -> Collaborators:
        """What a term works with (zkbeat.leading.host): the hooks look this host up when called."""
        assert self.ledger is not None
        view = ScheduleView(
            read=lambda: self.schedule,
            reserve=lambda entry: self.reserve(entry),
            leave_out=lambda entry, exc: self.leave_out(entry, exc),
            invalidate_heap=lambda: self.invalidate_heap(),
            keeps_own_run=lambda entry, state: self.keeps_own_run(entry, state),
            loaded=lambda: self.schedule_loaded(),
            reserved_at_reading=lambda successor: self.reserved_at_reading(successor),
            ask=lambda entry: self.ask(entry),
            holds=self._shard_members(),
            source_of=lambda entry: self.entry_source(entry),
        )
        return Collaborators(
            ledger=self.ledger,
            view=view,
            settings=self.zk_settings,
            policies=self.policies,
            jitter=self.jitter,
            metrics=self.metrics,
            max_interval=self.max_interval,
        )

    def _publisher(self, fence: Fence) -> Publisher:
        """A term's broker side: beat's connection, producer and ``apply_async``, looked up when used."""
        broker = BeatBroker(
            app=self.app,
            connection=lambda: self.connection,
            made_connection=lambda: self.__dict__.get("connection"),
            producer=lambda: self.producer,
            forget=lambda: forget_broker(self),
            apply_async=lambda *args, **kwargs: self.apply_async(*args, **kwargs),
        )
        return Publisher(broker, self.zk_settings, self.metrics, self.max_interval, fence.epoch)

    def _report_leadership(self, epoch: int | None) -> None:
        """Metrics: the current shard is led under ``epoch`` now, or not (None); leading any shard is leading."""
        if self.sharded:
            self.metrics.shard_leadership(self._shard.index, epoch)
        else:
            self.metrics.leadership(epoch is not None, epoch)

    def _takeover(self, fence: Fence) -> tuple[int, str]:
        """The level of the "became leader" line, and whom this replica took over from and why.

        WARNING only when a failure made the last leader go: it crashed (this
        replica's liveness watch deleted it), its session ended without a
        word (a stopped, lost or cut-off host), or it stepped down because
        something failed. A stop, a requested step-down, a first leader: INFO.
        """
        if self._took_over == fence or self.election is None:
            return logging.INFO, " again"  # the same epoch, a term begun afresh after an error
        self._took_over = fence
        handover = self.election.handover(fence) or Handover()
        if handover.previous is None:
            return logging.INFO, ""
        who = handover.identity or "a replica"
        after = f" after {who} (epoch {handover.epoch}) left"
        if handover.departure is not None:
            level = logging.WARNING if handover.departure.failed else logging.INFO
            return level, f"{after} ({handover.departure.why})"
        gone = f"{self.election.path}/{handover.previous}"
        if self.watcher is not None and gone in self.watcher.deleted:
            return logging.WARNING, f"{after} (crashed)"
        return logging.WARNING, f"{after} (its session ended: it crashed, stopped or was cut off)"

    def _end_term(self, reason: str) -> None:
        term, self.term = self.term, None
        if term is None:
            return
        events.info(
            "zkbeat: stopped leading%s (%s, epoch %s): %s",
            f" shard {self._shard.index}/{self._shard.count}" if self.sharded else "",
            self.zk_settings.identity,
            term.epoch,
            reason,
        )
        self._report_leadership(None)
        if self.broker_handover is not None:
            self.broker_handover.leading(None, None)
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

    def _check_clock(self, epoch: int) -> float:
        """Seconds this new leader's clock is ahead of ZooKeeper's (0 if unknown), warned when far (ledger.clock)."""
        path = f"{self.zk_settings.root}/{LAYOUT_VERSION}/clock"
        try:
            skew = measure_skew(self.zk_client, path, self.zk_settings.identity)
        except ZOOKEEPER_ERRORS as exc:
            logger.debug("zkbeat: could not compare clocks with ZooKeeper: %r", exc)
            return 0.0
        if skew.worth_a_warning:
            logger.warning(
                "zkbeat: this leader's clock is %s (%s, epoch %s); the schedule runs on the leader's clock, so "
                "ticks come late or early by that much across a handover: keep the replicas' clocks in sync (NTP)",
                skew.describe(),
                self.zk_settings.identity,
                epoch,
            )
        return skew.seconds

"""Leadership and the fenced ledger as a mixin for any ``celery.beat.Scheduler``.

``Scheduler`` is that mixin on Celery's base scheduler, with the schedule taken
from ``beat_schedule``. Celery's own heap and ``is_due`` decide what is due;
the mixin decides whether this replica may publish it, and one
:class:`~zkbeat.leading.term.Term` per epoch of leadership records each tick in
ZooKeeper before the message goes out. This module is the glue to Celery:
beat's hooks (``setup_schedule``, ``tick``, ``reserve``, ``populate_heap``,
``schedules_equal``, ``close``, ``info``) and the hooks a host overrides;
the leadership they drive is in zkbeat.leading.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import operator
import signal
import threading
import uuid
from collections.abc import Callable, Collection, Iterable
from typing import Any

from celery import beat
from kazoo.client import KazooClient
from kombu.utils.objects import cached_property

from .conf import Settings, read_settings
from .coordination.broker_handover import BrokerHandover
from .coordination.election import Fence, LeaderElection
from .coordination.liveness import Beacon, Watcher
from .coordination.peers import PeerCheck
from .coordination.shards import FairShare
from .exceptions import ConfigurationError
from .leading._signals import hold_shutdown_signals, shutdown_signal_handled
from .leading.broker import beat_connection, close_connection
from .leading.heap_pass import HeapPass
from .leading.leadership import ShardLeadership
from .leading.replica import BadSettingExit, Replica
from .leading.shard_state import ShardState, per_shard
from .leading.sharded import ShardedLoop
from .leading.term import SIGNAL_HOLD_LIMIT, Term
from .leading.wakeup import Wakeup
from .leading.watchdog import Watchdog
from .ledger.pending import PendingClaim
from .ledger.store import EntryState, Ledger
from .ops.metrics import Metrics
from .ticking.jitter import Jitter
from .ticking.passclock import PassClock
from .ticking.policy import Policies
from .ticking.ticks import task_id_for, tick_slot

__all__ = ["LeaderScheduleMixin", "Scheduler", "task_id_for", "tick_slot"]

logger = logging.getLogger(__name__)

#: Heap priority of the first entry (Celery gives every entry 5; zkbeat counts on from it, see populate_heap).
_PRIORITY = 5


class LeaderScheduleMixin(Replica, ShardedLoop, ShardLeadership, HeapPass):
    """Publish only while leading, and only what the ledger let us claim.

    Mixed in before a ``celery.beat.Scheduler`` subclass. Overrides
    ``setup_schedule`` (connect), ``tick`` (follow or lead), ``populate_heap``
    (one entry that raises must not stop the rest), ``close`` (hand over) and
    ``info``; entries advance through the host's own ``reserve()``. The
    work is in zkbeat.leading: joining and leaving the elections
    (``replica``), the sharded loop (``sharded``), one shard's leadership
    (``leadership``), a leader's pass over beat's heap (``heap_pass``), and
    the term each epoch of leadership runs (``term``).

    Hosts whose schedule lives in shared storage (``zkbeat.contrib.django``)
    override the hooks below and read ``leading``; they need no other state.
    """

    #: ZooKeeper client class; tests may swap it.
    Client = KazooClient
    #: tick() does its own waiting, so that beat acts the moment there is
    #: work: a follower's waits for leadership (up to ``max_interval``), an
    #: idle leader's until its next entry is due or a run-now request comes
    #: (zkbeat.ledger.controls), and both return 0; beat's own sleep could not be
    #: woken. False makes tick() return the seconds to wait instead, as
    #: Celery's own does, for a caller that drives tick() itself (a test, an
    #: embedded beat with a clock of its own): leadership and run-now
    #: requests are then seen when it calls again.
    wait_in_tick = True
    #: Whether the host's schedule may be split into shards (``zkbeat_shards`` > 1).
    supports_shards = True

    # Each shard's leadership state (zkbeat.leading.shard_state): these read and write
    # the shard whose part of the loop runs; with one shard, its only state.
    election = per_shard("election")
    watcher = per_shard("watcher")
    broker_handover = per_shard("broker_handover")
    term = per_shard("term")
    _pending = per_shard("_pending")
    _took_over = per_shard("_took_over")
    _failures = per_shard("_failures")
    _refused_until = per_shard("_refused_until")
    _unloaded_since = per_shard("_unloaded_since")
    _unloaded_said = per_shard("_unloaded_said")
    _heap = per_shard("_heap")
    old_schedulers = per_shard("old_schedulers")

    def __init__(self, app: Any, *args: Any, **kwargs: Any) -> None:
        # No I/O here: beat builds a lazy instance only to print its banner.
        try:
            self.zk_settings: Settings = read_settings(app.conf, app.main)
            self._check_shards(self.zk_settings.shards)
        except ConfigurationError as exc:
            raise BadSettingExit.under_click(exc) from None
        count = self.zk_settings.shards
        #: One leadership state per shard, and the one whose part of the loop runs.
        self._shards = [ShardState(index, count) for index in range(count)]
        self._shard = self._shards[0]
        #: This process's id in the candidates of every shard (only with shards: the fair share reads it).
        self._replica = uuid.uuid4().hex
        self._fair_share: FairShare | None = None
        #: Set when any shard's election changes hands or a run-now request comes for a shard led
        #: here: a sharded replica's one wait (zkbeat.leading.wakeup, which libfaketime cannot hang).
        self._wake: Wakeup | threading.Event = Wakeup() if count > 1 else threading.Event()
        #: tick() runs one shard's part of a sharded tick (_shard_pass).
        self._in_shard_pass = False
        self.metrics = Metrics(self.zk_settings)
        #: Each entry's grace, catch-up and jitter options, parsed once (zkbeat.ticking.policy), and
        #: each tick's publish moment after its slot (zkbeat.ticking.jitter; off by default).
        self.policies = Policies(self.zk_settings)
        self.jitter = Jitter(self.zk_settings.root, self.zk_settings.jitter, self.policies)
        #: One reading of the clock for a leader's pass (zkbeat.ticking.passclock).
        self.pass_clock = PassClock()
        self.zk_client: KazooClient | None = None
        self.election: LeaderElection | None = None
        self.ledger: Ledger | None = None
        self.peers: PeerCheck | None = None
        #: Liveness socket and the watch on the predecessor's (zkbeat.coordination.liveness).
        self.beacon: Beacon | None = None
        self.watcher: Watcher | None = None
        #: Hands leadership on when this leader cannot reach the broker and another replica can.
        self.broker_handover: BrokerHandover | None = None
        self.watchdog: Watchdog | None = None
        #: The current epoch of leadership, None while following.
        self.term: Term | None = None
        #: Claims of an ended term whose commit was never confirmed (see zkbeat.leading.term).
        self._pending: list[PendingClaim] = []
        self._closed = False
        #: beat's loop has called tick() (see close()).
        self._ticked = False
        self._refused_until = 0.0
        self._failures = 0
        #: Monotonic time the current term began, while the host's schedule has not loaded in it (None once it has).
        self._unloaded_since: float | None = None
        #: Stepping aside for a schedule that did not load was logged (once until a load succeeds).
        self._unloaded_said = False
        #: Why this replica stops, for its successor's log: the signal beat got, else a plain close().
        self._stop_reason = "shut down"
        #: The shutdown signal beat's handler got (recorded by close() before the handler raises
        #: SystemExit): one a library swallowed mid-call still ends the loop (_exit_if_stop_swallowed).
        self._stop_signal: int | None = None
        #: The fence whose takeover was last logged (a term begun again under it is no new takeover).
        self._took_over: Fence | None = None
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

    def entry_source(self, entry: beat.ScheduleEntry) -> str | None:
        """What ``entry`` was built from, recorded with each of its runs in the ledger (``EntryState.source``).

        None by default; a host whose entries are rows says which row (its id and version), so that its
        ``keeps_own_run`` can tell a run of the row it holds now from a run of another under the same name.
        """
        return None

    def schedule_loaded(self) -> bool:
        """Whether ``schedule`` is the host's whole schedule (False: its last read failed).

        A run-now request for an entry missing from a schedule that did not
        load is kept pending, never refused (zkbeat.ledger.controls).
        """
        return True

    def schedule_replaced(self) -> None:
        """The host rebuilt ``schedule``: read each entry's ledger state before its next claim.

        Meanwhile each entry takes the run the term knows, as the term's
        merge gives it to a schedule read before the term began (a database
        row its leader never wrote its run back to would otherwise count from
        the rebuild). An entry whose own last run is in the future (a row a
        leader whose clock was ahead wrote) would not come due to be read:
        the next pass reads those at once (zkbeat.ledger.clock).
        """
        for shard in self._shards:  # every shard: a host replaces its schedule from outside a shard's part
            if shard.term is not None:
                shard.term.replaced(list(shard.term.known))
                shard.term.own_runs_checked = False
            shard._heap = None
        self.policies.forget()

    def entries_replaced(self, names: Iterable[str], added: Collection[str] = ()) -> None:
        """The host rebuilt (or dropped) these entries: read each one's ledger state before its next claim.

        ``added``: those of them it did not hold before (they keep their own
        last run until then: zkbeat.leading.term ``Term.replaced``). The host
        puts them on beat's heap itself, or calls ``invalidate_heap``.
        """
        names = list(names)
        self.policies.forget(names)
        if self.term is not None:
            self.term.replaced(names, added)

    def sync_at_close(self) -> Callable[[], None] | None:
        """close(), still leading: write the host's own record now (None), or take it and return its write.

        That write runs after the handover: the successor need not wait, so it must not overwrite newer runs.
        """
        self.sync()
        return None

    def after_leader_pass(self, interval: float) -> float:
        """A leader's pass is done: the host may do leader work of its own and shorten the wait.

        Runs inside the pass (timed by the watchdog, under tick()'s error
        policy). Returns the seconds until the next pass (``interval``: the
        pass's own answer).
        """
        return interval

    def invalidate_heap(self) -> None:
        """Rebuild beat's heap from the schedule at the next pass."""
        self._heap = None

    @property
    def leading(self) -> bool:
        """True while this replica leads under its current term (what only a leader may write)."""
        election, term = self.election, self.term
        return term is not None and not self._closed and election is not None and election.leadership == term.fence

    @property
    def closed(self) -> bool:
        return self._closed

    # -- lifecycle ---------------------------------------------------------

    def setup_schedule(self) -> None:
        """The host's schedule, then this replica's place in the election: joined once.

        Celery calls it from ``__init__``; a second call (Celery's own tests
        make one) sets the host's schedule up again but opens no second
        client: a second candidate would leave the first one, orphaned,
        holding leadership while nobody publishes under it.
        """
        self.setup_host_schedule()
        if self.zk_client is None and not self._closed:
            self._connect()

    @cached_property
    def connection(self) -> Any:
        """Beat's broker connection, its publish bounded on Redis (zkbeat.leading.broker.beat_connection)."""
        return beat_connection(self.app)

    def close(self) -> None:
        """Hand leadership over first (delete the candidate), then close.

        Celery calls this twice on SIGTERM; the second call only repeats the
        host scheduler's close, which is idempotent. The first, from inside
        celery beat's signal handler, does nothing (see
        zkbeat.leading._signals.inside_shutdown_handler): the handler's SystemExit
        reaches ``Service.start`` at once, and its ``finally`` closes.
        """
        handled = shutdown_signal_handled()
        if handled is not None and not self._closed:
            self._stop_signal = handled
            try:
                self._stop_reason = signal.Signals(handled).name
            except ValueError:
                self._stop_reason = f"signal {handled}"
        if getattr(self, "_ticked", False) and handled is not None:
            # Only once beat's loop runs: before it, Service.start has no
            # ``finally`` around it yet, and nothing of ours holds a lock.
            logger.debug("zkbeat: shutdown signal: closing once beat's loop has unwound")
            return
        if not self._closed:
            # A second SIGTERM or Ctrl-C would raise SystemExit halfway through
            # (claims not written back, the candidate left): held until the end,
            # at most SIGNAL_HOLD_LIMIT, so that a close() that hangs can be cut.
            with hold_shutdown_signals(limit=SIGNAL_HOLD_LIMIT):
                self._leave()  # the host's record (sync_at_close), the handover, then what the host wrote late
                close_connection(self)  # bounded: Celery's own release would wait on a silent broker forever
                super().close()
            return
        super().close()

    @property
    def info(self) -> str:
        s = self.zk_settings
        return f"    . zkbeat -> {s.hosts}{s.root} as {s.identity} (session {s.session_timeout:g}s)"

    # -- the loop ----------------------------------------------------------

    def tick(self, *args: Any, **kwargs: Any) -> float:
        """Follow (wait for leadership) or lead (claim, then publish what is due), then wait; returns 0.

        With shards, each shard's part of the loop in turn, then one wait
        (zkbeat.leading.sharded); each part is this method again. One
        shard's part and its error policy: zkbeat.leading.leadership
        (``_shard_tick``). No error ends beat's loop.
        """
        if self.sharded and not self._in_shard_pass:
            return self._sharded_tick()  # each shard's part of the loop is this method again (_shard_pass)
        return self._shard_tick()

    # -- beat's heap: Celery's hooks (a leader's pass over it: zkbeat.leading.heap_pass) ---------

    def reserve(self, entry: beat.ScheduleEntry) -> beat.ScheduleEntry:
        """Celery's: the entry's successor, run now; in a leader's pass, now is its reading (ticking.passclock)."""
        now = self.reserve_reading(entry)
        if now is None:
            return super().reserve(entry)
        successor = self.schedule[entry.name] = entry._next_instance(last_run_at=now)
        return successor

    def schedules_equal(self, old_schedules: Any, new_schedules: Any) -> bool:
        """Celery's comparison, passing over the entries that are the same object (most, on a leader)."""
        if old_schedules is None or new_schedules is None or len(old_schedules) != len(new_schedules):
            return super().schedules_equal(old_schedules, new_schedules)
        if all(map(operator.is_, old_schedules.values(), new_schedules.values())) and all(
            map(operator.is_, old_schedules, new_schedules)
        ):
            return True  # the same entries under the same names in the same order: one C-speed walk a pass
        for name, old_entry in old_schedules.items():
            new_entry = new_schedules.get(name)
            if new_entry is not old_entry and (not new_entry or new_entry != old_entry):
                return False
        return True

    def populate_heap(self, *args: Any, **kwargs: Any) -> None:
        """Celery's heap of entries, built so that one entry that raises cannot stop the rest.

        Each entry gets a priority of its own (Celery gives every one 5): the
        pass's clock places entries due together at the very same moment, and
        the heap would break every such tie by comparing entries field by field.
        """
        heap = []
        ties = itertools.count(_PRIORITY)
        for entry in self.schedule.values():
            if self.sharded and not self.in_shard(entry.name):
                continue  # another shard's: its leader runs it
            heap.append(beat.event_t(self.heap_time(entry, self.ask(entry)), next(ties), entry))
        heapq.heapify(heap)
        self._heap = heap


class Scheduler(LeaderScheduleMixin, beat.Scheduler):
    """Celery's scheduler (schedule from ``beat_schedule``) with zkbeat's leadership.

    ``celery -A proj beat --scheduler zkbeat.Scheduler``
    """

"""Several shards led from one beat loop: each shard's part of a tick in turn, one wait, a fair share.

With ``zkbeat_shards`` = N > 1 a replica holds one
:class:`~zkbeat.leading.shard_state.ShardState` per shard and runs each
shard's part of beat's loop with that shard's state current
(:meth:`ShardedLoop.shard_current`): the per-shard tick of
zkbeat.leading.leadership runs once for each shard, returning its wait
instead of waiting, and the loop then waits once for whichever comes first
(the first shard's next entry, an election changing hands, a run-now
request for a shard led here). After each pass the fair share
(zkbeat.coordination.shards) may give one shard up.

A mixin of the scheduler (``zkbeat.LeaderScheduleMixin``): its methods
use the scheduler's per-shard state and call its ``tick()``.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import time
from collections.abc import Callable, Iterator

from kazoo.protocol.states import KazooState

from ..coordination.shards import BROKER, SCHEDULE, FairShare, entry_shard
from ..exceptions import ConfigurationError
from .leadership import ZOOKEEPER_ERRORS
from .shard_state import ShardState

__all__ = ["ShardedLoop", "READY_PROBE"]

logger = logging.getLogger("zkbeat.scheduler")

#: Seconds between two asks of ``schedule_readable()`` while this replica is marked unready.
READY_PROBE = 5.0

_UNSET = object()


class ShardedLoop:
    """Each shard's part of beat's loop in turn, then one wait: see the module docstring."""

    #: When to ask ``schedule_readable()`` next while marked unready (0: not marked).
    _ready_probe_at = 0.0

    def _check_shards(self, count: int) -> None:
        if count > 1 and not self.supports_shards:
            raise ConfigurationError(
                "zkbeat_shards", count, f"{type(self).__name__} leads its whole schedule as one shard: set it to 1"
            )

    @property
    def sharded(self) -> bool:
        """True when the schedule is split into more than one shard (``zkbeat_shards``)."""
        return len(self._shards) > 1

    def in_shard(self, name: str) -> bool:
        """Whether entry ``name`` belongs to the shard whose part of the loop runs (zkbeat.coordination.shards)."""
        return self._holds(self._shard, name)

    def _shard_members(self) -> Callable[[str], bool]:
        """Membership of the shard current now, fixed: for a term made in this shard's pass, whenever it asks."""
        shard = self._shard
        if shard.count == 1:
            return _everything
        return functools.partial(self._holds, shard)

    def _holds(self, shard: ShardState, name: str) -> bool:
        """Whether entry ``name`` belongs to ``shard``: its number worked out once per name (``entry_shard``)."""
        if shard.count == 1:
            return True
        return entry_shard(self.zk_settings.hosts, self.zk_settings.root, name, shard.count) == shard.index

    @contextlib.contextmanager
    def shard_current(self, shard: ShardState) -> Iterator[None]:
        """Run the block with ``shard``'s leadership state current (zkbeat.leading.shard_state)."""
        previous, self._shard = self._shard, shard
        try:
            yield
        finally:
            self._shard = previous

    def _sharded_tick(self) -> float:
        """tick() with shards: each shard's part of the loop in turn, then one wait for whichever comes first.

        The wait ends when the first shard's next entry is due, when any
        shard's election changes hands, or when a run-now request comes for
        a shard this replica leads.
        """
        self._ticked = True
        wait = self.max_interval
        for shard in self._shards:
            with self._shard_pass(shard):
                wait = min(wait, self.tick())
        if self._closed:
            return self.max_interval
        fair_share = self._fair_share
        changes = fair_share.changes if fair_share is not None else 0
        self._fair_share_pass()
        if fair_share is not None:
            wait = min(wait, fair_share.next_look())  # a move held off until the lines stood still: not a sleep
            if fair_share.unready_why is not None:  # wake to ask again whether it can lead (schedule, broker)
                # (_probe_readiness ran in this pass: the next ask is ahead; never a wait of 0, never a hot loop.)
                wait = min(wait, max(self._ready_probe_at - time.monotonic(), 0.1))
        if wait <= 0 or not self.wait_in_tick:
            return wait
        self._wait_any(wait, changes)
        return 0

    def _wait_any(self, timeout: float, lines_changes: int = 0) -> None:
        """Sleep up to ``timeout`` in one wait, woken by an election's edge or a run-now request for a shard led here.

        Every shard's election listener and every led shard's inbox watch set
        ``_wake``; it is cleared first and the flags are looked at after, so
        an edge or a request that came since this pass read them wakes at once.
        """
        wake = self._wake
        wake.clear()
        inboxes = [s.term.triggers for s in self._shards if s.term is not None and s.term.triggers is not None]
        for inbox in inboxes:
            inbox.on_change = wake.set
        if any(inbox.ready() for inbox in inboxes):
            return
        # Requests the broker could not take are read again after a while (TriggerInbox.retry_after): wake then.
        timeout = min([timeout, *(inbox.held_for() for inbox in inboxes if inbox.changed.is_set())])
        # Against what each shard's part of this pass saw: a change since then wakes at once.
        if any(s.election is not None and s.election.leadership != s.seen for s in self._shards):
            return
        if self._fair_share is not None and self._fair_share.changes != lines_changes:
            return  # the shards' lines changed since this pass read them (their watch set the wake before the clear)
        wake.wait(timeout)

    def _fair_share_pass(self) -> None:
        """Give up one shard (or a place in a shard's line) when the fair share says so (zkbeat.coordination.shards)."""
        fair_share = self._fair_share
        if fair_share is None:
            return
        self._probe_readiness(fair_share)  # needs no ZooKeeper: what it finds is written once connected
        if self.zk_client is None or self.zk_client.state != KazooState.CONNECTED:
            return
        try:
            move = fair_share.decide()
        except ZOOKEEPER_ERRORS as exc:
            logger.debug("zkbeat: could not read the shards' lines: %r", exc)
            move = None
        try:
            fair_share.keep_mark()  # apart: a mark that cannot be written holds up no move
        except ZOOKEEPER_ERRORS as exc:
            logger.debug("zkbeat: could not write this replica's unready mark: %r", exc)
        if move is None:
            return
        shard = self._shards[move.shard]
        with self.shard_current(shard):
            if move.lead:
                if self.term is not None:
                    self._end_term(move.why)
            elif self.election is not None and self.election.leadership is not None:
                return  # it leads that shard after all (the line moved since it was read)
            if self.election is not None:
                self.election.step_down(reason=move.why)

    def schedule_readable(self) -> bool:
        """Whether the host's schedule could be read now: asked of a replica marked unready (a hook).

        A replica whose schedule did not load as leader marks itself unready
        for every replica's fair share (zkbeat.coordination.shards), which
        then hands it nothing; leading nothing, it has no read of its
        schedule to tell it that its storage is back. A host whose schedule
        lives in shared storage answers from a cheap read of it
        (zkbeat.contrib.django); the default says yes.
        """
        return True

    def _probe_readiness(self, fair_share: FairShare) -> None:
        """While marked unready: ask every READY_PROBE whether what keeps it from leading is over; if so, unmark.

        The host, whether its schedule can be read (``schedule_readable``);
        the broker, on a connection of its own, whether it answers (a replica
        that handed a shard over for it). Once unmarked, the fair share hands
        this replica its share again; if its schedule then does not load as
        leader, or it hands a shard over for the broker again, it is marked again.
        """
        if fair_share.unready_why is None:
            self._ready_probe_at = 0.0
            return
        now = time.monotonic()
        if not self._ready_probe_at:
            self._ready_probe_at = now + READY_PROBE  # the read failed just now: not again at once
        if now < self._ready_probe_at:
            return
        self._ready_probe_at = now + READY_PROBE
        over = []
        # Each cause's marks are counted before its probe: one made while the probe runs (a broker handover's
        # thread) is newer than the probe's answer, and stays.
        marks = fair_share.marks(SCHEDULE)
        if fair_share.unready_for(SCHEDULE) and self._ready(self.schedule_readable, "schedule_readable()"):
            if fair_share.mark_ready(SCHEDULE, marks):
                over.append("the schedule can be read again")
        marks = fair_share.marks(BROKER)
        if fair_share.unready_for(BROKER) and self._ready(lambda: self._probe_broker() is None, "the broker probe"):
            if fair_share.mark_ready(BROKER, marks):
                over.append("the broker can be reached again")
        if over:
            still = fair_share.unready_why
            logger.info(
                "zkbeat: %s (%s); %s",
                " and ".join(over),
                self.zk_settings.identity,
                "ready to lead, the fair share may hand shards here" if still is None else f"still not ready: {still}",
            )

    def _ready(self, probe: Callable[[], bool], what: str) -> bool:
        """One readiness probe's answer; one that raises is a no, asked again later."""
        try:
            with self.leader_pass():  # a probe that hangs holds up the shards led here: the watchdog times it
                return probe()
        except Exception as exc:  # noqa: BLE001 - a host's probe that raises: not ready
            logger.debug("zkbeat: %s raised %r", what, exc)
            return False

    @contextlib.contextmanager
    def _shard_pass(self, shard: ShardState) -> Iterator[None]:
        """One shard's part of a sharded tick(): its state current, and tick() returning its wait, not waiting."""
        saved = self.__dict__.get("wait_in_tick", _UNSET)
        self.wait_in_tick = False
        self._in_shard_pass = True
        try:
            with self.shard_current(shard):
                yield
        finally:
            self._in_shard_pass = False
            if saved is _UNSET:
                del self.wait_in_tick
            else:
                self.wait_in_tick = saved

    def _describe_terms(self) -> str:
        """The epochs this replica leads under, for the watchdog's line."""
        led = [f"epoch {s.term.epoch}{s.label}" for s in self._shards if s.term is not None]
        return ", ".join(led) or "epoch None"


def _everything(name: str) -> bool:
    return True

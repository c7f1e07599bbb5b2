"""What a replica holds for one shard's leadership: its election, its term, and their leftovers.

The scheduler keeps one :class:`ShardState` per shard (one in all with
``zkbeat_shards = 1``) and runs each shard's part of beat's loop with that
shard's state current, so the election, the term and the heap it reads are
always that shard's: one term per shard led, fenced by that shard's
candidate, holding only that shard's entries on its heap.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..coordination.broker_handover import BrokerHandover
    from ..coordination.election import Fence, LeaderElection
    from ..coordination.liveness import Watcher
    from ..ledger.pending import PendingClaim
    from .term import Term

__all__ = ["ShardState", "per_shard"]


@dataclass
class ShardState:
    """One shard's leadership on this replica (see the module docstring)."""

    #: This shard's number, 0 to ``count`` - 1.
    index: int = 0
    count: int = 1
    election: LeaderElection | None = None
    #: The liveness watch on this shard's predecessor (zkbeat.coordination.liveness).
    watcher: Watcher | None = None
    broker_handover: BrokerHandover | None = None
    #: The current epoch of this shard's leadership, None while following it.
    term: Term | None = None
    #: Claims of an ended term whose commit was never confirmed (see zkbeat.leading.term).
    _pending: list[PendingClaim] = field(default_factory=list)
    #: The fence whose takeover was last logged.
    _took_over: Fence | None = None
    _failures: int = 0
    _refused_until: float = 0.0
    #: Monotonic time this shard's term began, while the host's schedule has not loaded in it.
    _unloaded_since: float | None = None
    #: Stepping aside for a schedule that did not load was logged (once until a load succeeds).
    _unloaded_said: bool = False
    #: beat's heap of this shard's entries (None: rebuilt at the next pass).
    _heap: list[Any] | None = None
    old_schedulers: dict[str, Any] | None = None
    #: The election's leadership as this shard's part of the last pass read it
    #: (a change since then ends a sharded replica's wait at once).
    seen: Fence | None = None

    @property
    def label(self) -> str:
        """`` of shard k/N`` for log lines; empty with one shard (the log reads as it always did)."""
        return f" of shard {self.index}/{self.count}" if self.count > 1 else ""


def per_shard(name: str) -> property:
    """A scheduler attribute kept on the current shard's :class:`ShardState`."""

    def get(self: Any) -> Any:
        return getattr(self._shard, name)

    def set_(self: Any, value: Any) -> None:
        setattr(self._shard, name, value)

    return property(get, set_, doc=f"``{name}`` of the shard whose part of the loop runs (zkbeat.leading.shard_state).")

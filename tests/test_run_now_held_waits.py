"""An idle leader whose inbox a broken send held back (TriggerInbox.retry_after) waits, and wakes when it ends.

The requests the broker could not take are put back in the inbox, which
fires its watch; they are read again after RETRY_DELAY. Meanwhile the idle
leader's wait must neither return at once (a pass, an inbox that reads
nothing, and the wait again, as fast as the loop turns: the spin the hold
is there to stop) nor sleep past the hold's end (a run-now request waiting
up to ``beat_max_loop_interval``), sharded or not.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest

from tests.support.helpers import every, names_in_every_shard
from tests.test_shards import lead_every_shard
from zkbeat.ledger.controls import TriggerInbox


def idle_inbox() -> TriggerInbox:
    """An inbox read just now: its watch has not fired since (no ZooKeeper is asked in these)."""
    inbox = TriggerInbox(client=None, root="/held")  # type: ignore[arg-type]
    inbox.prune_due = False
    inbox.changed.clear()
    return inbox


def test_an_inbox_held_back_is_not_read_and_its_wait_does_not_return_until_the_hold_ends() -> None:
    inbox = idle_inbox()
    inbox.retry_after(3600)
    assert inbox.changed.is_set(), "the put-back requests are to be read (after the hold)"
    assert not inbox.ready()
    assert inbox.wait(0.2) is False, "the wait returned at once while the inbox was held back: the loop spins"
    assert inbox.take() == []
    assert 3500 < inbox.held_for() <= 3600
    inbox.retry_after(0)
    assert inbox.ready() and inbox.held_for() == 0
    assert inbox.wait(30) is True


class RecordedWaits:
    """The sharded loop's one wait (``_wake.wait``): each timeout it was given and what it returned."""

    def __init__(self, wake: Any, monkeypatch: pytest.MonkeyPatch, longest: float) -> None:
        self.calls: list[tuple[float, bool]] = []
        real = wake.wait

        def wait(timeout: float | None = None) -> bool:
            woken = real(min(timeout if timeout is not None else longest, longest))
            self.calls.append((timeout, woken))
            return woken

        monkeypatch.setattr(wake, "wait", wait)


def sharded_leader(make_scheduler, zk_root: str) -> Any:
    names = names_in_every_shard(zk_root, 2)
    scheduler = make_scheduler({name: every(3600) for name in names}, zkbeat_shards=2, beat_max_loop_interval=600)
    lead_every_shard(scheduler)
    scheduler.wait_in_tick = False
    scheduler.tick()
    scheduler.tick()
    inboxes = [shard.term.triggers for shard in scheduler._shards]
    assert all(inbox is not None and not inbox.changed.is_set() for inbox in inboxes), "an inbox was not read"
    return scheduler


def lines_changes(scheduler: Any) -> int:
    return scheduler._fair_share.changes if scheduler._fair_share is not None else 0


def test_a_sharded_leader_whose_inbox_is_held_back_waits_until_the_hold_ends_not_at_once_nor_longer(
    make_scheduler, zk_root: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    scheduler = sharded_leader(make_scheduler, zk_root)
    held = scheduler._shards[0].term.triggers
    waits = RecordedWaits(scheduler._wake, monkeypatch, longest=0.1)

    held.retry_after(3600)
    scheduler._wait_any(5.0, lines_changes(scheduler))
    assert [timeout for timeout, _ in waits.calls] == [5.0], "the wait returned at once while the inbox was held"

    waits.calls.clear()
    held.retry_after(2.0)
    scheduler._wait_any(600.0, lines_changes(scheduler))
    assert len(waits.calls) == 1 and waits.calls[0][0] <= 2.0, f"slept past the hold's end: {waits.calls}"


def test_a_sharded_leader_whose_inbox_is_held_back_wakes_for_another_shard_s_request(
    make_scheduler, zk_root: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    scheduler = sharded_leader(make_scheduler, zk_root)
    scheduler._shards[0].term.triggers.retry_after(3600)
    other = scheduler._shards[1].term.triggers
    waits = RecordedWaits(scheduler._wake, monkeypatch, longest=60)
    threading.Timer(0.3, other.again).start()  # as its watch does when a request comes
    scheduler._wait_any(600.0, lines_changes(scheduler))
    assert waits.calls and waits.calls[-1][1] is True, f"not woken by the other shard's inbox: {waits.calls}"

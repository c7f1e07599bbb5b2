"""Work a leader's pass does that grows with what piled up: bounded per pass, so
that no pile (receipts nobody collected, a catch-up backlog) keeps a pass long
enough for the watchdog to step a healthy leader down. Outcomes only: what was
published, how many znodes are left, how much work each pass did."""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime, timedelta, timezone

import pytest
from kazoo.client import KazooClient

from tests.support.helpers import Published, every, lead, wait_for
from zkbeat.conf import MAX_CATCHUP_LIMIT, read_settings
from zkbeat.exceptions import ConfigurationError
from zkbeat.ledger import controls
from zkbeat.ledger.store import Claim, EntryState, Ledger
from zkbeat.ticking import catchup


def fake_receipts(client: KazooClient, root: str, count: int) -> None:
    """``count`` receipts nobody collected, named as the leader names them (its requests' sequence)."""
    requests, done = f"{root}/v1/triggers", f"{root}/v1/triggers/done"
    client.ensure_path(done)
    made = [client.create_async(f"{requests}/request-", b"{}", sequence=True) for _ in range(count)]
    paths = [request.get(timeout=30) for request in made]
    for request in [client.delete_async(path) for path in paths]:
        request.get(timeout=30)
    receipt = b'{"entry": "a", "task_id": "x", "epoch": 0}'
    for request in [client.create_async(f"{done}/{path.rsplit('/', 1)[1]}", receipt) for path in paths]:
        request.get(timeout=30)


class CountedCalls:
    """Counts the calls of some of a kazoo client's methods (the client is real)."""

    def __init__(self, client: KazooClient, monkeypatch, names: tuple[str, ...]) -> None:
        self.count = 0
        for name in names:
            original = getattr(client, name)

            def counted(*args, _original=original, **kwargs):
                self.count += 1
                return _original(*args, **kwargs)

            monkeypatch.setattr(client, name, counted)


def test_receipts_nobody_collected_are_pruned_a_bounded_batch_per_pass(
    make_scheduler, published: Published, zk_client: KazooClient, zk_root: str, monkeypatch
) -> None:
    """150 uncollected receipts: each trigger publishes, no pass looks at more than a batch, they shrink to the cap."""
    cap, batch = 50, 40
    monkeypatch.setattr(controls, "MAX_RECEIPTS", cap)
    monkeypatch.setattr(controls, "PRUNE_BATCH", batch)
    done = f"{zk_root}/v1/triggers/done"
    scheduler = make_scheduler({"a": every(3600)})
    lead(scheduler)
    scheduler.tick()
    fake_receipts(zk_client, zk_root, 150)
    looked = CountedCalls(scheduler.zk_client, monkeypatch, ("exists", "exists_async", "delete", "delete_async"))

    counts = []
    for n in range(1, 5):
        controls.request_trigger(zk_client, zk_root, "a", "op", scheduled=True)
        looked.count = 0
        wait_for(lambda n=n: scheduler.tick() is not None and published.count("a") == n, timeout=10)
        scheduler.tick()  # the pass after a publish prunes
        assert looked.count <= 2 * batch, f"one pass asked ZooKeeper about {looked.count} receipts"
        counts.append(len(zk_client.get_children(done)))
    assert counts == sorted(counts, reverse=True) and counts[-1] <= cap, f"receipts left after each pass: {counts}"

    # Past their time to live, every receipt goes, oldest first, a batch per pass.
    monkeypatch.setattr(controls, "RECEIPT_TTL", 0.0)
    controls.request_trigger(zk_client, zk_root, "a", "op", scheduled=True)
    wait_for(lambda: scheduler.tick() is not None and published.count("a") == 5, timeout=10)
    wait_for(lambda: scheduler.tick() is not None and len(zk_client.get_children(done)) <= 1, timeout=10)


def test_a_catchup_limit_above_the_maximum_is_refused_naming_the_setting() -> None:
    """zkbeat_catchup_limit above its documented maximum fails at start-up, naming the setting and the maximum."""
    assert read_settings({"zkbeat_catchup_limit": MAX_CATCHUP_LIMIT}).catchup_limit == MAX_CATCHUP_LIMIT
    with pytest.raises(ConfigurationError) as raised:
        read_settings({"zkbeat_catchup_limit": MAX_CATCHUP_LIMIT + 1})
    assert "zkbeat_catchup_limit" in str(raised.value) and f"{MAX_CATCHUP_LIMIT:,}" in str(raised.value)


def test_a_large_catchup_is_counted_a_bounded_amount_per_pass_and_publishes_each_slot_once(
    make_scheduler, published: Published, zk_client: KazooClient, zk_root: str, monkeypatch
) -> None:
    """Ten 'all' entries 20 slots behind: no pass counts more than its budget, the leader stays, each slot runs once."""
    budget, behind, names = 15, 20, [f"e{n}" for n in range(10)]
    monkeypatch.setattr(catchup, "COUNT_BUDGET", budget)
    counted = 0
    slot_after = catchup.slot_after

    def counting_slot_after(*args, **kwargs):
        nonlocal counted
        counted += 1
        return slot_after(*args, **kwargs)

    monkeypatch.setattr(catchup, "slot_after", counting_slot_after)
    last_run = datetime.now(timezone.utc) - timedelta(seconds=behind)
    ledger = Ledger(zk_client, zk_root)
    ledger.ensure()
    assert ledger.claim([Claim(name, EntryState(last_run_at=last_run)) for name in names], None).error is None

    scheduler = make_scheduler({name: every(1, options={"zkbeat_catchup": "all"}) for name in names})
    lead(scheduler)
    epoch, passes = scheduler.election.epoch, []

    def one_pass() -> bool:
        nonlocal counted
        counted = 0
        scheduler.tick()
        passes.append(counted)
        return all(published.count(name) >= behind for name in names)

    wait_for(one_pass, timeout=60)
    assert max(passes) <= budget + len(names), f"slot computations of catch-up per pass: {passes}"
    assert scheduler.election.epoch == epoch and scheduler.term is not None and scheduler.watchdog.stalls == 0
    slots = defaultdict(list)
    for name, slot, _ in published.rows:
        slots[name].append(datetime.fromisoformat(slot))
    for name in names:
        first = last_run + timedelta(seconds=1)
        assert slots[name][0] == first, f"{name} did not start from its first missed slot"
        steps = {b - a for a, b in zip(slots[name], slots[name][1:])}
        assert steps == {timedelta(seconds=1)}, f"{name}: a slot was left out or published twice: {slots[name]}"

"""What docs/sharding.md says of a sharded replica, sentence by sentence, on the real ZooKeeper and Redis.

In-process sharded schedulers (tests/conftest.py's make_scheduler); each test
names the sentence it proves. Assertions are outcomes; the one bound on a wait
(a run-now that must not wait out a 600 s sleep) is a liveness check far below
the sleep, not a timing.
"""

from __future__ import annotations

import logging
import threading
import urllib.request

import pytest
from kazoo.client import KazooClient

from tests.support.helpers import Published, every, names_in_every_shard, wait_for
from tests.support.servers import free_port
from tests.test_shards import announced, lead_every_shard, zkbeat
from tests.test_shards_review import Loop
from zkbeat.coordination.shards import shard_of, shard_root
from zkbeat.ledger import controls
from zkbeat.ticking.ticks import HEADER_MANUAL


class EnteredEvent(threading.Event):
    """threading.Event that records the timeout of each wait begun on it (a sleep of the beat loop)."""

    def __init__(self) -> None:
        super().__init__()
        self.timeouts: list[float | None] = []

    def wait(self, timeout: float | None = None) -> bool:
        self.timeouts.append(timeout)
        return super().wait(timeout)


def root_of(scheduler) -> str:
    settings = scheduler.zk_settings
    return shard_root(settings.hosts, settings.root)


def one_per_shard(root: str, names: list[str], shards: int) -> dict[int, str]:
    found: dict[int, str] = {}
    for name in names:
        found.setdefault(shard_of(root, name, shards), name)
    assert len(found) == shards, f"some shard has none of {names}: the test proves nothing"
    return found


def warm(scheduler, done) -> None:
    """Passes without sleeping (``wait_in_tick`` off) until ``done()``; the scheduler sleeps in tick() again after."""
    scheduler.wait_in_tick = False
    try:
        wait_for(lambda: scheduler.tick() is not None and done(), timeout=30)
    finally:
        del scheduler.wait_in_tick


def test_a_sleeping_leader_is_woken_by_a_run_now_request_for_a_shard_it_leads(
    make_scheduler, zk_client: KazooClient, zk_root: str, published: Published
) -> None:
    """ "Between passes a replica waits in one sleep ... woken at once when ... a run-now request comes for a
    shard it leads": a leader of both shards whose entries are due in ten minutes (and beat_max_loop_interval
    600 s) sleeps; a run-now for an entry of each shard is published long before that sleep would end."""
    names = names_in_every_shard(zk_root, 2, per_shard=4)
    scheduler = make_scheduler({n: every(600, n) for n in names}, zkbeat_shards=2, beat_max_loop_interval=600)
    lead_every_shard(scheduler)
    warm(scheduler, lambda: announced(scheduler, 2) and all(s.term is not None for s in scheduler._shards))
    root = scheduler.zk_settings.root
    targets = one_per_shard(root_of(scheduler), names, 2)
    scheduler._wake = EnteredEvent()  # the loop's one wait (election edges and the led shards' inboxes set it)
    with Loop(scheduler):
        seen = 0  # the waits begun before this round's request
        for shard, name in sorted(targets.items()):
            wait_for(
                lambda seen=seen: any(t is not None and t > 300 for t in scheduler._wake.timeouts[seen:]),
                timeout=60,
                message=lambda: f"the leader never went to sleep: waits {scheduler._wake.timeouts}",
            )
            asleep = len(scheduler._wake.timeouts)  # the sleep this request must cut short is the last of these
            request = controls.request_trigger(zk_client, root, name, "test", scheduled=True).rsplit("/", 1)[-1]
            # 60 s of a 600 s sleep: it was woken, it did not sleep its sleep out.
            wait_for(
                lambda request=request: any(h.get(HEADER_MANUAL) == request for h in published.headers),
                timeout=60,
                message=lambda name=name, shard=shard: (
                    f"the run-now of {name} (shard {shard}) waited for the leader's sleep to end"
                ),
            )
            seen = asleep  # the next round's sleep begins after this request (it may have begun already)
    assert sorted(h["zkbeat-entry"] for h in published.headers if h.get(HEADER_MANUAL)) == sorted(targets.values())


def test_each_shard_holds_only_its_own_entries_on_beats_heap(make_scheduler, zk_root: str) -> None:
    """ "A shard's leader ... holds only its shard's entries on beat's heap": after a pass, the heap of each
    shard a replica leads has exactly that shard's entries, and the heaps together have every entry once."""
    names = names_in_every_shard(zk_root, 3, per_shard=4, prefix="h")
    scheduler = make_scheduler({n: every(60, n) for n in names}, zkbeat_shards=3)
    lead_every_shard(scheduler)
    warm(scheduler, lambda: all(s.term is not None and s._heap for s in scheduler._shards))
    root = root_of(scheduler)
    for shard in scheduler._shards:
        held = sorted(event[2].name for event in shard._heap)
        assert held == sorted(n for n in names if shard_of(root, n, 3) == shard.index), (shard.index, held)
    assert sorted(event[2].name for s in scheduler._shards for event in s._heap) == sorted(names)


def exported(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as answer:
        return answer.read().decode()


def shard_leader_samples(text: str) -> dict[str, float]:
    """The value of ``zkbeat_is_shard_leader`` by its ``shard`` label, as /metrics exports it."""
    found = {}
    for line in text.splitlines():
        if line.startswith("zkbeat_is_shard_leader{"):
            labels, value = line.rsplit(" ", 1)
            shard = next(
                p.split("=")[1].strip('"')
                for p in labels[labels.index("{") + 1 : -1].split(",")
                if p.startswith("shard=")
            )
            found[shard] = float(value)
    return found


def test_the_metric_is_shard_leader_is_1_for_each_shard_led_and_0_for_one_given_up(make_scheduler) -> None:
    """ "the metric `zkbeat_is_shard_leader{shard}` is 1 on the replica that leads the shard": read from the
    replica's own /metrics endpoint, one sample per shard; a shard it steps down from reads 0."""
    port = free_port()
    scheduler = make_scheduler(
        {f"m{n}": every(60, n) for n in range(6)},
        zkbeat_shards=2,
        zkbeat_metrics_port=port,
        zkbeat_metrics_address="127.0.0.1",
    )
    lead_every_shard(scheduler)
    warm(scheduler, lambda: all(s.term is not None for s in scheduler._shards))
    assert shard_leader_samples(exported(port)) == {"0": 1.0, "1": 1.0}
    scheduler._shards[1].election.step_down(hold=True, reason="test: shard 1 given up")
    warm(scheduler, lambda: scheduler._shards[1].term is None)
    assert shard_leader_samples(exported(port)) == {"0": 1.0, "1": 0.0}


def test_a_run_now_that_times_out_names_the_leader_of_the_entrys_shard(make_scheduler, zk_root: str) -> None:
    """ "a `zkbeat trigger` that times out names the entry's shard and that shard's leader": a leader of both
    shards whose loop does not turn (it takes no request): the timeout names the shard, the leader, its epoch."""
    entries = {name: every(1, n) for n, name in enumerate(names_in_every_shard(zk_root, 2, per_shard=4))}
    scheduler = make_scheduler(entries, zkbeat_shards=2, identity="the-leader")
    lead_every_shard(scheduler)
    wait_for(lambda: announced(scheduler, 2), timeout=30)
    wait_for(lambda: scheduler.tick() is not None and len(scheduler.ledger.load()) == len(entries), timeout=30)
    name = one_per_shard(root_of(scheduler), list(entries), 2)[1]
    epoch = scheduler._shards[1].term.epoch
    done = zkbeat(scheduler, "trigger", name, "--wait-timeout", "2")  # no tick() meanwhile: nobody takes it
    assert done.returncode == 1, done.stdout + done.stderr
    assert f"shard 1/2, its shard, is led by the-leader (epoch {epoch})" in done.stderr, done.stderr


def test_pause_and_resume_hold_in_every_shard(
    make_scheduler, zk_client: KazooClient, zk_root: str, published: Published
) -> None:
    """ "Pauses, resumes ... are per entry and work the same in every shard": an entry of each of 3 shards
    paused is not published while the others go on; resumed, each is published again."""
    names = names_in_every_shard(zk_root, 3, per_shard=4, prefix="p")
    scheduler = make_scheduler({n: every(1, n) for n in names}, zkbeat_shards=3)
    lead_every_shard(scheduler)
    warm(scheduler, lambda: all(published.count(n) >= 1 for n in names))
    root = scheduler.zk_settings.root
    paused = set(one_per_shard(root_of(scheduler), names, 3).values())
    for name in paused:
        controls.pause(zk_client, root, name, "test")
    since = len(published.headers)
    others = set(names) - paused
    warm(
        scheduler,
        lambda: all(published.entries()[since:].count(n) >= 3 for n in others),
    )
    assert not paused & set(published.entries()[since:]), "a paused entry was published"
    for name in paused:
        controls.resume(zk_client, root, name)
    resumed = len(published.headers)
    warm(scheduler, lambda: all(published.entries()[resumed:].count(n) >= 2 for n in paused))


def test_a_reshard_in_process_two_values_side_by_side_then_the_old_elections_deleted(
    make_scheduler, zk_client: KazooClient, published: Published, caplog: pytest.LogCaptureFixture
) -> None:
    """A reshard from 2 to 3 shards, one replica of each value running side by side:

    "The first replica restarted with the new value ... leads every shard of the new value itself" (and the
    old replica every shard of the old); both claim the same entries, one claim commits and the other "logs
    'ledger entry ... changed underneath'" and goes on; nothing is published twice. "<root>/v1/shards/<old N>
    may be deleted once no replica runs with it": deleted after the old replica stops, the new value's leader
    publishes every entry on.
    """
    names = [f"r{n}" for n in range(9)]
    entries = {n: every(1, n) for n in names}
    old = make_scheduler(entries, zkbeat_shards=2, identity="old")
    new = make_scheduler(entries, zkbeat_shards=3, identity="new")
    lead_every_shard(old)
    lead_every_shard(new)
    root = new.zk_settings.root
    with caplog.at_level(logging.WARNING, logger="zkbeat"):
        old.wait_in_tick = new.wait_in_tick = False
        wait_for(
            lambda: (
                old.tick() is not None
                and new.tick() is not None
                and all(published.count(n) >= 3 for n in names)
                and any("changed underneath" in r.getMessage() for r in caplog.records)
            ),
            timeout=60,
            message=lambda: f"no conflict between the two values' leaders: {published.entries()}",
        )
    slots = [(entry, slot) for entry, slot, _ in published.rows]
    assert len(slots) == len(set(slots)), "a slot was published twice while both values ran"
    assert all(s.election.leadership is not None for s in new._shards), "the new value's replica gave a shard up"
    old.close()
    zk_client.delete(f"{root}/v1/shards/2", recursive=True)
    since = len(published.headers)
    wait_for(
        lambda: new.tick() is not None and all(published.entries()[since:].count(n) >= 2 for n in names),
        timeout=60,
        message=lambda: f"not every entry published after {root}/v1/shards/2 was deleted",
    )
    slots = [(entry, slot) for entry, slot, _ in published.rows]
    assert len(slots) == len(set(slots)), "a slot was published twice"
    assert all(s.election.leadership is not None for s in new._shards)

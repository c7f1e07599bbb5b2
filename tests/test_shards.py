"""The shard function and the fair share (pure logic), then sharded schedulers in-process on real servers."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections import defaultdict
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from kazoo.client import KazooClient

from tests.support.helpers import Published, every, names_in_every_shard, wait_for
from tests.support.proxy import TcpProxy
from tests.test_jitter import Sent
from zkbeat.conf import MAX_SHARDS, read_settings
from zkbeat.coordination.shards import election_path, handover_path, rebalance, shard_of
from zkbeat.exceptions import ConfigurationError
from zkbeat.ledger.store import Claim, EntryState, Ledger
from zkbeat.ops.status import read_shards
from zkbeat.ticking.jitter import offset

ROOT = Path(__file__).resolve().parents[1]


def test_the_shard_of_an_entry_is_pinned_for_every_release() -> None:
    """An entry's shard is a fixed function of root, name and N: these values may never change."""
    assert [shard_of("/zkbeat/proj", f"entry-{i}", 3) for i in range(8)] == [2, 0, 2, 1, 1, 0, 0, 0]
    assert shard_of("/zkbeat/proj", "tick", 256) == 150
    assert shard_of("/zkbeat/other", "tick", 256) == 186


def test_one_shard_holds_everything() -> None:
    """With N = 1 every entry is in shard 0."""
    assert {shard_of("/r", f"e{i}", 1) for i in range(100)} == {0}


def test_entries_spread_over_the_shards() -> None:
    """300 names over 3 shards: every shard gets a fair part (a hash, not a single bucket)."""
    counts = [0, 0, 0]
    for i in range(300):
        counts[shard_of("/zkbeat/proj", f"entry-{i}", 3)] += 1
    assert all(60 <= count <= 140 for count in counts), counts


def test_one_shard_keeps_the_layout_1_paths() -> None:
    """N = 1 is today's election and handover paths; N > 1 puts N and the shard in the path."""
    assert election_path("/zkbeat/p") == "/zkbeat/p/v1/election"
    assert handover_path("/zkbeat/p") == "/zkbeat/p/v1/handover"
    assert election_path("/zkbeat/p", 2, 3) == "/zkbeat/p/v1/shards/3/2/election"
    assert handover_path("/zkbeat/p", 0, 3) == "/zkbeat/p/v1/shards/3/0/handover"


@pytest.mark.parametrize("value", [0, -1, "two", MAX_SHARDS + 1, 2.5, True, ""])
def test_bad_shards_name_the_setting(value: object) -> None:
    """0, a negative number, a string, above the maximum: one error naming zkbeat_shards and the value."""
    with pytest.raises(ConfigurationError) as raised:
        read_settings({"zkbeat_shards": value}, "proj")
    assert str(raised.value).startswith(f"zkbeat_shards={value!r}: ")
    assert f"from 1 to {MAX_SHARDS}" in str(raised.value)


@pytest.mark.parametrize(("value", "expected"), [(None, 1), (1, 1), (3, 3), ("3", 3), (MAX_SHARDS, MAX_SHARDS)])
def test_good_shards(value: object, expected: int) -> None:
    """Unset is 1; a whole number (or its digits, from the environment) up to the maximum is kept."""
    assert read_settings({"zkbeat_shards": value}, "proj").shards == expected


def test_a_replica_leading_everything_hands_a_shard_to_one_that_leads_none() -> None:
    """Three replicas, A leads all 3 shards: A steps down from a shard whose next in line leads none."""
    lines = {0: ("A", "B", "C"), 1: ("A", "B", "C"), 2: ("A", "B", "C")}
    move = rebalance(lines, "A", 3)
    assert move is not None and move.lead and move.shard == 2
    assert rebalance(lines, "B", 3) is None  # B leads none: nothing to give up


def test_a_follower_at_its_share_steps_back_for_one_below_it() -> None:
    """A leads 2 (share 1) but B, next in both its lines, leads 1: B steps back so that C comes next."""
    lines = {0: ("A", "B", "C"), 1: ("A", "B", "C"), 2: ("B", "A", "C")}
    move = rebalance(lines, "A", 3)  # no leader-move yet (nobody below the share is next in A's lines),
    assert move is not None and not move.lead and move.shard == 2  # but A, next for shard 2, steps back there
    move = rebalance(lines, "B", 3)
    assert move is not None and not move.lead and move.shard == 0
    after = {0: ("A", "C", "B"), 1: ("A", "B", "C"), 2: ("B", "A", "C")}
    move = rebalance(after, "A", 3)
    assert move is not None and move.lead and move.shard == 0


def test_a_fair_picture_moves_nothing() -> None:
    """Each leads its share (also with a 4th replica that leads none: ceil(3/4) = 1): no leadership moves.

    With the 4th, the followers next in line step back behind it, so that a crash goes to the idle replica.
    """
    lines = {0: ("A", "B", "C"), 1: ("B", "C", "A"), 2: ("C", "A", "B")}
    assert [rebalance(lines, r, 3) for r in "ABC"] == [None, None, None]
    joined = {k: (*line, "D") for k, line in lines.items()}
    moves = [rebalance(joined, r, 3) for r in "ABCD"]
    assert not any(move.lead for move in moves if move is not None)
    assert moves[3] is None


def test_settling_converges_from_any_start() -> None:
    """Applying moves one at a time from a lopsided start ends fair, in a bounded number of moves."""
    lines = {k: ["A", "B", "C", "D"] for k in range(5)}
    for _ in range(100):
        moved = False
        for replica in "ABCD":
            move = rebalance({k: tuple(v) for k, v in lines.items()}, replica, 5)
            if move is not None:
                lines[move.shard].remove(replica)
                lines[move.shard].append(replica)
                moved = True
        if not moved:
            break
    else:
        pytest.fail(f"never settled: {lines}")
    leads = [line[0] for line in lines.values()]
    assert max(leads.count(r) for r in "ABCD") == 2  # ceil(5/4)


def test_metrics_and_healthz_name_the_shards_led() -> None:
    """With shards, a replica leads while it leads any shard; /healthz lists each shard it leads with its epoch."""
    from zkbeat.ops.metrics import Metrics

    metrics = Metrics(read_settings({"zkbeat_shards": 3}, "proj"))
    metrics.shard_leadership(0, 5)
    metrics.shard_leadership(2, 7)
    _, health = metrics.health()
    assert health["is_leader"] is True and health["shards"] == {"0": 5, "2": 7}
    metrics.shard_leadership(0, None)
    metrics.shard_leadership(2, None)
    _, health = metrics.health()
    assert health["is_leader"] is False and health["shards"] == {}
    assert "shards" not in Metrics(read_settings({}, "proj")).health()[1]  # one shard: /healthz as it always was


# -- in-process sharded schedulers, real ZooKeeper and Redis ------------------


def lead_every_shard(scheduler) -> None:
    for shard in scheduler._shards:
        assert shard.election.wait_for_leadership(15), f"never led shard {shard.index}"


def announced(scheduler, shards: int) -> bool:
    """One pass, then whether every shard's election names its leader (what `zkbeat status` reads)."""
    scheduler.tick()
    return all(s.leader is not None for s in read_shards(scheduler.zk_client, scheduler.zk_settings.root, shards))


def zkbeat(scheduler, *args: str) -> subprocess.CompletedProcess:
    """The zkbeat command against the scheduler's hosts and root (without the app: it finds the shards itself)."""
    settings = scheduler.zk_settings
    return subprocess.run(
        [sys.executable, "-m", "zkbeat.ops.cli", "--hosts", settings.hosts, "--root", settings.root, *args],
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )


class CountingEvent(threading.Event):
    """threading.Event that counts how often a waiter waited on it."""

    def __init__(self) -> None:
        super().__init__()
        self.waits = 0

    def wait(self, timeout: float | None = None) -> bool:
        self.waits += 1
        return super().wait(timeout)


def test_an_idle_sharded_follower_sleeps_in_one_wait(make_scheduler) -> None:
    """An idle sharded follower's tick waits once for max_interval (woken by any shard's election), not in slices."""
    entries = {f"e{n}": every(60, n) for n in range(4)}
    leader = make_scheduler(entries, zkbeat_shards=2, beat_max_loop_interval=3)
    lead_every_shard(leader)
    follower = make_scheduler(entries, zkbeat_shards=2, beat_max_loop_interval=3)
    wait_for(lambda: all(s.election.leadership is None for s in follower._shards), timeout=15)
    follower.tick()  # settles the fair share's first read
    follower._wake = CountingEvent()
    follower.tick()  # nothing changes hands for max_interval (3 s)
    assert all(s.election.leadership is None for s in follower._shards)
    assert follower._wake.waits <= 3, f"woke {follower._wake.waits} times in one idle tick"


def test_an_idle_sharded_follower_wakes_when_a_shard_comes_to_it(make_scheduler) -> None:
    """The one wait ends when the shards' leader goes: the follower's tick returns, leading, within its max_interval."""
    entries = {f"e{n}": every(600, n) for n in range(4)}
    leader = make_scheduler(entries, zkbeat_shards=2, beat_max_loop_interval=600)
    lead_every_shard(leader)
    follower = make_scheduler(entries, zkbeat_shards=2, beat_max_loop_interval=600)
    wait_for(lambda: all(s.election.leadership is None for s in follower._shards), timeout=15)
    sleeps: list[float | None] = []  # the timeout of each wait the follower's loop begins
    wait = follower._wake.wait
    follower._wake.wait = lambda timeout=None: (sleeps.append(timeout), wait(timeout))[1]

    def idle() -> None:
        """Ticks until one goes to sleep for long (a tick just after joining may return early, its lines moving)."""
        while True:
            begun = len(sleeps)
            follower.tick()
            if any(t is not None and t > 300 for t in sleeps[begun:]):
                return

    waiting = threading.Thread(target=idle, daemon=True)  # idle: up to 600 s unless an election wakes it
    waiting.start()
    wait_for(lambda: any(t is not None and t > 300 for t in sleeps), timeout=60, message=lambda: f"waits {sleeps}")
    leader.close()  # while the follower sleeps: only a wake-up ends its tick within the join below
    waiting.join(120)
    assert not waiting.is_alive(), "the follower slept on though the shards came to it"
    # Woken by the change of the lines or by the election's edge, whichever came first: the election (its own
    # thread) makes it leader at once, without another sleep of the loop.
    wait_for(lambda: any(s.election.leadership is not None for s in follower._shards), timeout=30)


def test_a_run_now_timeout_names_the_entrys_shard_and_that_nobody_leads_it(make_scheduler, zk_root: str) -> None:
    """`zkbeat trigger` for an entry of a shard nobody leads says so, naming the shard, while the other one is led."""
    entries = {name: every(1, n) for n, name in enumerate(names_in_every_shard(zk_root, 2, per_shard=4))}
    scheduler = make_scheduler(entries, zkbeat_shards=2)
    lead_every_shard(scheduler)
    wait_for(lambda: announced(scheduler, 2), timeout=30)
    wait_for(lambda: scheduler.tick() is not None and len(scheduler.ledger.load()) == len(entries), timeout=30)
    root = scheduler.zk_settings.root
    name = next(n for n in entries if shard_of(root, n, 2) == 1)
    scheduler._shards[1].election.step_down(hold=True, reason="test: shard 1 without a leader")
    scheduler.tick()  # shard 0 leads on; shard 1 has nobody in line
    done = zkbeat(scheduler, "trigger", name, "--wait-timeout", "2")
    assert done.returncode == 1, done.stdout + done.stderr
    assert "shard 1/2" in done.stderr and "no replica is in the line of shard 1/2" in done.stderr, done.stderr
    assert "no replica leads now" not in done.stderr, done.stderr


def test_step_down_wait_after_a_reshard_waits_for_a_run_of_the_new_leader_itself(
    make_scheduler, zk_client: KazooClient
) -> None:
    """After a change of zkbeat_shards the entries carry epochs of the old election, above the new leader's:
    `step-down --wait` says "has published" only once the new leader recorded a run itself."""
    names = [f"r{n}" for n in range(6)]
    old = make_scheduler({n: every(1, n) for n in names}, zkbeat_shards=1, identity="old")
    root = old.zk_settings.root
    assert old.election.wait_for_leadership(15)
    for _ in range(10):  # an old election that has seen some candidates: its epochs are well above 0
        zk_client.delete(zk_client.create(f"{root}/v1/election/bump-", sequence=True))
    old.election.step_down(reason="test: a later epoch")
    wait_for(lambda: old.tick() is not None and (old.term is not None and old.term.epoch >= 10), timeout=30)
    wait_for(
        lambda: (
            old.tick() is not None
            and len(records := old.ledger.load(names)) == len(names)
            and all(r.state.epoch >= 10 for r in records.values())
        ),
        timeout=30,
    )
    old.close()
    new = make_scheduler({n: every(600, n) for n in names}, zkbeat_shards=2, identity="new")
    shard = shard_of(root, names[0], 2)
    wait_for(lambda: announced(new, 2), timeout=30)
    before = {n: r.state.total_run_count for n, r in new.ledger.load(names).items()}
    stop = threading.Event()
    loop = threading.Thread(target=lambda: [new.tick() for _ in iter(stop.is_set, True)], daemon=True)
    loop.start()
    try:
        done = zkbeat(new, "step-down", "--shard", str(shard), "--wait", "--wait-timeout", "6")
    finally:
        stop.set()
        loop.join(10)
    after = {n: r.state.total_run_count for n, r in new.ledger.load(names).items()}
    assert after == before, "the new leader did publish: the test proved nothing"
    assert done.returncode == 1, f"--wait said a new leader published though none did: {done.stdout!r}"
    assert "no new leader published within 6s" in done.stderr, done.stderr


def test_a_stalled_pass_steps_the_replica_down_from_every_shard_it_leads(
    make_scheduler, published: Published, redis_server
) -> None:
    """A send hung on a black-holed broker past zkbeat_stall_timeout: the watchdog steps down from both shards
    it leads (held out of both lines); once the loop turns again it leads both again."""
    with TcpProxy(redis_server.port) as proxy:
        entries = {f"e{n}": every(1, n) for n in range(8)}
        scheduler = make_scheduler(
            entries,
            zkbeat_shards=2,
            broker_url=f"redis://127.0.0.1:{proxy.port}/0",
            beat_max_loop_interval=1,
            zkbeat_stall_timeout=6,
        )
        lead_every_shard(scheduler)
        wait_for(lambda: scheduler.tick() is not None and len(published.headers) >= len(entries), timeout=30)
        proxy.blackhole()
        stop = threading.Event()
        loop = threading.Thread(target=lambda: [scheduler.tick() for _ in iter(stop.is_set, True)], daemon=True)
        loop.start()  # ticks until a send hangs on the silent broker (a write may still fit in a buffer)
        wait_for(lambda: all(s.election.leadership is None for s in scheduler._shards), timeout=60)
        # The watchdog steps down first and counts the stall after (its own thread): wait for the count.
        wait_for(lambda: scheduler.watchdog.stalls >= 1, timeout=30, message="stepped down, but not by the watchdog")
        assert scheduler.watchdog.stalls == 1, "the watchdog fired more than once for one hung pass"
        stop.set()
        proxy.heal()
        loop.join(60)
        assert not loop.is_alive(), "the hung send never ended after the broker came back"
    wait_for(
        lambda: scheduler.tick() is not None and all(s.election.leadership is not None for s in scheduler._shards),
        timeout=30,
    )


def test_catch_up_and_jitter_work_in_every_shard(
    make_scheduler, zk_client: KazooClient, zk_root: str, published: Published
) -> None:
    """Entries of both shards 5 slots behind with catch-up 'all' publish each missed slot once, from the first;
    jittered entries of both shards go out no earlier than slot + offset."""
    behind = 5

    late = names_in_every_shard(zk_root, 2, per_shard=2, prefix="late")
    spread = names_in_every_shard(zk_root, 2, per_shard=2, prefix="spread")
    last_run = datetime.now(timezone.utc) - timedelta(seconds=behind)
    ledger = Ledger(zk_client, zk_root)
    ledger.ensure()
    assert ledger.claim([Claim(name, EntryState(last_run_at=last_run)) for name in late], None).error is None
    sent = Sent()
    try:
        scheduler = make_scheduler(
            {
                **{n: every(1, options={"zkbeat_catchup": "all"}) for n in late},
                **{n: every(2, options={"zkbeat_jitter": 1.5}) for n in spread},
            },
            zkbeat_shards=2,
        )
        lead_every_shard(scheduler)
        wait_for(
            lambda: (
                scheduler.tick() is not None
                and all(published.count(n) >= behind for n in late)
                and all(len(sent.of(n)) >= 2 for n in spread)
            ),
            timeout=60,
        )
        slots = defaultdict(list)
        for name, slot, _ in published.rows:
            slots[name].append(datetime.fromisoformat(slot))
        for name in late:
            assert slots[name][0] == last_run + timedelta(seconds=1), f"{name} did not start from its first missed slot"
            steps = {b - a for a, b in zip(slots[name], slots[name][1:])}
            assert steps == {timedelta(seconds=1)}, f"{name}: a slot left out or published twice: {slots[name]}"
        for name in spread:
            rows = sent.of(name)
            assert len({slot for slot, _, _ in rows}) == len(rows), f"{name}: a slot published twice"
            for slot, at, _ in rows:
                assert at >= (slot + timedelta(seconds=offset(zk_root, name, slot, 1.5))).timestamp()
    finally:
        sent.close()


def test_a_shards_term_loads_and_holds_only_its_own_shards_ledger(make_scheduler, zk_root: str) -> None:
    """A new leader of one shard reads that shard's ledger znodes alone: a takeover's load and the term's memory
    scale with the shard, not with the whole schedule (and a term never touches another shard's entries)."""
    entries = {name: every(1, n) for n, name in enumerate(names_in_every_shard(zk_root, 2, per_shard=6))}
    first = make_scheduler(entries, zkbeat_shards=2)
    lead_every_shard(first)
    wait_for(lambda: first.tick() is not None and len(first.ledger.load()) == len(entries), timeout=30)
    first.close()
    root = first.zk_settings.root
    mine = {index: {n for n in entries if shard_of(root, n, 2) == index} for index in (0, 1)}
    assert mine[0] and mine[1], "every entry in one shard: the test proves nothing"
    second = make_scheduler(entries, zkbeat_shards=2)
    lead_every_shard(second)
    wait_for(lambda: second.tick() is not None and all(s.term is not None for s in second._shards), timeout=30)
    for shard in second._shards:
        term = shard.term
        assert term.records_loaded == len(mine[shard.index]), (shard.index, term.records_loaded)
        assert set(term.known) == mine[shard.index], (shard.index, sorted(term.known))


def test_a_replaced_schedule_is_read_again_in_every_shard(make_scheduler, zk_root: str) -> None:
    """A host that replaces its whole schedule (a DatabaseScheduler taking back the schedule it set aside does so
    from beat's loop, outside any shard's part) has every shard's term read the ledger again and every heap rebuilt,
    not only the shard whose state happened to be current."""
    entries = {name: every(1, n) for n, name in enumerate(names_in_every_shard(zk_root, 2, per_shard=4))}
    scheduler = make_scheduler(entries, zkbeat_shards=2)
    lead_every_shard(scheduler)
    wait_for(
        lambda: scheduler.tick() is not None and all(s.term is not None and s.term.known for s in scheduler._shards),
        timeout=30,
    )
    scheduler.schedule_replaced()
    for shard in scheduler._shards:
        assert not shard.term.known, f"shard {shard.index} kept its view of the ledger"
        assert shard._heap is None, f"shard {shard.index} kept its heap"

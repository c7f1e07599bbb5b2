"""Sharded leadership under hostile conditions: what the fair share, the wait and the docs promise.

In-process sharded schedulers on the real ZooKeeper and Redis of tests/support,
driven by their own loops in threads; the assertions are outcomes (who led
what, how often), never timings.
"""

from __future__ import annotations

import hashlib
import re
import threading
from pathlib import Path
from typing import Any

import zkbeat.coordination.shards as shards_module
import zkbeat.leading.leadership as leadership_module
from tests.support.helpers import every, names_in_every_shard, wait_for
from tests.test_shards import lead_every_shard
from zkbeat.coordination.shards import shard_of

ROOT = Path(__file__).resolve().parents[1]


class Loop:
    """Run a scheduler's beat loop (tick() after tick()) in a thread; closes the scheduler when it ends."""

    def __init__(self, scheduler: Any) -> None:
        self.scheduler = scheduler
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set() and not self.scheduler.closed:
            self.scheduler.tick()

    def __enter__(self) -> Loop:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self.scheduler.close()  # ends a wait of its loop at once (up to beat_max_loop_interval otherwise)
        self._thread.join(60)


def count_terms(scheduler: Any) -> list[tuple[int, int]]:
    """Record (shard, epoch) each time ``scheduler`` begins a term (becomes leader of a shard).

    Recorded once the begin returned: one that raised began nothing. The shard is the one whose election the
    fence's candidate stands in, not the scheduler's current shard, which :class:`Loop`'s close() (on the
    test's thread) switches while a pass of the loop's thread may be under way. The same pair twice is a term
    begun again under the same candidate (after an error; or by that pass in flight, which finds the term
    close() just ended and begins it again): no handover, which only a new epoch of a shard or another
    replica's term shows.
    """
    begun: list[tuple[int, int]] = []
    original = scheduler._begin_term
    shard_of_election = {shard.election.path: shard.index for shard in scheduler._shards}

    def begin(fence: Any) -> None:
        original(fence)
        begun.append((shard_of_election[fence.candidate.rsplit("/", 1)[0]], fence.epoch))

    scheduler._begin_term = begin
    return begun


def test_the_fair_share_does_not_hand_shards_again_and_again_to_a_replica_whose_schedule_never_loads(
    make_scheduler, monkeypatch, zk_root: str
) -> None:
    """A replica whose schedule does not load (a DatabaseScheduler that cannot reach its database) steps aside
    after zkbeat_stall_timeout; the shard it led goes back to the healthy replica. Once it rejoins the lines,
    the healthy replica (above its share) must not hand it a shard again: each such handover leaves the shard
    unpublished for another zkbeat_stall_timeout, for ever (a ping-pong; "nothing single stops the schedule")."""
    monkeypatch.setattr(leadership_module, "LOAD_RECHECK", 3.0)  # rejoin soon after stepping aside (30 s in production)
    monkeypatch.setattr(shards_module, "SETTLE_TIME", 0.2)  # the fair share acts soon on what it sees
    entries = {name: every(1, n) for n, name in enumerate(names_in_every_shard(zk_root, 2, per_shard=4))}
    settings = {"zkbeat_shards": 2, "zkbeat_stall_timeout": 5.5, "beat_max_loop_interval": 0.2}
    good = make_scheduler(entries, identity="good", **settings)
    lead_every_shard(good)
    broken = make_scheduler(entries, identity="broken", **settings)
    broken.schedule_loaded = lambda: False  # as a DatabaseScheduler whose database cannot be read
    terms = count_terms(broken)
    stepped_aside: list[int] = []  # the terms begun when the broken replica stepped aside
    original_step_down = broken.metrics.schedule_load_step_down
    broken.metrics.schedule_load_step_down = lambda: (stepped_aside.append(len(terms)), original_step_down())

    decisions = []  # (the move, the lines it was decided from), after the broken replica first stepped aside
    decide = good._fair_share.decide

    def counting_decide() -> Any:
        move = decide()
        if stepped_aside:
            decisions.append((move, dict(good._fair_share._lines)))
        return move

    good._fair_share.decide = counting_decide
    with Loop(good), Loop(broken):
        wait_for(lambda: terms, timeout=30, message="the fair share never handed the broken replica a shard")
        wait_for(lambda: stepped_aside, timeout=60, message="the broken replica never stepped aside")
        first = stepped_aside[0]
        # The healthy replica leads both shards again (above its share of 1), the broken one is back in line.
        wait_for(
            lambda: len(terms) > first or len([m for m, _ in decisions if m is None]) >= 50,
            timeout=60,
            message=lambda: f"the healthy replica made no decisions after the step-aside: {decisions}",
        )
    moves = [(move, lines) for move, lines in decisions if move is not None]
    assert len(terms) == first, (
        f"a shard was handed again to the replica that cannot load its schedule: terms begun {terms}, "
        f"moves {moves}, the broken replica is {broken._replica}"
    )


def test_an_idle_leader_of_every_shard_hands_one_to_a_replica_that_joins_without_waiting_out_its_sleep(
    make_scheduler,
) -> None:
    """A replica leads both shards, whose entries are due in ten minutes: its loop sleeps (one wait, up to
    beat_max_loop_interval). A second replica joins. "A replica that joins gets its share by graceful
    handover", once the lines stood still for 2 s: the sleeping leader must wake for the change of the lines
    (and again once they stood still), not act only at its next entry or max_interval, twice over."""
    entries = {f"e{n}": every(600, n) for n in range(8)}
    settings = {"zkbeat_shards": 2, "beat_max_loop_interval": 600}
    first = make_scheduler(entries, identity="first", **settings)
    lead_every_shard(first)
    with Loop(first):
        wait_for(lambda: first._fair_share is not None and first._fair_share.lines(), timeout=30)
        joined = make_scheduler(entries, identity="joined", **settings)
        with Loop(joined):
            wait_for(
                lambda: any(s.election.leadership is not None for s in joined._shards),
                timeout=60,
                message=lambda: f"the joined replica never got its share: lines {first._fair_share._lines}",
            )
            # Asked while the joined replica runs: once it stops, its shard goes back to the first one.
            assert [s.election.leadership is not None for s in first._shards].count(True) == 1


class _Digest(bytes):
    """A SHA-1 digest as the docs' formula reads it: bytes, and ``digest mod N`` as the number they spell."""

    def __mod__(self, other: object) -> int:
        return int.from_bytes(self, "big") % other  # type: ignore[operator]


def _documented_shard(formula: str, root: str, name: str, shards: int) -> int:
    """Evaluate the formula a doc gives for an entry's shard (``sha1(...)``, ``mod``) for one entry."""
    code = formula.replace(" mod ", " % ").replace('"\\0"', '"\\x00"')
    scope = {"sha1": lambda text: _Digest(hashlib.sha1(text.encode()).digest()), "int": int}
    return eval(code, scope, {"root": root, "name": name, "N": shards})  # noqa: S307 - our own docs' formula


def test_the_shard_formula_the_docs_give_is_the_one_the_code_computes() -> None:
    """docs/sharding.md and docs/django.md give the formula of an entry's shard, "the same on every replica,
    platform and release": anyone who computes it from the docs (a script that routes, a dashboard of another
    language) must get zkbeat's own answer."""
    for doc in ("docs/sharding.md", "docs/django.md"):
        text = " ".join((ROOT / doc).read_text().split())
        found = re.search(r"belongs to shard `([^`]+)`", text)
        assert found is not None, f"{doc} no longer gives the formula"
        for shards in (2, 3, 7, 64):
            for n in range(50):
                name = f"entry-{n}"
                assert _documented_shard(found.group(1), "/zkbeat/proj", name, shards) == shard_of(
                    "/zkbeat/proj", name, shards
                ), f"{doc}: `{found.group(1)}` puts {name} in another shard of {shards} than zkbeat does"


def test_every_entry_is_led_when_replicas_name_the_same_root_through_a_chroot_or_without(
    make_scheduler, zk_server, zk_client, zk_root: str, published
) -> None:
    """Two replicas on the same znodes: one with ``zkbeat_hosts = "zk:2181/<base>"`` and ``zkbeat_root =
    "/app"``, the other with no chroot and ``zkbeat_root = "<base>/app"`` (a move to a chroot, rolled out one
    replica at a time). Same elections, same ledger, same zkbeat_shards: each leads one shard. The shard of an
    entry must be the same on both, else an entry that each puts in the other's shard is led by nobody and
    never published (silently: both replicas are healthy, every shard has a leader)."""
    zk_client.ensure_path(zk_root)  # the chroot
    names = [f"e{n}" for n in range(40)]
    plain_root = f"{zk_root}/app"
    # Entries the two roots put in different shards, both ways round.
    split = [n for n in names if shard_of(plain_root, n, 2) != shard_of("/app", n, 2)]
    chosen = [next(n for n in split if shard_of(plain_root, n, 2) == k) for k in (0, 1)]
    entries = {name: every(1) for name in chosen}
    plain = make_scheduler(entries, identity="plain", zkbeat_root=plain_root, zkbeat_shards=2)
    lead_every_shard(plain)
    chrooted = make_scheduler(
        entries, identity="chrooted", hosts=f"{zk_server.hosts}{zk_root}", zkbeat_root="/app", zkbeat_shards=2
    )
    with Loop(plain), Loop(chrooted):
        wait_for(
            lambda: all(any(s.election.leadership for s in r._shards) for r in (plain, chrooted)),
            timeout=60,
            message="the two replicas never shared the shards",
        )
        since = {name: published.count(name) for name in chosen}
        wait_for(
            lambda: all(published.count(name) >= since[name] + 3 for name in chosen),
            timeout=30,
            raise_on_timeout=False,
        )
        led = {
            r.zk_settings.identity: [s.index for s in r._shards if s.election.leadership is not None]
            for r in (plain, chrooted)
        }
    stalled = [name for name in chosen if published.count(name) < since[name] + 3]
    assert not stalled, f"entries no shard's leader holds: {stalled} (shards led: {led})"


def test_the_root_an_entry_is_hashed_under_is_its_full_path_in_zookeeper() -> None:
    """The chroot of zkbeat_hosts, then zkbeat_root: the same key whichever way a replica names the znodes."""
    from zkbeat.coordination.shards import shard_root

    assert shard_root("zk1:2181,zk2:2181", "/zkbeat/proj") == "/zkbeat/proj"
    assert shard_root("zk1:2181,zk2:2181/apps", "/zkbeat/proj") == "/apps/zkbeat/proj"
    assert shard_root("zk1:2181/apps/", "/zkbeat/proj") == "/apps/zkbeat/proj"
    assert shard_root("zk1:2181/apps", "/") == "/apps"

"""A replica that cannot lead now (its schedule did not load as leader) is marked unready for every replica.

Before the mark, only the replica that had handed it a shard knew (for
FAILED_TARGET_TIME); any other healthy replica above its share handed it one
more, and each such handover left that shard unpublished for
zkbeat_stall_timeout. In-process sharded schedulers on the real ZooKeeper
and Redis of tests/support; the assertions are outcomes (who led what).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import threading
import time
from typing import Any

import pytest
from kazoo.client import KazooClient
from kazoo.exceptions import ConnectionLoss
from kazoo.security import make_digest_acl

import zkbeat.coordination.shards as shards_module
import zkbeat.leading.leadership as leadership_module
import zkbeat.leading.sharded as sharded_module
from tests.support.browser import Dashboard, browser_page
from tests.support.helpers import Published, every, names_in_every_shard, wait_for
from tests.support.servers import free_port
from tests.test_shards import lead_every_shard, zkbeat
from tests.test_shards_review import Loop, count_terms
from zkbeat.conf import read_settings
from zkbeat.coordination.candidates import CandidateReader
from zkbeat.coordination.shards import REPLICA_KEY, FairShare, Move, election_path, rebalance, unready_path
from zkbeat.ops.dashboard.model import ClusterModel

# -- the rule -------------------------------------------------------------------


def test_no_shard_is_handed_to_a_replica_marked_unready() -> None:
    """A leads both shards and B, next in line, leads none: unmarked, B gets one; marked unready, nothing moves
    (the share is counted over the replicas that can lead: A leads its share)."""
    lines = {0: ("A", "B"), 1: ("A", "B")}
    assert rebalance(lines, "A", 2) == Move(1, True, "fair share: leads 2 of 2 shards, 2 replicas")
    assert rebalance(lines, "A", 2, unready={"B"}) is None
    assert rebalance(lines, "B", 2, unready={"B"}) is None


def test_a_follower_does_not_step_back_for_a_replica_marked_unready() -> None:
    """A at its share, next in line of C's shard with U behind it: A would step back for a replica that leads
    none, so that a crash of C moves the shard there; not for U, which cannot lead it."""
    lines = {0: ("A", "B", "U"), 1: ("B", "A", "U"), 2: ("C", "A", "U")}
    assert rebalance(lines, "A", 3) is not None
    assert rebalance(lines, "A", 3, unready={"U"}) is None


def test_a_replica_marked_unready_steps_back_behind_one_that_can_lead() -> None:
    """U, unready, next in line of shard 0 with A behind it, steps back there (a crash of B then goes to A);
    next in line with only unready replicas behind, or last, it stays."""
    assert rebalance({0: ("B", "U", "A"), 1: ("A", "B", "U")}, "U", 2, unready={"U"}) == Move(
        0, False, "not ready to lead: a replica that can lead goes first"
    )
    assert rebalance({0: ("B", "U", "V"), 1: ("A", "B", "U")}, "U", 2, unready={"U", "V"}) is None
    assert rebalance({0: ("B", "A", "U")}, "U", 1, unready={"U"}) is None


def test_with_every_replica_unready_the_share_is_counted_over_all() -> None:
    """Nobody can lead: no division by zero, no move towards anyone."""
    lines = {0: ("A", "B"), 1: ("A", "B")}
    assert rebalance(lines, "A", 2, unready={"A", "B"}) is None


# -- replicas on real ZooKeeper --------------------------------------------------


def lines_of(client: KazooClient, root: str, shards: int) -> dict[int, tuple[str, ...]]:
    """Each shard's line of replica ids, as ZooKeeper has it now."""
    lines = {}
    for k in range(shards):
        candidates = CandidateReader(client, election_path(root, k, shards)).read().candidates
        lines[k] = tuple(str(c.data.get(REPLICA_KEY)) for c in candidates)
    return lines


@pytest.fixture
def quick(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(leadership_module, "LOAD_RECHECK", 3.0)  # rejoin soon after stepping aside (30 s in production)
    monkeypatch.setattr(shards_module, "SETTLE_TIME", 0.2)  # the fair share acts soon on what it sees
    monkeypatch.setattr(sharded_module, "READY_PROBE", 0.5)  # ask soon whether the schedule can be read again


def test_a_replica_whose_schedule_does_not_load_is_handed_no_shard_by_any_replica_until_it_can_read_it(
    make_scheduler, zk_client: KazooClient, zk_root: str, published: Published, quick: None
) -> None:
    """``good`` leads both shards; ``broken`` (its schedule never loads, as a DatabaseScheduler whose database
    it cannot reach) is handed one, steps aside and marks itself unready. A second healthy replica, ``fresh``,
    that never handed it anything joins, and ``good`` stops: ``fresh`` leads both shards, above its share, and
    must hand ``broken`` nothing (before the mark it did, and every such handover left the shard unpublished for
    zkbeat_stall_timeout). ``broken``, next in line of both shards when ``fresh`` joins behind it, steps back, so
    that ``good`` stopping moves both shards to ``fresh``. Once ``broken`` can read its schedule it unmarks
    itself and gets its share."""
    entries = {name: every(0.5, n) for n, name in enumerate(names_in_every_shard(zk_root, 2, per_shard=3))}
    settings = {"zkbeat_shards": 2, "zkbeat_stall_timeout": 5.5, "beat_max_loop_interval": 0.2}
    good = make_scheduler(entries, identity="good", **settings)
    lead_every_shard(good)
    broken = make_scheduler(entries, identity="broken", **settings)
    can_read = {"now": False}
    broken.schedule_loaded = lambda: can_read["now"]
    broken.schedule_readable = lambda: can_read["now"]
    terms = count_terms(broken)
    stepped_aside: list[int] = []  # the terms begun when it stepped aside
    original = broken.metrics.schedule_load_step_down
    broken.metrics.schedule_load_step_down = lambda: (stepped_aside.append(len(terms)), original())
    mark = f"{unready_path(zk_root)}/{broken._replica}"

    with contextlib.ExitStack() as stack:
        good_loop = stack.enter_context(Loop(good))
        stack.enter_context(Loop(broken))
        wait_for(lambda: stepped_aside, timeout=60, message="the broken replica was never handed a shard")
        handed = stepped_aside[0]
        found = wait_for(lambda: zk_client.exists(mark), timeout=30, message="no unready mark")
        assert found is not None
        why = json.loads(zk_client.get(mark)[0])["why"]
        assert "did not load" in why, why
        # `zkbeat status` says so, by name, and --json gives each replica's mark.
        # (It is in the line of the shard it did not lead all along; polled all the same.)
        wait_for(
            lambda: "not ready to lead: broken (pid " in (shown := zkbeat(good, "status").stdout) and why in shown,
            timeout=30,
            message=lambda: zkbeat(good, "status").stdout,
        )
        replicas = json.loads(zkbeat(good, "status", "--json").stdout)["candidates"]
        assert {c["identity"]: c["unready"] for c in replicas} == {"good": None, "broken": why}, replicas
        # Back in both lines (after LOAD_RECHECK), behind good.
        wait_for(
            lambda: all(line[-1:] == (broken._replica,) for line in lines_of(zk_client, zk_root, 2).values()),
            timeout=30,
            message=lambda: repr(lines_of(zk_client, zk_root, 2)),
        )

        fresh = make_scheduler(entries, identity="fresh", **settings)
        stack.enter_context(Loop(fresh))
        # Each line ends with broken: it stepped back behind fresh where it was next.
        wait_for(
            lambda: all(
                len(line) == 3 and line[-1] == broken._replica for line in lines_of(zk_client, zk_root, 2).values()
            ),
            timeout=60,
            message=lambda: repr(lines_of(zk_client, zk_root, 2)),
        )
        good_loop.__exit__(None, None, None)  # good stops (closed): its shards go to the next in line
        wait_for(
            lambda: all(s.election.leadership is not None for s in fresh._shards),
            timeout=30,
            message="fresh never led both shards",
        )
        # fresh leads both, above its share of 1 with two replicas in line: a settled picture in which the
        # fair share would hand broken one at once, had it not said it cannot lead.
        since = len(published.headers)
        wait_for(
            lambda: all(published.entries()[since:].count(name) >= 6 for name in entries),
            timeout=60,
            message="fresh did not publish every entry",
        )
        assert len(terms) == handed, f"broken was handed a shard again: terms begun {terms}"
        assert all(s.election.leadership is not None for s in fresh._shards)

        # It can read its schedule again: the mark goes, and the fair share hands it its share.
        can_read["now"] = True
        wait_for(lambda: zk_client.exists(mark) is None, timeout=30, message="the unready mark stayed")
        wait_for(
            lambda: sum(s.election.leadership is not None for s in broken._shards) == 1,
            timeout=60,
            message="broken never got its share once it could read its schedule",
        )


def test_a_replica_that_loads_its_schedule_as_leader_unmarks_itself(
    make_scheduler, zk_client: KazooClient, zk_root: str, quick: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A replica marked unready whose probe never says yes (a host without a cheap probe) still unmarks itself
    once its schedule loads as leader: it leads what the lines give it, then is ready again."""
    monkeypatch.setattr(sharded_module, "READY_PROBE", 3600.0)  # the probe never comes
    entries = {name: every(1, n) for n, name in enumerate(names_in_every_shard(zk_root, 2, per_shard=2))}
    settings = {"zkbeat_shards": 2, "zkbeat_stall_timeout": 5.5, "beat_max_loop_interval": 0.2}
    alone = make_scheduler(entries, identity="alone", **settings)
    can_read = {"now": False}
    alone.schedule_loaded = lambda: can_read["now"]
    mark = f"{unready_path(zk_root)}/{alone._replica}"
    with Loop(alone):
        wait_for(lambda: zk_client.exists(mark), timeout=60, message="no unready mark")
        can_read["now"] = True
        # Alone in both lines: it leads both again after LOAD_RECHECK, loads, and says it is ready.
        wait_for(lambda: zk_client.exists(mark) is None, timeout=60, message="the unready mark stayed")
        wait_for(lambda: all(s.term is not None for s in alone._shards), timeout=30)


def test_a_mark_lost_with_the_session_is_written_again(
    make_scheduler, zk_client: KazooClient, zk_root: str, quick: None
) -> None:
    """The mark is ephemeral: deleted under the replica (as a new session would find it gone), it is back at
    the next passes while the replica still cannot lead."""
    settings = {"zkbeat_shards": 2, "beat_max_loop_interval": 0.2}
    replica = make_scheduler({"a": every(1)}, identity="r", **settings)
    replica.schedule_readable = lambda: False  # the probe says no: the mark should stay
    lead_every_shard(replica)
    with Loop(replica):
        mark = f"{unready_path(zk_root)}/{replica._replica}"

        def marked() -> bool:
            # Asked again until it shows: a term's first pass, whose schedule loads, unmarks the replica.
            replica._fair_share.mark_unready("test: cannot lead")
            return zk_client.exists(mark) is not None

        # Once both terms have seen their schedule loaded, nothing unmarks it.
        wait_for(lambda: all(s.term is not None and s._unloaded_since is None for s in replica._shards), timeout=30)
        wait_for(marked, timeout=30, message="no unready mark")
        zk_client.delete(mark)
        wait_for(lambda: zk_client.exists(mark), timeout=30, message="the mark was not written again")


def test_strangers_in_the_unready_listing_mark_nobody(
    make_scheduler, zk_client: KazooClient, zk_root: str, quick: None
) -> None:
    """Children of ``<root>/v1/unready`` not named like a replica id, or naming no replica in line, change
    nothing: a replica leading both shards hands one to a second that joins."""
    zk_client.ensure_path(f"{unready_path(zk_root)}/not-a-replica")
    zk_client.ensure_path(f"{unready_path(zk_root)}/{'0' * 32}")
    settings: dict[str, Any] = {"zkbeat_shards": 2, "beat_max_loop_interval": 0.2}
    entries = {"a": every(1), "b": every(1)}
    first = make_scheduler(entries, identity="first", **settings)
    lead_every_shard(first)
    second = make_scheduler(entries, identity="second", **settings)
    with Loop(first), Loop(second):
        wait_for(
            lambda: sum(s.election.leadership is not None for s in second._shards) == 1,
            timeout=60,
            message="the joined replica never got its share",
        )


def test_a_replica_marked_unready_without_zookeeper_never_loops_without_waiting(
    make_scheduler, quick: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Marked unready while ZooKeeper does not answer (its hosts name a port nobody listens on): each pass still
    waits (for its next probe of the schedule, or beat_max_loop_interval), never 0 s in a loop."""
    monkeypatch.setattr(sharded_module, "READY_PROBE", 3600.0)
    replica = make_scheduler({"a": every(1)}, hosts=f"127.0.0.1:{free_port()}", zkbeat_shards=2)
    replica.wait_in_tick = False
    replica.tick()
    replica._fair_share.mark_unready("test: cannot lead")
    waits = [replica.tick() for _ in range(5)]
    assert all(wait >= 0.1 for wait in waits), waits


def test_an_unready_listing_zkbeat_may_not_read_or_write_stops_nothing(
    make_scheduler, zk_client: KazooClient, zk_root: str, published: Published, quick: None, caplog
) -> None:
    """``<root>/v1/unready`` made by someone else, under an ACL that denies zkbeat everything: a replica that
    must mark itself says once, by name, that it cannot, and the schedule goes on."""
    zk_client.ensure_path(f"{zk_root}/v1")
    zk_client.create(unready_path(zk_root), acl=[make_digest_acl("someone", "else", all=True)])
    entries = {name: every(0.5, n) for n, name in enumerate(names_in_every_shard(zk_root, 2, per_shard=2))}
    replica = make_scheduler(entries, zkbeat_shards=2)
    lead_every_shard(replica)
    with caplog.at_level(logging.ERROR, logger="zkbeat"), Loop(replica):
        wait_for(lambda: all(published.count(name) >= 1 for name in entries), timeout=60)
        replica._fair_share.mark_unready("test: cannot lead")
        since = len(published.headers)
        wait_for(lambda: all(published.entries()[since:].count(name) >= 3 for name in entries), timeout=60)
        said = [r.getMessage() for r in caplog.records if "may not be" in r.getMessage()]
    assert any("may not be written" in line and unready_path(zk_root) in line for line in said), said
    assert any("may not be listed" in line for line in said), said
    assert len(said) == 2, said  # each once, however many passes


def test_the_dashboard_shows_a_replica_that_cannot_lead_and_why_until_it_can(
    make_scheduler, zk_server, redis_server, zk_root: str, tmp_path, quick: None
) -> None:
    """The dashboard (its JSON and the page in chromium) marks the replica that said it cannot lead, with its
    reason, in the replicas table, and drops the mark once the replica can lead, without a reload."""
    settings = {"zkbeat_shards": 2, "beat_max_loop_interval": 0.2}
    replica = make_scheduler({"a": every(1)}, identity="the-replica", **settings)
    replica.schedule_readable = lambda: False
    lead_every_shard(replica)
    env = {
        "ZKBEAT_HOSTS": zk_server.hosts,
        "ZKBEAT_TEST_BROKER": redis_server.url,
        "ZKBEAT_TEST_ROOT": zk_root,
        "ZKBEAT_TEST_CONF": json.dumps({"zkbeat_shards": 2}),
    }
    with Loop(replica):
        # Both terms saw their schedule load (which unmarks a replica) before the test marks it.
        wait_for(lambda: all(s.term is not None and s._unloaded_since is None for s in replica._shards), timeout=30)
        dashboard = Dashboard(env, tmp_path)
        try:
            dashboard.wait_ready()
            with browser_page() as page:
                page.goto(dashboard.url)
                wait_for(lambda: page.query_selector("#candidates tbody tr"), timeout=30)
                assert page.query_selector("#candidates tbody tr.unready") is None

                replica._fair_share.mark_unready("its schedule did not load in 30s as leader")
                wait_for(
                    lambda: page.query_selector("#candidates tbody tr.unready"),
                    timeout=30,
                    message=lambda: page.inner_text("#candidates"),
                )
                text = page.inner_text("#candidates tbody tr.unready")
                assert "the-replica" in text and "not ready to lead: its schedule did not load" in text, text
                (candidate,) = dashboard.state()["shards"][0]["candidates"]
                assert candidate["unready"] == "its schedule did not load in 30s as leader", candidate

                replica._fair_share.mark_ready()
                wait_for(
                    lambda: page.query_selector("#candidates tbody tr.unready") is None,
                    timeout=30,
                    message=lambda: page.inner_text("#candidates"),
                )
                assert dashboard.state()["shards"][0]["candidates"][0]["unready"] is None
        finally:
            dashboard.stop()


class _ListingFailsOnce:
    """A real client whose next listing of ``path`` fails as a broken connection would (ConnectionLoss)."""

    def __init__(self, client: KazooClient, path: str) -> None:
        self._client = client
        self._path = path
        self.failed = False

    def get_children(self, path: str, *args: Any, **kwargs: Any) -> Any:
        if path == self._path and not self.failed:
            self.failed = True
            raise ConnectionLoss()
        return self._client.get_children(path, *args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)


def test_a_listing_read_cut_by_the_connection_is_read_again_at_the_next_pass(
    make_scheduler, zk_client: KazooClient, zk_root: str
) -> None:
    """A replica marks itself; the re-read its watch calls for loses the connection while listing the marks
    (after the lines were read). The next pass must read again and see the mark: else the lines and marks
    read before stay this replica's picture until some line changes (in a cluster standing still, never), and
    it hands shards to a replica that cannot lead, or none to one that can again."""
    leader = make_scheduler({"a": every(1)}, identity="leader", zkbeat_shards=2)
    lead_every_shard(leader)
    paths = [election_path(zk_root, k, 2) for k in range(2)]
    share = FairShare(zk_client, paths, "f" * 32, unready=unready_path(zk_root))
    assert share.lines() == {0: (leader._replica,), 1: (leader._replica,)}
    assert share.unready() == frozenset()
    changes = share.changes
    other = leader._replica  # its mark, as it would write it
    zk_client.create(f"{unready_path(zk_root)}/{other}", b"{}", ephemeral=True, makepath=True)
    wait_for(lambda: share.changes > changes, timeout=30, message="the listing's watch never fired")
    cut = _ListingFailsOnce(zk_client, unready_path(zk_root))
    share._client = cut
    with pytest.raises(ConnectionLoss):
        share.lines()
    assert cut.failed
    share.lines()
    assert share.unready() == frozenset({other})


def test_an_older_replica_that_steps_back_for_one_marked_unready_is_not_passed_again_and_again(
    make_scheduler, zk_root: str, quick: None
) -> None:
    """Mixed releases: ``old`` ignores the listing (as a release before the mark does), so, at its share and
    next in line of ``a``'s shard, it steps back for ``unready``, which leads none. ``unready`` stepping back
    again for it would make the two swap places for as long as it cannot lead (each swap a write to that
    election and a wake of every replica, every few seconds). Once ``old`` gave way to it, it keeps the place."""
    entries = {name: every(1, n) for n, name in enumerate(names_in_every_shard(zk_root, 2, per_shard=1))}
    settings = {"zkbeat_shards": 2, "beat_max_loop_interval": 0.2}
    a = make_scheduler(entries, identity="a", **settings)
    lead_every_shard(a)
    old = make_scheduler(entries, identity="old", **settings)
    old._fair_share._unready_path = None  # reads no listing, writes no mark: an older release

    def moves_of(scheduler: Any) -> tuple[list[Move], list[int]]:
        share = scheduler._fair_share
        made: list[Move] = []
        settled: list[int] = []  # passes asked with the lines standing still (a move could be made)
        decide = share.decide

        def counted() -> Move | None:
            now = share._clock()
            if now - share._since >= shards_module.SETTLE_TIME and now - share._moved_at >= shards_module.SETTLE_TIME:
                settled.append(1)
            move = decide()
            if move is not None:
                made.append(move)
            return move

        share.decide = counted
        return made, settled

    with Loop(a), Loop(old):
        wait_for(
            lambda: sum(s.election.leadership is not None for s in old._shards) == 1,
            timeout=60,
            message="old never got its share",
        )
        # Joins now, behind both: never handed a shard (each leads its share), never leading.
        unready = make_scheduler(entries, identity="unready", **settings)
        unready.schedule_loaded = lambda: False
        unready.schedule_readable = lambda: False
        unready._fair_share.mark_unready("test: cannot lead")
        old_moves, _ = moves_of(old)
        unready_moves, unready_settled = moves_of(unready)
        with Loop(unready):
            wait_for(
                lambda: len(old_moves) >= 4 or len(unready_settled) >= 40,
                timeout=120,
                message=lambda: f"old moved {old_moves}, unready moved {unready_moves}",
            )
    # A swap again and again would keep moving ``old``. ``unready`` steps back at most once in each shard's line:
    # the one ``old`` gave way in, and the other if ``a`` saw it in a line before its mark was written (it marks
    # itself after joining, as a replica whose load failed does), and gave way to it there.
    assert len(old_moves) <= 2 and len(unready_moves) <= 2, (old_moves, unready_moves)
    assert len({move.shard for move in unready_moves}) == len(unready_moves), (
        f"stepped back twice in a line: {unready_moves}"
    )


def test_a_stranger_s_ephemeral_listing_that_takes_no_marks_stops_no_step_back(
    make_scheduler, zk_client: KazooClient, zk_root: str, quick: None, caplog
) -> None:
    """``<root>/v1/unready`` made ephemeral by someone else: no child can be made under it, so a replica that
    must mark itself cannot. It says so once, by name, and still steps back where it is next in a line with
    one that can lead behind it (before, the failed mark dropped every move the fair share made it, said at
    DEBUG only). ``leader`` leads both shards and never ticks (it never moves)."""
    zk_client.ensure_path(f"{zk_root}/v1")
    zk_client.create(unready_path(zk_root), ephemeral=True)
    settings: dict[str, Any] = {"zkbeat_shards": 2, "beat_max_loop_interval": 0.2}
    entries = {"a": every(1)}
    leader = make_scheduler(entries, identity="leader", **settings)
    lead_every_shard(leader)
    unready = make_scheduler(entries, identity="unready", **settings)
    unready.schedule_loaded = lambda: False
    unready.schedule_readable = lambda: False
    unready._fair_share.mark_unready("test: cannot lead")
    wait_for(lambda: all(len(line) == 2 for line in lines_of(zk_client, zk_root, 2).values()), timeout=30)
    ready = make_scheduler(entries, identity="ready", **settings)
    with caplog.at_level(logging.ERROR, logger="zkbeat"), Loop(unready), Loop(ready):
        wait_for(
            lambda: all(
                len(line) == 3 and line[-1] == unready._replica for line in lines_of(zk_client, zk_root, 2).values()
            ),
            timeout=60,
            message=lambda: repr(lines_of(zk_client, zk_root, 2)),
        )
        wait_for(lambda: any(unready_path(zk_root) in r.getMessage() for r in caplog.records), timeout=30)
    said = [r.getMessage() for r in caplog.records if unready_path(zk_root) in r.getMessage()]
    assert len(said) == 1, said


def test_the_mark_is_ephemeral_json_and_goes_when_its_replica_stops(
    make_scheduler, zk_client: KazooClient, zk_root: str, quick: None
) -> None:
    """What docs/how-it-works.md says of ``<root>/v1/unready/<replica id>``: ephemeral, JSON {why, since,
    identity, host, pid}; and
    docs/sharding.md: a replica that stops leaves none behind. ``leader`` leads both shards (never ticking),
    so the marked replica leads nothing that could unmark it."""
    settings: dict[str, Any] = {"zkbeat_shards": 2, "beat_max_loop_interval": 0.2}
    leader = make_scheduler({"a": every(1)}, identity="leader", **settings)
    lead_every_shard(leader)
    replica = make_scheduler({"a": every(1)}, identity="r", **settings)
    replica.schedule_readable = lambda: False
    replica._fair_share.mark_unready("test: cannot lead")
    mark = f"{unready_path(zk_root)}/{replica._replica}"
    with Loop(replica):
        wait_for(lambda: zk_client.exists(mark), timeout=30, message="no unready mark")
        raw, stat = zk_client.get(mark)
        assert stat.ephemeralOwner == replica.zk_client.client_id[0]
        data = json.loads(raw)
        assert data["why"] == "test: cannot lead"
        assert isinstance(data["since"], float) and abs(data["since"] - time.time()) < 3600, data
        assert (data["identity"], data["host"], data["pid"]) == ("r", socket.gethostname(), os.getpid()), data
    wait_for(lambda: zk_client.exists(mark) is None, timeout=30, message="the mark outlived its replica")


def test_a_stranger_s_child_in_the_unready_listing_holds_up_no_move(
    make_scheduler, zk_client: KazooClient, zk_root: str
) -> None:
    """A child named like a replica id but naming no replica in line (a stranger's, a tool's copy of an old
    mark) is no change of the picture: it does not start the fair share's SETTLE_TIME again. Else someone who
    makes and deletes such children more often than that holds every replica's moves up for as long as they
    do. The clock here is the test's: the lines stood still long ago, and a move is due (``first`` leads both
    shards, ``second`` none)."""
    settings: dict[str, Any] = {"zkbeat_shards": 2}
    first = make_scheduler({"a": every(1)}, identity="first", **settings)
    lead_every_shard(first)
    second = make_scheduler({"a": every(1)}, identity="second", **settings)
    paths = [election_path(zk_root, k, 2) for k in range(2)]
    wait_for(lambda: all(len(line) == 2 for line in lines_of(zk_client, zk_root, 2).values()), timeout=30)
    now = [0.0]
    share = FairShare(zk_client, paths, first._replica, unready=unready_path(zk_root), clock=lambda: now[0])
    assert share.lines() == {k: (first._replica, second._replica) for k in range(2)}
    now[0] = 100.0
    changes = share.changes
    zk_client.create(f"{unready_path(zk_root)}/{'0' * 32}", makepath=True)
    wait_for(lambda: share.changes > changes, timeout=30, message="the listing's watch never fired")
    assert share.decide() == Move(1, True, "fair share: leads 2 of 2 shards, 2 replicas")


def test_a_probe_that_hangs_is_a_hung_leader_to_the_watchdog(
    make_scheduler, zk_root: str, published: Published, quick: None
) -> None:
    """``a`` still leads a shard whose rows loaded, and is marked unready (another shard's did not): its probe
    of the schedule hangs (a query to a database that does not answer). Its loop publishes nothing meanwhile,
    so the watchdog must step it down after zkbeat_stall_timeout, as for a query hung in a leader pass, and
    ``b`` lead every shard; before, the probe ran outside any leader pass, and ``a`` kept its shard, silent."""
    entries = {name: every(0.5, n) for n, name in enumerate(names_in_every_shard(zk_root, 2, per_shard=1))}
    settings = {"zkbeat_shards": 2, "zkbeat_stall_timeout": 5.5, "beat_max_loop_interval": 0.2}
    a = make_scheduler(entries, identity="a", **settings)
    lead_every_shard(a)
    b = make_scheduler(entries, identity="b", **settings)
    release = threading.Event()
    a.schedule_readable = lambda: release.wait(120) and False
    with contextlib.ExitStack() as stack:
        stack.enter_context(Loop(a))
        stack.enter_context(Loop(b))
        stack.callback(release.set)  # first out: a's loop ends at once
        wait_for(
            lambda: sum(s.election.leadership is not None for s in b._shards) == 1,
            timeout=60,
            message="b never got its share",
        )
        a._fair_share.mark_unready("test: cannot lead")
        wait_for(
            lambda: all(s.election.leadership is not None for s in b._shards),
            timeout=60,
            message="a kept its shard while its probe hung",
        )


# -- a replica marked unready that takes a shard all the same ----------------------


def test_a_marked_replica_steps_aside_only_for_a_ready_one_behind_it_in_that_line() -> None:
    """``ready_successor``: the first replica behind this one that can lead, never one marked or excluded, never
    nobody; and only while this replica's own mark is listed (else the listing tells nothing of the others)."""
    assert shards_module.ready_successor(("U", "V", "A"), "U", {"U", "V"}, listed=True) == "A"
    assert shards_module.ready_successor(("U", "A"), "U", {"U"}, listed=True) == "A"
    assert shards_module.ready_successor(("U", "V"), "U", {"U", "V"}, listed=True) is None
    assert shards_module.ready_successor(("U",), "U", {"U"}, listed=True) is None
    assert shards_module.ready_successor(("A", "U"), "U", {"U"}, listed=True) is None  # nobody behind it
    assert shards_module.ready_successor(("U", "A"), "U", {"U"}, listed=False) is None
    assert shards_module.ready_successor(("V", "A"), "U", {"U"}, listed=True) is None  # not in that line


def _marked(scheduler: Any, attempts: list[int]) -> None:
    """``scheduler`` cannot read its schedule (each load attempt recorded by shard), and says so before it runs."""

    def loaded() -> bool:
        attempts.append(scheduler._shard.index)
        return False

    scheduler.schedule_loaded = loaded
    scheduler.schedule_readable = lambda: False
    scheduler._fair_share.mark_unready("test: cannot lead")


def _marked_behind_a_leader(
    make_scheduler, zk_client: KazooClient, zk_root: str, identity: str, *, seconds: float = 1, per_shard: int = 1
) -> tuple[dict, dict, Any, Any, list[int]]:
    """Two shards led by ``leader``; ``identity`` said it cannot lead (:func:`_marked`) and stands behind it in both
    lines. Returns the entries, the settings, the two schedulers and the shards ``identity`` tried to load."""
    names = names_in_every_shard(zk_root, 2, per_shard=per_shard)
    entries = {name: every(seconds, n) for n, name in enumerate(names)}
    settings = {"zkbeat_shards": 2, "zkbeat_stall_timeout": 3600, "beat_max_loop_interval": 0.2}
    leader = make_scheduler(entries, identity="leader", **settings)
    lead_every_shard(leader)
    marked = make_scheduler(entries, identity=identity, **settings)
    attempts: list[int] = []
    _marked(marked, attempts)
    wait_for(lambda: all(len(line) == 2 for line in lines_of(zk_client, zk_root, 2).values()), timeout=30)
    return entries, settings, leader, marked, attempts


def test_a_replica_marked_unready_that_takes_a_shard_steps_aside_at_once_for_a_ready_one_behind_it(
    make_scheduler, zk_client: KazooClient, zk_root: str, published: Published, quick: None, caplog
) -> None:
    """``marked`` said it cannot lead, and heads both lines with ``ready`` behind it when their leader stops (it
    would have stepped back in the seconds after: here its fair share makes no move). It tries to load its
    schedule once in each shard, then steps aside at once: ``ready`` leads both shards, although
    zkbeat_stall_timeout is an hour (before, each shard stayed unpublished for that long). Said once a shard,
    counted in zkbeat_schedule_load_step_downs_total."""
    entries, settings, leader, marked, attempts = _marked_behind_a_leader(
        make_scheduler, zk_client, zk_root, "marked", seconds=0.5, per_shard=2
    )
    marked._fair_share.decide = lambda: None  # the moment before it steps back: no move of its fair share
    step_downs: list[int] = []
    original = marked.metrics.schedule_load_step_down
    marked.metrics.schedule_load_step_down = lambda: (step_downs.append(1), original())
    terms = count_terms(marked)
    ready = make_scheduler(entries, identity="ready", **settings)
    wait_for(lambda: all(len(line) == 3 for line in lines_of(zk_client, zk_root, 2).values()), timeout=30)
    mark = f"{unready_path(zk_root)}/{marked._replica}"
    with caplog.at_level(logging.INFO, logger="zkbeat"), Loop(marked), Loop(ready):
        wait_for(lambda: zk_client.exists(mark), timeout=30, message="no unready mark")
        leader.close()  # its shards go to the head of each line: marked
        wait_for(
            lambda: all(s.election.leadership is not None for s in ready._shards),
            timeout=60,
            message=lambda: f"ready leads {[s.election.leadership is not None for s in ready._shards]}",
        )
        since = len(published.headers)
        wait_for(lambda: all(published.entries()[since:].count(name) >= 2 for name in entries), timeout=60)
    assert {shard for shard, _ in terms} == {0, 1}, terms  # it took both shards
    assert {0, 1} <= set(attempts), attempts  # and tried to load each once first
    assert len(step_downs) == 2, step_downs
    said = [r.getMessage() for r in caplog.records if "stepping aside at once" in r.getMessage()]
    assert len(said) == 2 and all("marked" in line for line in said), said


def test_replicas_marked_unready_keep_a_shard_none_behind_them_can_lead(
    make_scheduler, zk_client: KazooClient, zk_root: str, quick: None
) -> None:
    """``first`` and ``second`` both said they cannot lead; ``first`` heads both lines when their leader stops,
    ``second`` behind it. Neither can do better: ``first`` keeps trying both shards (no step aside in favour
    of a replica that cannot lead either, so the two never hand the shards back and forth)."""
    entries, settings, leader, first, first_attempts = _marked_behind_a_leader(
        make_scheduler, zk_client, zk_root, "first"
    )
    second = make_scheduler(entries, identity="second", **settings)
    _marked(second, [])
    wait_for(lambda: all(len(line) == 3 for line in lines_of(zk_client, zk_root, 2).values()), timeout=30)
    first_terms, second_terms = count_terms(first), count_terms(second)
    marks = [f"{unready_path(zk_root)}/{r._replica}" for r in (first, second)]
    with Loop(first), Loop(second):
        wait_for(lambda: all(zk_client.exists(mark) for mark in marks), timeout=30, message="no unready marks")
        wait_for(lambda: len(first._fair_share.unready()) == 2, timeout=30)
        leader.close()
        wait_for(lambda: all(s.term is not None for s in first._shards), timeout=60, message="first took no shard")
        # Many passes of first's retries, each one a chance to step aside.
        wait_for(lambda: min(first_attempts.count(0), first_attempts.count(1)) >= 8, timeout=60)
        assert all(s.election.leadership is not None for s in first._shards)
    # One candidate of ``first`` per shard: a step aside would show as a second epoch of a shard (it rejoins at
    # the back under a new candidate) and as a term of ``second``. The same (shard, epoch) twice is no handover:
    # Loop closes ``first`` from this thread, and a pass of its loop's thread under way may find the term close()
    # just ended and begin it again under the same candidate before close() stops the client (about 1 run in
    # 13 with two busy loops on the machine; celery beat closes on its loop's own thread, once tick() returned),
    # so the pairs are counted once each.
    assert sorted(shard for shard, _ in set(first_terms)) == [0, 1], first_terms
    assert second_terms == [], second_terms


def test_status_and_the_dashboard_list_a_replica_marked_unready_that_is_in_no_line(
    make_scheduler,
    zk_server,
    redis_server,
    tmp_path,
    zk_client: KazooClient,
    zk_root: str,
    quick: None,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``broken`` leads both shards and its schedule never loads: it steps aside from both and stays out of every
    line (LOAD_RECHECK, an hour here). `zkbeat status` (text and --json) and the dashboard's model still list
    its mark, with its reason and since when (before, only marks of replicas in a line showed: it was in no
    table), and so does the page's replicas table. A stranger's child in the listing is shown nowhere."""
    monkeypatch.setattr(leadership_module, "LOAD_RECHECK", 3600.0)
    settings = {"zkbeat_shards": 2, "zkbeat_stall_timeout": 5.5, "beat_max_loop_interval": 0.2}
    broken = make_scheduler({"a": every(1)}, identity="broken", **settings)
    broken.schedule_loaded = lambda: False
    broken.schedule_readable = lambda: False
    lead_every_shard(broken)
    zk_client.create(f"{unready_path(zk_root)}/not-a-replica", b'{"why": "a stranger"}', makepath=True)
    mark = f"{unready_path(zk_root)}/{broken._replica}"

    def out_of_every_line() -> bool:
        lines = lines_of(zk_client, zk_root, 2)
        return zk_client.exists(mark) is not None and not any(broken._replica in line for line in lines.values())

    with contextlib.ExitStack() as stack:
        stack.enter_context(Loop(broken))
        wait_for(out_of_every_line, timeout=60, message=lambda: repr(lines_of(zk_client, zk_root, 2)))
        why = json.loads(zk_client.get(mark)[0])["why"]
        good = make_scheduler({"a": every(1)}, identity="good", **settings)
        lead_every_shard(good)
        stack.enter_context(Loop(good))  # it announces itself: the dashboard's page waits for a leader

        shown = zkbeat(good, "status").stdout
        said = [line for line in shown.splitlines() if line.startswith("not ready to lead")]
        assert len(said) == 1, shown
        assert said[0].startswith(f"not ready to lead: broken (pid {os.getpid()}, in no line): {why}, since "), said
        assert "a stranger" not in shown, shown
        found = json.loads(zkbeat(good, "status", "--json").stdout)
        assert [c["identity"] for c in found["candidates"]] == ["good"], found["candidates"]
        (listed,) = found["unready"]
        assert listed["replica"] == broken._replica and listed["identity"] == "broken", listed
        assert listed["why"] == why and listed["in_line"] is False and listed["since"], listed

        client = KazooClient(zk_server.hosts)
        client.start(timeout=15)
        model = ClusterModel(
            client, read_settings({"zkbeat_hosts": zk_server.hosts, "zkbeat_root": zk_root, **settings}, None)
        )
        model.start()
        try:
            wait_for(lambda: model.snapshot().get("unready"), timeout=30, message=lambda: repr(model.snapshot()))
            (shown_mark,) = model.snapshot()["unready"]
            assert {k: shown_mark[k] for k in ("replica", "identity", "why", "in_line")} == {
                "replica": broken._replica,
                "identity": "broken",
                "why": why,
                "in_line": False,
            }, shown_mark
            assert shown_mark["since"], shown_mark
        finally:
            model.stop()
            client.stop()
            client.close()

        # The page's replicas table (chromium) has a row for it.
        env = {
            "ZKBEAT_HOSTS": zk_server.hosts,
            "ZKBEAT_TEST_BROKER": redis_server.url,
            "ZKBEAT_TEST_ROOT": zk_root,
            "ZKBEAT_TEST_CONF": json.dumps({"zkbeat_shards": 2}),
        }
        dashboard = Dashboard(env, tmp_path)
        try:
            dashboard.wait_ready()
            with browser_page() as page:
                page.goto(dashboard.url)
                row = "#candidates tbody tr.unready.out-of-line"
                wait_for(lambda: page.query_selector(row), timeout=30, message=lambda: page.inner_text("#candidates"))
                text = page.inner_text(row)
                assert "broken" in text and f"not ready to lead: {why}; in no line; since" in text, text
                assert "a stranger" not in page.inner_text("#candidates")
        finally:
            dashboard.stop()


def test_a_replica_marked_unready_with_nobody_behind_it_keeps_trying(
    make_scheduler, zk_client: KazooClient, zk_root: str, quick: None
) -> None:
    """docs/sharding.md: with none behind it that can lead, "none steps aside for nobody". ``marked`` said it
    cannot lead and is alone behind ``leader`` in both lines; ``leader`` stops: ``marked`` leads both shards
    and keeps trying its schedule (zkbeat_stall_timeout is an hour), never out of a line in favour of nobody."""
    _, _, leader, marked, attempts = _marked_behind_a_leader(make_scheduler, zk_client, zk_root, "marked")
    step_downs: list[int] = []
    marked.metrics.schedule_load_step_down = lambda: step_downs.append(1)
    mark = f"{unready_path(zk_root)}/{marked._replica}"
    with Loop(marked):
        wait_for(lambda: zk_client.exists(mark), timeout=30, message="no unready mark")
        wait_for(lambda: marked._replica in marked._fair_share.unready(), timeout=30)
        leader.close()
        wait_for(lambda: all(s.term is not None for s in marked._shards), timeout=60, message="marked took no shard")
        wait_for(lambda: min(attempts.count(0), attempts.count(1)) >= 8, timeout=60)
        assert all(s.election.leadership is not None for s in marked._shards)
    assert step_downs == [], step_downs


def test_a_replica_whose_mark_is_refused_never_steps_aside_at_once(
    make_scheduler, zk_client: KazooClient, zk_root: str, quick: None
) -> None:
    """docs/sharding.md: a replica whose mark ZooKeeper refuses "never steps aside at once (it cannot tell then
    which replicas are marked)". ``<root>/v1/unready`` is someone else's, under an ACL that denies zkbeat
    everything; ``marked`` said it cannot lead and heads both lines with ``ready`` behind it when ``leader``
    stops: it keeps trying its schedule in both shards (zkbeat_stall_timeout is an hour), ``ready`` leads none."""
    zk_client.ensure_path(f"{zk_root}/v1")
    zk_client.create(unready_path(zk_root), acl=[make_digest_acl("someone", "else", all=True)])
    entries, settings, leader, marked, attempts = _marked_behind_a_leader(make_scheduler, zk_client, zk_root, "marked")
    marked._fair_share.decide = lambda: None  # the moment before it steps back: no move of its fair share
    step_downs: list[int] = []
    marked.metrics.schedule_load_step_down = lambda: step_downs.append(1)
    ready = make_scheduler(entries, identity="ready", **settings)
    wait_for(lambda: all(len(line) == 3 for line in lines_of(zk_client, zk_root, 2).values()), timeout=30)
    with Loop(marked), Loop(ready):
        leader.close()
        wait_for(lambda: all(s.term is not None for s in marked._shards), timeout=60, message="marked took no shard")
        wait_for(lambda: min(attempts.count(0), attempts.count(1)) >= 8, timeout=60)
        assert all(s.election.leadership is not None for s in marked._shards)
        assert not any(s.election.leadership is not None for s in ready._shards)
    assert step_downs == [], step_downs

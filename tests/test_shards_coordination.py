"""Sharded coordination under hostile conditions: the fair share beside the broker handover, strangers' znodes.

In-process sharded schedulers on the real ZooKeeper and Redis of tests/support,
driven by their own loops in threads; the assertions are outcomes (who led
what, how often), never timings.
"""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator

import pytest
from kazoo.client import KazooClient

import zkbeat.coordination.shards as shards_module
from tests.support.helpers import every, names_in_every_shard, wait_for
from tests.support.proxy import TcpProxy
from tests.support.servers import RedisServer, ZooKeeperServer, expire_session_quietly
from tests.test_shards import lead_every_shard
from tests.test_shards_review import Loop, count_terms
from zkbeat.coordination.liveness import Announcement
from zkbeat.coordination.shards import BROKER, REPLICA_KEY, SCHEDULE, FairShare, election_path


def decisions_once(fair_share: FairShare, started) -> list:
    """``fair_share``'s answers to decide() from the moment ``started()`` is true: the moves the tests read."""
    decisions: list = []
    decide = fair_share.decide

    def counting_decide():
        move = decide()
        if started():
            decisions.append(move)
        return move

    fair_share.decide = counting_decide
    return decisions


@pytest.fixture
def route(redis_server: RedisServer) -> Iterator[TcpProxy]:
    """One replica's own route to the broker, which refuses every connection until healed."""
    made = TcpProxy(redis_server.port).start()
    made.reset()
    yield made
    made.close()


def test_a_replica_that_handed_a_shard_over_for_the_broker_is_not_handed_one_again_while_cut_off(
    make_scheduler, monkeypatch, zk_root: str, route: TcpProxy
) -> None:
    """Two replicas, two shards; one cannot reach the broker (its route is gone), the other can. The fair share
    hands the cut-off replica a shard; it cannot publish there, so after zkbeat_broker_handover_timeout it hands
    the shard to the replica that reaches the broker. From then on the healthy replica leads both shards, above
    its share, with the cut-off one next in line: handing it a shard again would leave that shard unpublished
    for another handover timeout, again and again (a ping-pong that stops the schedule half the time). Once its
    route to the broker is back, it gets its share again."""
    monkeypatch.setattr(shards_module, "SETTLE_TIME", 0.2)  # the fair share acts soon on what it sees
    entries = {name: every(1, n) for n, name in enumerate(names_in_every_shard(zk_root, 2, per_shard=2))}
    settings = {"zkbeat_shards": 2, "zkbeat_broker_handover_timeout": 1.0, "beat_max_loop_interval": 0.2}
    good = make_scheduler(entries, identity="good", **settings)
    lead_every_shard(good)
    cut = make_scheduler(entries, identity="cut", broker_url=f"redis://{route.hosts}/0", **settings)
    terms = count_terms(cut)
    handed: list[int] = []
    for shard in cut._shards:  # each shard's broker handover says when it gave leadership away
        handover = shard.broker_handover
        handover._on_handed_over = lambda told=handover._on_handed_over: (handed.append(len(terms)), told())

    # The healthy replica's decisions once the cut-off one handed a shard over.
    decisions = decisions_once(good._fair_share, lambda: bool(handed))
    with Loop(good), Loop(cut):
        wait_for(lambda: terms, timeout=30, message="the fair share never handed the cut-off replica a shard")
        wait_for(lambda: handed, timeout=60, message="the cut-off replica never handed its shard over")
        first = handed[0]
        wait_for(
            lambda: len(terms) > first or len([m for m in decisions if m is None]) >= 50,
            timeout=60,
            message=lambda: f"the healthy replica made no decisions after the handover: {decisions}",
        )
        assert len(terms) == first, (
            f"a shard was handed again to the replica cut off from the broker: terms begun {terms}, "
            f"broker handovers after {handed} terms, moves {[m for m in decisions if m is not None]}"
        )
        route.heal()
        wait_for(
            lambda: len(terms) > first,
            timeout=60,
            message=lambda: f"the replica whose broker is back never got its share: lines {good._fair_share._lines}",
        )


def test_each_cause_of_an_unready_mark_is_cleared_on_its_own() -> None:
    """A schedule that loads says nothing about the broker, nor a broker that answers about the schedule: the
    mark stays while either cause holds, and its reason is the first cause's."""
    fair_share = FairShare(None, ["/r/v1/shards/2/0/election", "/r/v1/shards/2/1/election"], "a" * 32)  # type: ignore[arg-type]
    fair_share.mark_unready("cannot reach the broker", BROKER)
    fair_share.mark_unready("its schedule did not load", SCHEDULE)
    fair_share.mark_ready(SCHEDULE)
    assert fair_share.unready_why == "cannot reach the broker" and fair_share.unready_for(BROKER)
    fair_share.mark_unready("its schedule did not load", SCHEDULE)
    fair_share.mark_ready(BROKER)
    assert fair_share.unready_why == "its schedule did not load" and not fair_share.unready_for(BROKER)
    fair_share.mark_ready()
    assert fair_share.unready_why is None


def test_a_replica_whose_loop_stalled_in_a_shard_it_was_handed_is_not_handed_another_when_it_turns_again(
    make_scheduler, monkeypatch, zk_root: str
) -> None:
    """Two replicas, two shards. The fair share hands the second replica a shard; its leader pass hangs (a
    query that hangs, then times out), so its watchdog steps it out of every line after zkbeat_stall_timeout,
    and the healthy replica leads both again. When the hung call returns, its loop turns and it joins every
    line again: "a replica handed a shard that it then loses (... its loop stalls) is handed no other by the
    replica that handed it that one for 5 minutes" (docs/sharding.md), or each hand-over leaves the shard
    unpublished for another stall timeout."""
    monkeypatch.setattr(shards_module, "SETTLE_TIME", 0.2)  # the fair share acts soon on what it sees
    entries = {name: every(1, n) for n, name in enumerate(names_in_every_shard(zk_root, 2, per_shard=2))}
    settings = {"zkbeat_shards": 2, "zkbeat_stall_timeout": 5.5, "beat_max_loop_interval": 0.2}
    good = make_scheduler(entries, identity="good", **settings)
    lead_every_shard(good)
    stuck = make_scheduler(entries, identity="stuck", **settings)
    terms = count_terms(stuck)
    released = threading.Event()  # the test's end: no pass of the stuck replica hangs any more

    def hang(interval: float) -> float:
        released.wait(8)  # past zkbeat_stall_timeout, then the call returns on its own
        return interval

    stuck.after_leader_pass = hang
    turned: list[int] = []  # the terms begun when its loop turned again after a stall
    resume = stuck.watchdog._resume
    stuck.watchdog._resume = lambda: (turned.append(len(terms)), resume())

    # The healthy replica's decisions once the stuck one's loop turned again.
    decisions = decisions_once(good._fair_share, lambda: bool(turned))
    try:
        with Loop(good), Loop(stuck):
            wait_for(lambda: terms, timeout=30, message="the fair share never handed the stuck replica a shard")
            wait_for(lambda: turned, timeout=60, message="the stuck replica's loop never turned again")
            first = turned[0]
            wait_for(
                lambda: len(terms) > first or len([m for m in decisions if m is None]) >= 50,
                timeout=60,
                message=lambda: f"the healthy replica made no decisions after the stall: {decisions}",
            )
            assert len(terms) == first, (
                f"a shard was handed again to the replica whose loop stalled: terms begun {terms}, its loop "
                f"turned again after {turned} terms, moves {[m for m in decisions if m is not None]}"
            )
    finally:
        released.set()


def test_a_replica_handed_a_shard_whose_session_then_ended_gets_its_share_when_it_is_back(
    make_scheduler, monkeypatch, zk_root: str, zk_server: ZooKeeperServer
) -> None:
    """Two replicas, two shards. The fair share hands the second replica a shard; then it is cut off from
    ZooKeeper past its session timeout (a partition), so its candidates go with its session and the healthy
    replica leads both shards again. When the partition heals, it joins every line under a new session: its
    loop never stalled, it can lead, and the healthy replica hands it its share again instead of holding
    the session's end against it for FAILED_TARGET_TIME (leading both shards, above ceil(N/R), meanwhile)."""
    monkeypatch.setattr(shards_module, "SETTLE_TIME", 0.2)  # the fair share acts soon on what it sees
    entries = {name: every(1, n) for n, name in enumerate(names_in_every_shard(zk_root, 2, per_shard=2))}
    settings = {"zkbeat_shards": 2, "beat_max_loop_interval": 0.2}
    good = make_scheduler(entries, identity="good", **settings)
    lead_every_shard(good)
    with TcpProxy(zk_server.port) as link:
        blip = make_scheduler(entries, identity="blip", hosts=link.hosts, **settings)
        terms = count_terms(blip)
        back = threading.Event()
        decisions = decisions_once(good._fair_share, back.is_set)  # the healthy one's, once the other is back
        with Loop(good), Loop(blip):
            wait_for(lambda: terms, timeout=30, message="the fair share never handed the second replica a shard")
            session, password = blip.zk_client.client_id
            link.reset()  # the partition: its connection to ZooKeeper is gone and cannot be made again
            expire_session_quietly(session, password, zk_server.hosts)
            wait_for(
                lambda: any(handed[2] for handed in good._fair_share._handed.values()),
                timeout=30,
                message=lambda: f"the healthy replica never saw the other one out of line: {good._fair_share._lines}",
            )
            first = len(terms)
            link.heal()
            wait_for(
                lambda: all(blip._replica in line for line in good._fair_share._lines.values()),
                timeout=30,
                message="the replica whose session ended never joined the lines again",
            )
            back.set()
            wait_for(
                lambda: len(terms) > first or len([m for m in decisions if m is None]) >= 50,
                timeout=60,
                message=lambda: f"the healthy replica made no decisions after the other one came back: {decisions}",
            )
            assert len(terms) > first, (
                f"the replica whose session ended was not handed its share again: terms begun {terms}, "
                f"moves {[m for m in decisions if m is not None]}, lines {good._fair_share._lines}"
            )


def test_a_replica_handed_a_shard_that_then_stops_is_not_held_against_a_new_one() -> None:
    """Of a replica handed a shard that leaves every line, only its return says it lost the shard (its loop
    stalled, its session ended): one that stopped never comes back, and nothing is held against anyone."""
    now = [100.0]
    fair_share = FairShare(None, ["/r/e0", "/r/e1"], "a", clock=lambda: now[0])  # type: ignore[arg-type]
    fair_share._handed = {1: ("b", 100.0, False, 7), 0: ("c", 100.0, False, 8)}
    fair_share._sessions = {"b": 7, "c": 8}  # the sessions of their candidates when they were handed the shards
    fair_share._since = 103.0  # the lines changed after the handovers, then stood still
    now[0] = 105.0
    fair_share._note_lost_handovers({0: ("a",), 1: ("a", "d")}, now[0])  # b and c in no line; d a new replica
    assert fair_share._excluded(now[0]) == set()
    fair_share._since = 107.0
    now[0] = 110.0
    fair_share._note_lost_handovers({0: ("a", "b"), 1: ("a", "d", "b")}, now[0])  # b came back; c never does
    assert fair_share._excluded(now[0]) == {"b"}
    now[0] = 100.0 + shards_module.FAILED_TARGET_TIME + 1
    fair_share._note_lost_handovers({0: ("a", "b", "c"), 1: ("a", "d", "b")}, now[0])  # c only after the time
    assert fair_share._excluded(now[0]) == {"b"}


def test_a_stopping_replica_hands_its_shards_over_before_it_waits_for_its_liveness_watches(
    make_scheduler, zk_client: KazooClient, zk_root: str
) -> None:
    """A replica leads shard 0 and, in shard 1, waits behind a candidate whose liveness socket never answers
    (its host is cut off): its watch there dials it again and again, each dial waiting up to DIAL_TIMEOUT. On
    close() the replica's terms end first; a liveness watch that is closed, and waited for, before the
    candidates are deleted holds every shard it led unpublished meanwhile (up to a dial per shard). The
    candidates go first: when the first watch is closed, shard 0's successor can already take over."""
    silent = socket.create_server(("127.0.0.1", 0))  # accepts into its backlog, never answers a token
    try:
        replica = make_scheduler({}, identity="stopping", zkbeat_shards=2)
        shard1 = election_path(zk_root, 1, 2)
        zk_client.ensure_path(shard1)
        data = {"identity": "cut-off", REPLICA_KEY: "b" * 32}
        data.update(Announcement("127.0.0.1", silent.getsockname()[1], "c" * 32, 2).as_data())
        zk_client.create(f"{shard1}/candidate-{'d' * 32}-", json.dumps(data).encode(), ephemeral=True, sequence=True)
        replica._shards[0].election.wait_for_leadership(15)
        mine = replica._shards[0].election.candidate
        wait_for(lambda: replica._shards[1].election.predecessor is not None, timeout=15)
        left_first: list[bool] = []
        for shard in replica._shards:
            close = shard.watcher.close
            shard.watcher.close = lambda close=close: (left_first.append(zk_client.exists(mine) is None), close())
        replica.close()
        assert left_first and all(left_first), (
            f"a liveness watch was closed (and waited for) while the replica still held shard 0's candidate: "
            f"{left_first}"
        )
    finally:
        silent.close()


def test_a_broker_handover_during_a_readiness_probe_keeps_its_mark(make_scheduler, zk_root: str) -> None:
    """A replica marked unready for the broker probes it from beat's loop every READY_PROBE; while that probe is
    under way (it got through), another shard's broker handover, on its own thread, hands that shard over for
    the broker (its own probe failed: the route broke again) and marks the replica again. The probe's answer
    is older than that handover's: it must not clear the mark the handover just wrote, or the replica that took
    the shard, now above its share, hands it a shard back that it cannot publish either."""
    replica = make_scheduler({}, identity="flapping", zkbeat_shards=2, zkbeat_broker_handover_timeout=1.0)
    lead_every_shard(replica)
    fair_share = replica._fair_share
    replica._handed_over_for_the_broker()  # its first handover for the broker
    assert fair_share.unready_for(BROKER)
    probe = replica._probe_broker

    def probe_while_another_shard_hands_over():
        answer = probe()  # the real broker answers: the route is back, for now
        handover = threading.Thread(target=replica._handed_over_for_the_broker)  # the route broke again
        handover.start()
        handover.join()
        return answer

    replica._probe_broker = probe_while_another_shard_hands_over
    replica._ready_probe_at = 1.0  # the next ask is due
    replica._probe_readiness(fair_share)
    assert fair_share.unready_for(BROKER), "a probe begun before a broker handover cleared the mark that handover wrote"
    replica._probe_broker = probe
    replica._ready_probe_at = 1.0
    replica._probe_readiness(fair_share)  # a probe begun after it, that gets through, clears it
    assert not fair_share.unready_for(BROKER)


def test_a_replica_that_passed_a_broker_question_on_is_not_handed_a_shard_while_cut_off(
    make_scheduler, monkeypatch, zk_root: str, redis_server: RedisServer
) -> None:
    """Three replicas, two shards; the first two cannot reach the broker. The first leads both shards; in each
    line the second is next and passes its question on (its own probe fails), and the third answers. The
    handover deletes the first's candidate and the second's (between them), and both queue again. The first
    marks itself unready for the broker; the second, which knows as much (its probe failed), must too: else
    the third, leading both shards above its share, hands it one, left unpublished for another handover
    timeout until it hands that back in turn."""
    monkeypatch.setattr(shards_module, "SETTLE_TIME", 1000.0)  # no fair-share move before the handovers
    entries = {name: every(1, n) for n, name in enumerate(names_in_every_shard(zk_root, 2, per_shard=2))}
    settings = {"zkbeat_shards": 2, "zkbeat_broker_handover_timeout": 1.0, "beat_max_loop_interval": 0.2}
    with TcpProxy(redis_server.port) as route_a, TcpProxy(redis_server.port) as route_m:
        route_a.reset()
        route_m.reset()
        first = make_scheduler(entries, identity="first", broker_url=f"redis://{route_a.hosts}/0", **settings)
        lead_every_shard(first)
        between = make_scheduler(entries, identity="between", broker_url=f"redis://{route_m.hosts}/0", **settings)
        wait_for(lambda: all(s.election.predecessor is not None for s in between._shards), timeout=15)
        good = make_scheduler(entries, identity="good", **settings)
        terms = count_terms(between)
        handed: list[int] = []
        for shard in first._shards:
            handover = shard.broker_handover
            handover._on_handed_over = lambda told=handover._on_handed_over: (handed.append(1), told())
        decisions = []  # the healthy replica's decisions once both handovers are done
        decide = good._fair_share.decide

        def counting_decide():
            move = decide()
            if len(handed) >= 2:
                decisions.append(move)
            return move

        good._fair_share.decide = counting_decide
        with Loop(first), Loop(between), Loop(good):
            wait_for(lambda: len(handed) >= 2, timeout=60, message="the first replica never handed both shards over")
            monkeypatch.setattr(shards_module, "SETTLE_TIME", 0.2)  # the fair share acts soon on what it sees
            wait_for(
                lambda: terms or len([m for m in decisions if m is None]) >= 50,
                timeout=60,
                message=lambda: f"the healthy replica made no decisions after the handovers: {decisions}",
            )
            assert not terms, (
                f"a shard was handed to the replica that passed the question on, cut off from the broker: terms "
                f"{terms}, moves {[m for m in decisions if m is not None]}, unready {good._fair_share.unready()}"
            )
            route_m.heal()  # its probe gets through: the mark goes, and the fair share hands it its share
            wait_for(lambda: terms, timeout=60, message="the replica whose route is back never got its share")

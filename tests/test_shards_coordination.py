"""Sharded coordination under hostile conditions: the fair share beside the broker handover, strangers' znodes.

In-process sharded schedulers on the real ZooKeeper and Redis of tests/support,
driven by their own loops in threads; the assertions are outcomes (who led
what, how often), never timings.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

import zkbeat.coordination.shards as shards_module
from tests.support.helpers import every, names_in_every_shard, wait_for
from tests.support.proxy import TcpProxy
from tests.support.servers import RedisServer
from tests.test_shards import lead_every_shard
from tests.test_shards_review import Loop, count_terms
from zkbeat.coordination.shards import BROKER, SCHEDULE, FairShare


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

    decisions = []  # the healthy replica's decisions once the cut-off one handed a shard over
    decide = good._fair_share.decide

    def counting_decide():
        move = decide()
        if handed:
            decisions.append(move)
        return move

    good._fair_share.decide = counting_decide
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

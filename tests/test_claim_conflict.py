"""A claim that conflicts because someone else wrote the entry's znode between the leader's plan and its
claim (in-process, real ZooKeeper and Redis; the other write is a real one, made from the test's own
client at that moment): the leader goes by what it re-reads, so the slot is published exactly once, or
not at all here when the other writer recorded it."""

from __future__ import annotations

import logging
import time
from dataclasses import replace

import pytest
from kazoo.client import KazooClient

from tests.support.helpers import Published, every, intercept_claims, lead, wait_for
from zkbeat.ledger.store import Claim, encode_state


def write_before_the_claim(scheduler, zk_client: KazooClient, monkeypatch: pytest.MonkeyPatch, name: str, write):
    """At the leader's next claim of ``name`` (a run, not a pause check), write its znode first, as someone else.

    ``write(claim)`` gives the bytes to write. Returns the claim it came before (in a list, once it has).
    """
    seen: list[Claim] = []

    def claim(claims, fence):
        mine = next((c for c in claims if c.name == name and not c.check_only and c.consume is None), None)
        if mine is not None and not seen:
            seen.append(mine)
            zk_client.set(scheduler.ledger.entry_path(name), write(mine))
        return real(claims, fence)

    real = intercept_claims(scheduler.ledger, monkeypatch, claim)
    return seen


def run_for(scheduler, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        scheduler.tick()


def slots(published: Published, name: str) -> list[str]:
    return [slot for _, slot, _ in published.of(name)]


def test_a_slot_another_leader_recorded_between_plan_and_claim_is_not_published_again(
    make_scheduler,
    zk_client: KazooClient,
    published: Published,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Another leader (mid-handover) records the slot the leader is about to claim: the claim conflicts, the
    leader re-reads, and that slot is never published here; the entry goes on from it, each slot once."""
    scheduler = make_scheduler({"x": every(1)})
    lead(scheduler)
    wait_for(lambda: scheduler.tick() is not None and published.count("x") >= 1, timeout=15)
    # The other leader wrote what this one was about to: the slot is recorded as run, by epoch 10,000.
    seen = write_before_the_claim(
        scheduler, zk_client, monkeypatch, "x", lambda claim: encode_state(replace(claim.state, epoch=10_000))
    )
    with caplog.at_level(logging.WARNING, logger="zkbeat"):
        wait_for(lambda: scheduler.tick() is not None and seen, timeout=15)
    taken = seen[0].state.slot.isoformat()
    assert any("changed underneath" in r.getMessage() for r in caplog.records), "no conflict happened"
    count = published.count("x")
    wait_for(lambda: scheduler.tick() is not None and published.count("x") >= count + 2, timeout=15)
    run_for(scheduler, 1.5)
    assert taken not in slots(published, "x"), f"the slot {taken} another leader recorded was published again"
    assert len(set(slots(published, "x"))) == len(slots(published, "x")), slots(published, "x")


def test_a_slot_whose_znode_was_rewritten_between_plan_and_claim_is_published_once(
    make_scheduler, zk_client: KazooClient, published: Published, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Someone rewrites the entry's znode with what it held (a new version, the same state) just before the
    claim: the claim conflicts, and the slot is published once, after the re-read."""
    scheduler = make_scheduler({"x": every(1)})
    lead(scheduler)
    wait_for(lambda: scheduler.tick() is not None and published.count("x") >= 1, timeout=15)
    path = scheduler.ledger.entry_path("x")
    seen = write_before_the_claim(scheduler, zk_client, monkeypatch, "x", lambda claim: zk_client.get(path)[0])
    wait_for(lambda: scheduler.tick() is not None and seen, timeout=15)
    taken = seen[0].state.slot.isoformat()
    wait_for(lambda: scheduler.tick() is not None and taken in slots(published, "x"), timeout=15)
    run_for(scheduler, 1.5)
    assert slots(published, "x").count(taken) == 1, slots(published, "x")
    assert len(set(slots(published, "x"))) == len(slots(published, "x")), slots(published, "x")

"""A SIGTERM that cuts short the late publish of a claim that had landed: the tick is never sent twice."""

from __future__ import annotations

import logging
import os
import signal
from datetime import datetime, timedelta, timezone

import pytest
from kazoo.exceptions import ConnectionLoss

from tests.support.helpers import Published, every, fail_next_claim, lead, wait_for
from tests.support.signals import Terminated, sigterm_raises


def next_leader_slots(make_scheduler, published: Published) -> list[str]:
    """The slots published once a second scheduler has led for a tick or two; none twice."""
    second = make_scheduler({"tidy": every(1)}, identity="second")
    lead(second)
    wait_for(lambda: second.tick() is not None and len(published.headers) >= 2, timeout=10)
    slots = [h["zkbeat-slot"] for h in published.headers]
    assert len(slots) == len(set(slots)), f"a tick was published twice: {slots}"
    return slots


def test_a_late_publish_cut_short_by_sigterm_is_not_written_back(
    make_scheduler, published: Published, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The message went out, then the signal (its hold limit past) cut the publish short: close() keeps the run."""
    first = make_scheduler({"tidy": every(1)})
    lead(first)
    committed = fail_next_claim(first, monkeypatch, ConnectionLoss())
    # ZooKeeper does not answer the follower's write-back either: the next term inherits the claim.
    release = first._release_pending
    monkeypatch.setattr(first, "_release_pending", lambda final=False: release(final) if final else None)
    wait_for(lambda: first.tick() is not None and committed, timeout=10)
    assert published.headers == []

    # The next term settles the landed claim and publishes it late; the signal
    # arrives once the message is out, past the hold limit, so it goes through.
    monkeypatch.setattr("zkbeat.leading.term.SIGNAL_HOLD_LIMIT", 0.0)
    original_apply = first.apply_async

    def apply_then_sigterm(*args, **kwargs):
        result = original_apply(*args, **kwargs)
        os.kill(os.getpid(), signal.SIGTERM)
        return result

    monkeypatch.setattr(first, "apply_async", apply_then_sigterm)

    with sigterm_raises(), pytest.raises(Terminated):
        wait_for(lambda: first.tick() is not None and False, timeout=10)
    assert [h["zkbeat-slot"] for h in published.headers] == [committed[0].isoformat()]
    first.close()

    next_leader_slots(make_scheduler, published)


def test_a_claim_cut_short_by_a_signal_is_written_back_at_close(
    make_scheduler, published: Published, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The claim committed, the signal (its hold limit past) cut the wait for the reply: close() writes it back."""
    first = make_scheduler({"tidy": every(1)})
    lead(first)
    # SIGTERM handed to beat's handler while the reply was awaited.
    committed = fail_next_claim(first, monkeypatch, Terminated())
    with pytest.raises(Terminated):
        wait_for(lambda: first.tick() is not None and False, timeout=10)
    assert committed and published.headers == []
    first.close()

    slots = next_leader_slots(make_scheduler, published)
    assert committed[0].isoformat() in slots, "the claimed tick was never published (lost without a word)"


def test_a_landed_claim_found_past_its_grace_is_skipped_not_published(
    make_scheduler, published: Published, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A claim whose reply was lost, found committed only past the entry's misfire grace time, is skipped and logged."""
    grace = 2.0
    first = make_scheduler({"tidy": every(1, options={"zkbeat_misfire_grace_time": grace})})
    lead(first)
    committed = fail_next_claim(first, monkeypatch, ConnectionLoss())
    # The follower's write-back does not get through either: the next term inherits the claim.
    release = first._release_pending
    monkeypatch.setattr(first, "_release_pending", lambda final=False: release(final) if final else None)
    wait_for(lambda: first.tick() is not None and committed, timeout=10)
    assert published.headers == [] and [claim.name for claim in first._pending] == ["tidy"]

    # The next term begins once the claimed tick is later than its grace time.
    slot = committed[0]
    wait_for(lambda: datetime.now(timezone.utc) > slot + timedelta(seconds=grace + 0.5), timeout=10)
    with caplog.at_level(logging.INFO, logger="zkbeat"):
        wait_for(lambda: first.tick() is not None and len(published.headers) >= 2, timeout=15)

    slots = [h["zkbeat-slot"] for h in published.headers]
    assert slot.isoformat() not in slots, "a landed claim past its misfire grace time was published"
    assert len(slots) == len(set(slots)), f"a tick was published twice: {slots}"
    assert f"zkbeat: skipping tidy: its tick at {slot.isoformat()} is" in caplog.text
    assert first._pending == [] and first.term is not None and first.term.pending == {}

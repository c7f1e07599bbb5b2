"""A resume takes effect on the leader that held the entry back, within beat's max interval.

A paused entry's due tick is only a check of its ledger state; the leader
used to check it again at the entry's next run, so a daily entry resumed an
hour after its run waited a day on that leader, while a new leader would
have run it at once.
"""

from __future__ import annotations

import logging
from datetime import timedelta

import pytest
from celery.schedules import schedstate, schedule

from tests.support.helpers import Published, lead, wait_for
from zkbeat.ledger import controls


class Switched(schedule):
    """A daily schedule whose answer to is_due the test sets (a daily entry, minus the wait)."""

    answer = schedstate(is_due=True, next=0.3)

    def __init__(self) -> None:
        super().__init__(timedelta(days=1))

    def is_due(self, last_run_at):
        return Switched.answer


def test_a_resume_takes_effect_on_the_same_leader_within_max_interval(
    make_scheduler, published: Published, caplog: pytest.LogCaptureFixture
) -> None:
    Switched.answer = schedstate(is_due=True, next=0.3)
    entry = {"task": "zkbeat.test", "schedule": Switched()}
    scheduler = make_scheduler({"daily": entry}, beat_max_loop_interval=0.5)
    lead(scheduler)
    wait_for(lambda: scheduler.tick() is not None and published.count("daily") == 1, timeout=10)
    Switched.answer = schedstate(is_due=False, next=0.3)
    client, root = scheduler.ledger.client, scheduler.zk_settings.root
    controls.pause(client, root, "daily", "ops")
    with caplog.at_level(logging.INFO, logger="zkbeat"):
        Switched.answer = schedstate(is_due=True, next=86400)  # due now, then not for a day
        wait_for(lambda: scheduler.tick() is not None and "daily is paused" in caplog.text, timeout=10)
    controls.resume(client, root, "daily")
    wait_for(
        lambda: scheduler.tick() is not None and published.count("daily") == 2,
        timeout=10,
        message="the resumed entry waits for its next run (a day) on the leader that held it back",
    )


def test_resume_never_writes_the_layout_2_marker(zk_client, zk_root: str) -> None:
    """A rollback to layout 1 resumes every entry, then deletes <root>/v2: no resume writes the marker back, nor
    does one of an entry that never ran; a pause does (here with force: no replica is in line)."""
    controls.pause(zk_client, zk_root, "daily", "ops", scheduled=True, force=True)
    marker = f"{zk_root}/v2"
    assert zk_client.exists(marker) is not None
    zk_client.delete(marker)  # as if deleted first, by an operator in a hurry
    before, changed = controls.resume(zk_client, zk_root, "daily")
    assert changed and before.paused is not None
    assert controls.resume(zk_client, zk_root, "daily")[1] is False  # resumed already: nothing written
    assert controls.resume(zk_client, zk_root, "weekly", scheduled=True)[1] is False  # never ran, never paused
    assert zk_client.exists(marker) is None
    with pytest.raises(controls.LayoutError, match="no replica is in line"):
        controls.pause(zk_client, zk_root, "daily", "ops")
    assert zk_client.exists(marker) is None

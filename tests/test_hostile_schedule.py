"""Bad input in the user's own schedule, and faults around a claim, in-process
against real ZooKeeper and Redis: each is logged and left out or survived,
and every other entry keeps running."""

from __future__ import annotations

import logging
from datetime import datetime, timedelta
from decimal import Decimal

import pytest
from celery import beat
from celery.schedules import schedstate, schedule
from kazoo.client import KazooClient
from kazoo.exceptions import ConnectionLoss
from kombu.exceptions import OperationalError

from tests.support.helpers import Published, every, intercept_claims, lead, stop_intercepting, wait_for
from zkbeat.leading import publisher as publisher_module
from zkbeat.leading import term as term_module
from zkbeat.ledger import controls


class RaisingSchedule(schedule):
    """A schedule that cannot say when it is due (a custom schedule with a bug)."""

    def is_due(self, last_run_at: datetime):
        raise ValueError("this schedule cannot say when it is due")


def raising() -> dict:
    return {"task": "zkbeat.test", "schedule": RaisingSchedule(timedelta(seconds=1))}


class Ambiguous:
    """An answer whose truth cannot be told, as numpy's array of several booleans answers."""

    def __bool__(self) -> bool:
        raise ValueError("the truth value of an array with more than one element is ambiguous")


class NotABool:
    """An answer whose ``__bool__`` answers no bool (Python raises TypeError at its truth test)."""

    def __bool__(self):
        return "yes"


class OddAnswer(schedule):
    """A schedule whose ``is_due`` answers ``is_due`` with an object of ``kind``: no exception in is_due itself."""

    def __init__(self, kind: type) -> None:
        super().__init__(timedelta(seconds=0.2))
        self.kind = kind

    def is_due(self, last_run_at: datetime):
        return schedstate(self.kind(), 0.2)

    def __reduce__(self):
        return (self.__class__, (self.kind,))


class Answering(schedule):
    """A schedule that answers ``schedstate(is_due, wait)`` as given: Celery's own never answer such waits."""

    def __init__(self, is_due: bool, wait: object) -> None:
        super().__init__(timedelta(seconds=0.2))
        self.answer = schedstate(is_due, wait)

    def is_due(self, last_run_at: datetime):
        return self.answer

    def __reduce__(self):
        return (self.__class__, tuple(self.answer))


class Unprintable:
    """An object whose repr raises (a half-built model row, a broken ``__repr__``)."""

    def __repr__(self) -> str:
        raise RuntimeError("no repr (test)")


class RaisingUnprintable(schedule):
    """A schedule whose is_due raises an error that holds an :class:`Unprintable`: the error's repr raises too."""

    def is_due(self, last_run_at: datetime):
        raise ValueError(Unprintable())


def messages(caplog: pytest.LogCaptureFixture, text: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if text in r.getMessage()]


def tick_until(scheduler, predicate, timeout: float = 15):
    return wait_for(lambda: scheduler.tick() is not None and predicate(), timeout=timeout)


def left_out_while_the_rest_runs(scheduler, published: Published, caplog: pytest.LogCaptureFixture, name: str):
    """Lead ``scheduler`` until "tidy" ran 5 times: ``name`` never ran, the leader never stepped down, and nothing
    was logged as unexpected. Returns the lines that left ``name`` out (the callers count them)."""
    lead(scheduler)
    epoch = scheduler.election.epoch
    with caplog.at_level(logging.INFO, logger="zkbeat"):
        tick_until(scheduler, lambda: published.entries().count("tidy") >= 5)
    assert name not in published.entries()
    assert scheduler.election.epoch == epoch and scheduler.term is not None, "the leader never stepped down"
    assert not messages(caplog, "unexpected error")
    return messages(caplog, f"leaving out {name!r}")


def test_an_entry_whose_schedule_raises_is_left_out_without_celery_5_7(
    make_scheduler, published: Published, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """On a Celery without Scheduler._is_due_failed (5.3 to 5.6), a raising entry is logged once and the rest runs."""
    monkeypatch.delattr(beat.Scheduler, "_is_due_failed", raising=False)
    scheduler = make_scheduler({"broken": raising(), "tidy": every(0.2)})
    left_out = left_out_while_the_rest_runs(scheduler, published, caplog, "broken")
    assert len(left_out) == 1, "logged once, not on every pass"


@pytest.mark.parametrize("kind", [Ambiguous, NotABool], ids=["ambiguous", "not-a-bool"])
def test_an_entry_whose_is_due_answer_has_no_truth_value_is_left_out(
    make_scheduler, published: Published, caplog: pytest.LogCaptureFixture, kind: type
) -> None:
    """An is_due answer whose truth test raises is the schedule's error, as if is_due raised: the entry is logged
    once and left out, and the rest runs. It raised out of the leader's pass (the heap's build, in every pass): the
    leader stepped down, every replica in turn, and nothing ran."""
    scheduler = make_scheduler({"odd": {"task": "zkbeat.test", "schedule": OddAnswer(kind)}, "tidy": every(0.2)})
    left_out = left_out_while_the_rest_runs(scheduler, published, caplog, "odd")
    assert len(left_out) == 1, "logged once, not on every pass"


@pytest.mark.parametrize("is_due", [False, True], ids=["not-due", "due"])
def test_an_answer_whose_wait_is_past_any_float_leaves_the_other_entries_alone(
    make_scheduler, published: Published, caplog: pytest.LogCaptureFixture, is_due: bool
) -> None:
    """A wait of 10**400 seconds (an int no float holds): placing the entry on beat's heap raised out of the
    leader's pass (at the heap's build, or after the entry's run), in every pass. It is a wait that is no number:
    the entry is asked again after beat's max interval (and, due, runs again)."""
    entries = {"odd": {"task": "zkbeat.test", "schedule": Answering(is_due, 10**400)}, "tidy": every(0.2)}
    scheduler = make_scheduler(entries)
    lead(scheduler)
    epoch = scheduler.election.epoch
    odd = 2 if is_due else 0
    with caplog.at_level(logging.INFO, logger="zkbeat"):
        tick_until(scheduler, lambda: published.entries().count("tidy") >= 3 and published.count("odd") >= odd)
    assert scheduler.election.epoch == epoch and scheduler.term is not None, "the leader never stepped down"
    assert not messages(caplog, "unexpected error")


@pytest.mark.parametrize("wait", [None, Decimal("NaN")], ids=["none", "decimal-nan"])
def test_a_paused_entry_whose_due_answer_has_a_next_wait_that_is_no_float_leaves_the_term_alone(
    make_scheduler, zk_client: KazooClient, published: Published, caplog: pytest.LogCaptureFixture, wait: object
) -> None:
    """A paused entry's due tick is checked again within beat's max interval (the lesser of its wait and that):
    a wait that is no number (None, a Decimal NaN, which refuses ``<``) raised there, in every pass (the leader
    stepped down, every replica in turn). Such a wait is beat's max interval."""
    entries = {"odd": {"task": "zkbeat.test", "schedule": Answering(True, wait)}, "tidy": every(0.2)}
    scheduler = make_scheduler(entries)
    # The operator's own connected client: the scheduler's connects in the background and may not be up yet.
    controls.pause(zk_client, scheduler.zk_settings.root, "odd", "ops", scheduled=True, force=True)
    lead(scheduler)
    epoch = scheduler.election.epoch
    with caplog.at_level(logging.INFO, logger="zkbeat"):
        tick_until(scheduler, lambda: published.entries().count("tidy") >= 5 and "odd is paused" in caplog.text)
    assert "odd" not in published.entries()
    assert scheduler.election.epoch == epoch and scheduler.term is not None, "the leader never stepped down"
    assert not messages(caplog, "unexpected error")


def test_an_entry_whose_options_are_no_mapping_is_left_out(
    make_scheduler, published: Published, caplog: pytest.LogCaptureFixture
) -> None:
    """Options that are a list, not a mapping: the pass's look for the entry's jitter raised out of the pass, in
    every pass (the leader stepped down, every replica in turn, and nothing ran). The entry is logged once and left
    out where its tick is planned, and the rest runs."""
    scheduler = make_scheduler({"odd": every(0.2, options=["queue", "x"]), "tidy": every(0.2)})
    left_out = left_out_while_the_rest_runs(scheduler, published, caplog, "odd")
    assert len(left_out) == 1, "logged once, not on every pass"


def test_an_entry_whose_schedule_raises_an_error_that_cannot_be_printed_is_left_out(
    make_scheduler, published: Published, caplog: pytest.LogCaptureFixture
) -> None:
    """The error's repr raised while the entry was being logged and left out, out of the leader's pass, in every
    pass (the leader stepped down, every replica in turn). It is logged by its class, once, and the rest runs."""
    broken = {"task": "zkbeat.test", "schedule": RaisingUnprintable(timedelta(seconds=0.2))}
    scheduler = make_scheduler({"broken": broken, "tidy": every(0.2)})
    left_out = left_out_while_the_rest_runs(scheduler, published, caplog, "broken")
    assert len(left_out) == 1 and "ValueError" in left_out[0], left_out


def test_a_task_routed_to_a_missing_queue_is_dropped_not_taken_for_an_outage(
    make_scheduler, published: Published, caplog: pytest.LogCaptureFixture
) -> None:
    """A queue missing from task_queues: that tick is logged and counted as run; its batch is published."""
    scheduler = make_scheduler(
        {"nowhere": every(0.3, options={"queue": "nowhere"}), "alpha": every(0.3), "beta": every(0.3)},
        task_create_missing_queues=False,
        task_queues={"celery": {"exchange": "celery", "routing_key": "celery"}},
    )
    lead(scheduler)
    with caplog.at_level(logging.INFO, logger="zkbeat"):
        tick_until(scheduler, lambda: min(published.entries().count(n) for n in ("alpha", "beta")) >= 4)
    dropped = messages(caplog, "nowhere (slot")
    runs = scheduler.ledger.load(["nowhere"])["nowhere"].state.total_run_count
    assert dropped and all("cannot be sent and is dropped" in m for m in dropped)
    assert len(dropped) == runs, "logged once per tick, and each tick counts as run"
    assert not messages(caplog, "broker unreachable") and not messages(caplog, "reachable again")
    assert not messages(caplog, "written back"), "nothing in its batch was held back"


def test_entries_deleted_under_a_running_leader_are_recreated(
    make_scheduler, published: Published, zk_client: KazooClient, zk_root: str, caplog: pytest.LogCaptureFixture
) -> None:
    """<root>/v1/entries deleted while leading: the leader re-creates it and goes on publishing, no hot loop."""
    scheduler = make_scheduler({"tidy": every(0.2), "report": every(0.2)})
    lead(scheduler)
    tick_until(scheduler, lambda: published.entries().count("tidy") >= 2)
    zk_client.delete(f"{zk_root}/v1/entries", recursive=True)
    before = len(published.headers)
    with caplog.at_level(logging.WARNING, logger="zkbeat"):
        tick_until(scheduler, lambda: len(published.headers) >= before + 6)
    assert zk_client.exists(f"{zk_root}/v1/entries/tidy") is not None
    assert len(messages(caplog, "changed underneath")) <= 4, "each entry re-read once or twice, not in a loop"
    assert scheduler.election.is_leader


def test_a_lost_reply_then_a_broker_outage_neither_loses_nor_doubles_the_tick(
    make_scheduler, published: Published, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A claim commits, its reply is lost; leading again, the broker is down: the tick is withdrawn, then sent once."""
    scheduler = make_scheduler({"tidy": every(0.5)})
    lead(scheduler)
    tick_until(scheduler, lambda: published.entries().count("tidy") >= 1)
    ledger = scheduler.ledger
    count_before = ledger.load(["tidy"])["tidy"].state.total_run_count
    lost: list = []

    def claim_then_lose_the_reply(claims, fence):
        result = real_claim(claims, fence)
        if not lost and claims[0].state.slot is not None:
            lost.append(claims[0].state)  # committed on the server; the reply never arrives
            raise ConnectionLoss("reply lost (test)")
        return result

    real_claim = intercept_claims(ledger, monkeypatch, claim_then_lose_the_reply)
    with caplog.at_level(logging.INFO, logger="zkbeat"):
        tick_until(scheduler, lambda: bool(lost))
        assert scheduler.term is None and scheduler._pending, "the claim is kept pending across terms"
        stop_intercepting(ledger, monkeypatch)
        # The partition that lost the reply cuts the broker too: kombu cannot
        # reach it when the replica leads again, and then can.
        real_wait = publisher_module.wait_for_broker
        outage = [OperationalError("broker unreachable (test)")]
        monkeypatch.setattr(
            publisher_module, "wait_for_broker", lambda *a, **k: outage.pop() if outage else real_wait(*a, **k)
        )
        lead(scheduler)
        slot = lost[0].slot.isoformat()
        tick_until(scheduler, lambda: published.headers and any(h["zkbeat-slot"] == slot for h in published.headers))
        tick_until(scheduler, lambda: published.entries().count("tidy") >= 4)
    slots = [h["zkbeat-slot"] for h in published.headers]
    assert slots.count(slot) == 1, "the lost-reply tick is published exactly once"
    assert len(slots) == len(set(slots)), "no tick twice"
    assert messages(caplog, "written back"), "with the broker down, the landed claim was written back"
    assert not messages(caplog, "did not commit"), "a claim that committed is never described as not committed"
    state = ledger.load(["tidy"])["tidy"].state
    assert state.total_run_count == count_before + len(slots) - 1, "each published tick counted once"


def test_a_leader_whose_unexpected_errors_persist_steps_down_only_after_several(
    make_scheduler, published: Published, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A bug that raises on every pass: the term restarts twice, then the replica steps down (no ping-pong)."""
    scheduler = make_scheduler({"tidy": every(0.2)})
    lead(scheduler)
    tick_until(scheduler, lambda: published.headers)
    epoch = scheduler.election.epoch

    def bug(*args, **kwargs):
        raise RuntimeError("a bug (test)")

    monkeypatch.setattr(term_module.Term, "run", bug)
    with caplog.at_level(logging.INFO, logger="zkbeat"):
        wait_for(
            lambda: scheduler.tick() is not None and len(messages(caplog, "unexpected error while leading")) >= 3,
            timeout=20,
        )
    assert len(messages(caplog, "starting the term afresh")) == 2
    assert len(messages(caplog, "stepping down")) == 1
    monkeypatch.undo()
    lead(scheduler)
    assert scheduler.election.epoch != epoch, "it stepped down and joined again at the back"

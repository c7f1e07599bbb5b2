"""A leader's planning of a tick, in-process against real ZooKeeper and Redis: what it reads once.

An entry's policy options (grace, catch-up, jitter) are parsed when the
schedule is read, not at every tick (zkbeat.ticking.policy), and a pass reads the
app's clock once, not several times per entry (zkbeat.ticking.passclock); the pass
runs without Python's cyclic collector, whose full collections walk the
whole schedule (zkbeat._collector). Counted, not timed.
"""

from __future__ import annotations

import gc
import logging
import time
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone

import celery.app.base
import pytest
from celery.schedules import schedule
from celery.signals import before_task_publish

from tests.support.helpers import Published, early_answers, every, lead, wait_for
from zkbeat import Scheduler

GRACE_COMPLAINT = "using zkbeat_misfire_grace_time instead"
CATCHUP_COMPLAINT = "using zkbeat_catchup"


def complaints(caplog: pytest.LogCaptureFixture, text: str) -> int:
    return len([record for record in caplog.records if text in record.getMessage()])


def test_a_bad_entry_option_is_logged_once_not_at_every_tick(
    make_scheduler, published: Published, caplog: pytest.LogCaptureFixture
) -> None:
    """Bad grace and catch-up options: the setting is used, and each is logged once over many ticks."""
    options = {"zkbeat_misfire_grace_time": "soon", "zkbeat_catchup": "sometimes"}
    scheduler = make_scheduler({"odd": every(0.2, options=options)})
    lead(scheduler)
    with caplog.at_level(logging.ERROR, logger="zkbeat"):
        wait_for(lambda: scheduler.tick() is not None and published.count("odd") >= 5, timeout=20)
    assert complaints(caplog, GRACE_COMPLAINT) == 1
    assert complaints(caplog, CATCHUP_COMPLAINT) == 1


def test_a_changed_entry_is_parsed_again(
    make_scheduler, published: Published, caplog: pytest.LogCaptureFixture
) -> None:
    """The policy is kept with the entry's options: an entry read again from a changed schedule is parsed again."""
    scheduler = make_scheduler({"tidy": every(0.2)})
    lead(scheduler)
    wait_for(lambda: scheduler.tick() is not None and published.count("tidy") >= 2, timeout=20)
    with caplog.at_level(logging.ERROR, logger="zkbeat"):
        scheduler.update_from_dict({"tidy": every(0.2, options={"zkbeat_misfire_grace_time": "soon"})})
        before = published.count("tidy")
        wait_for(lambda: scheduler.tick() is not None and published.count("tidy") >= before + 3, timeout=20)
    assert complaints(caplog, GRACE_COMPLAINT) == 1


def test_a_pass_reads_the_app_clock_once_not_per_entry(
    make_scheduler, published: Published, monkeypatch: pytest.MonkeyPatch
) -> None:
    """50 interval entries every 0.5 s: Celery's app.now() is read less than once per publish (it was ~7)."""
    names = [f"steady-{i:02d}" for i in range(50)]
    scheduler = make_scheduler({name: every(0.5) for name in names})
    lead(scheduler)
    wait_for(lambda: scheduler.tick() is not None and len(published.headers) >= 100, timeout=30)
    reads = [0]
    to_utc = celery.app.base.to_utc

    def counted(moment):
        reads[0] += 1
        return to_utc(moment)

    monkeypatch.setattr(celery.app.base, "to_utc", counted)  # inside Celery's app.now(), which stays Celery's
    start = len(published.headers)
    wait_for(lambda: scheduler.tick() is not None and len(published.headers) >= start + 200, timeout=30)
    done = len(published.headers) - start
    assert reads[0] < done, f"app.now() read {reads[0]} times for {done} publishes"


@pytest.fixture
def collector_seen() -> Iterator[list[bool]]:
    """Whether Python's cyclic collector would run, at each message this process is about to publish.

    zkbeat._collector holds collections off with a first threshold of 0, leaving the application's gc.isenabled().
    """
    seen: list[bool] = []

    def record(**kwargs) -> None:
        seen.append(gc.isenabled() and gc.get_threshold()[0] != 0)

    before_task_publish.connect(record, weak=False)
    yield seen
    before_task_publish.disconnect(record)


def test_a_pass_claims_and_publishes_with_the_cyclic_collector_off_and_turns_it_on_after(
    make_scheduler, published: Published, collector_seen: list[bool]
) -> None:
    """A full collection walks the whole schedule: none during a leader's pass (zkbeat._collector), on again after."""
    assert gc.isenabled()
    scheduler = make_scheduler({f"kept-{i:02d}": every(0.2) for i in range(20)})
    lead(scheduler)
    wait_for(lambda: scheduler.tick() is not None and len(published.headers) >= 60, timeout=30)
    assert gc.isenabled() and gc.get_threshold()[0] != 0, "the collector stayed off after the pass"
    assert len(collector_seen) >= 60 and not any(collector_seen), "a message was published with the collector on"
    assert sorted(set(published.entries())) == [f"kept-{i:02d}" for i in range(20)]


def test_a_pass_leaves_the_collector_off_where_the_application_turned_it_off(
    make_scheduler, published: Published, collector_seen: list[bool]
) -> None:
    """An application that runs without the cyclic collector keeps it off through the leader's passes."""
    scheduler = make_scheduler({"off": every(0.2)})
    lead(scheduler)
    gc.disable()
    try:
        wait_for(lambda: scheduler.tick() is not None and published.count("off") >= 3, timeout=20)
        assert not gc.isenabled(), "a pass turned on the collector the application had turned off"
    finally:
        gc.enable()
    assert collector_seen and not any(collector_seen)


def test_an_intervals_moment_is_made_aware_as_celery_makes_it() -> None:
    """interval_aware answers as the schedule's own maybe_make_aware: an aware moment unchanged, a naive one in
    the app's zone as Celery localises it, and a schedule class with its own maybe_make_aware is asked."""
    from datetime import datetime, timedelta, timezone
    from zoneinfo import ZoneInfo

    from celery import Celery, schedules

    from zkbeat.ticking.ticks import interval_aware

    app = Celery("aware", set_as_current=False)
    app.conf.timezone = "Europe/Paris"
    plain = schedules.schedule(timedelta(seconds=30), app=app)
    for moment in (
        datetime(2026, 3, 29, 1, 30, tzinfo=timezone.utc),
        datetime(2026, 3, 29, 2, 30, tzinfo=ZoneInfo("Europe/Paris")),
        datetime(2026, 3, 29, 1, 30),
        datetime(2026, 10, 25, 2, 30, fold=1),
    ):
        got, expected = interval_aware(plain, moment), plain.maybe_make_aware(moment)
        assert got == expected and got.tzinfo == expected.tzinfo and got.utcoffset() == expected.utcoffset(), moment

    class Shifted(schedules.schedule):
        def maybe_make_aware(self, dt: datetime, naive_as_utc: bool = True) -> datetime:
            return super().maybe_make_aware(dt, naive_as_utc) + timedelta(hours=1)

    moment = datetime(2026, 3, 29, 1, 30, tzinfo=timezone.utc)
    assert interval_aware(Shifted(timedelta(seconds=30), app=app), moment) == moment + timedelta(hours=1)


def test_a_clock_of_its_own_is_timed_from_the_pass_only_when_its_host_named_its_code() -> None:
    """``PassClock.real_clocks``: an entry whose schedule has a ``nowfun`` is answered from the pass's reading
    only if that function's code was named; a callable without code of its own (a partial) never is."""
    import functools
    from datetime import datetime, timedelta, timezone

    from celery import Celery, beat, schedules

    from zkbeat.ticking.passclock import PassClock

    app = Celery("zkbeat-test", set_as_current=False)

    def real_now() -> datetime:
        return datetime.now(timezone.utc)

    def entry(nowfun) -> beat.ScheduleEntry:
        schedule = schedules.schedule(timedelta(seconds=60), nowfun=nowfun, app=app)
        return beat.ScheduleEntry(name="e", task="t", schedule=schedule, app=app)

    named, unnamed, partial = entry(real_now), entry(lambda: real_now()), entry(functools.partial(real_now))
    clock = PassClock()
    clock.real_clocks.update({real_now.__code__, None})
    clock.start()
    try:
        assert clock.when(named, 5) is not None
        assert clock.when(unnamed, 5) is None
        assert clock.when(partial, 5) is None
        assert clock.is_due(named) is None, "its zone is its own: is_due asks the entry"
    finally:
        clock.stop()


def test_beat_s_heap_wakes_a_leader_when_its_entries_are_due_not_just_before(
    make_scheduler, published: Published, monkeypatch: pytest.MonkeyPatch
) -> None:
    """30 entries every 0.5 s, run as beat runs them (a tick, then a sleep of what it returned): every entry the
    pass takes off the heap is due. Celery's heap puts an entry 10 ms before its due moment (``adjust``'s drift):
    the pass that woke then asked every entry, heard "not yet", pushed it back and asked again in the next pass,
    twice the work of a burst (10,000 entries asked and moved in vain before the first was published)."""
    names = [f"heap-{i:02d}" for i in range(30)]
    scheduler = make_scheduler({name: every(0.5) for name in names}, beat_max_loop_interval=1)
    lead(scheduler)
    early = early_answers(scheduler, published, monkeypatch)
    assert early == [], f"{len(early)} entries taken off the heap before they were due, e.g. {early[:3]}"


class OwnSchedule(schedule):
    """A schedule class of the user's own: the pass's clock does not answer its is_due, the entry's own does."""


def _utc_now() -> datetime:
    return datetime.now(timezone.utc)


@pytest.mark.parametrize(
    "kind",
    [
        pytest.param(lambda: OwnSchedule(timedelta(seconds=0.5)), id="a schedule subclass"),
        pytest.param(lambda: schedule(timedelta(seconds=0.5), nowfun=_utc_now), id="a schedule with its own clock"),
    ],
)
def test_entries_the_pass_clock_does_not_answer_for_are_not_taken_off_the_heap_early(
    kind, make_scheduler, published: Published, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As above, for entries whose is_due reads their own clock (a schedule subclass, a nowfun; crontabs and
    django-celery-beat's rows too): each wait counts from the moment that clock was read, not from the pass's
    reading, which came earlier. From the reading, an entry asked late in a long pass (a burst, a heap rebuilt
    from 10,000 rows: seconds) went back on the heap that much early and was asked again in vain."""
    names = [f"own-{i:02d}" for i in range(30)]
    scheduler = make_scheduler({name: every(0.5, schedule=kind()) for name in names}, beat_max_loop_interval=1)
    lead(scheduler)
    early = early_answers(scheduler, published, monkeypatch, answer_takes=0.0002)
    assert early == [], f"{len(early)} entries taken off the heap before they were due, e.g. {early[:3]}"


#: How long the slow clock below takes to answer, in the virtual time of :class:`VirtualClock`. Counted to the start
#: of the put-back, the 30th entry went back 29 answers late (0.58 s); counted to its own answer, not late at all.
SLOW_CLOCK = 0.02


class VirtualClock:
    """A clock of the entries' own that takes SLOW_CLOCK to answer, in virtual time: nothing here is timed.

    Its wall time (the entries' ``nowfun``) and the heap's monotonic clock
    (``zkbeat.leading.heap_pass``'s ``time.monotonic``) move together, and
    only when the entries' clock is read, as if each reading took SLOW_CLOCK
    and nothing else took any time: a placement counted to the wrong moment
    is late by an exact number of readings, whatever the machine's load.
    """

    def __init__(self) -> None:
        self.wall = time.time()
        self.elapsed = 0.0

    def utc_now(self) -> datetime:
        self.elapsed += SLOW_CLOCK  # the answer is of the moment the reading returns
        return datetime.fromtimestamp(self.wall + self.elapsed, timezone.utc)

    def monotonic(self) -> float:
        return self.elapsed

    def __getattr__(self, name: str):  # the heap's other uses of the time module: the real one's
        return getattr(time, name)


def test_entries_on_a_clock_of_their_own_are_not_put_back_on_the_heap_late(
    make_scheduler, published: Published, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An entry asked on its own clock goes back on the heap at its due moment, not later, wherever it is in the pass.

    Its heap time is Celery's ``_when`` (a reading of its own clock, taken as the entry is put back) plus its wait,
    less the time since its ``is_due`` answered: that time must run up to the same reading. Counted only up to the
    start of the put-back, each entry was placed late by the put-backs before it (each reading its clock): in a
    long pass (a burst, 10,000 database rows: a tenth of a second and more), published that much late, and an
    interval (counting from its last run) drifting later by as much round after round.
    """
    from zkbeat.leading import heap_pass

    clock = VirtualClock()
    last = datetime.fromtimestamp(clock.wall, timezone.utc) - timedelta(minutes=30)
    names = [f"slow-{i:02d}" for i in range(30)]
    entries = {
        name: every(3600, schedule=schedule(timedelta(hours=1), nowfun=clock.utc_now), last_run_at=last)
        for name in names
    }
    scheduler = make_scheduler(entries, beat_max_loop_interval=5)
    scheduler.wait_in_tick = False
    lead(scheduler)
    scheduler.tick()  # the term begins and the heap is built
    assert scheduler._heap is not None and len(scheduler._heap) == len(names)
    # Every entry looked at again in one pass (as when placed early): each answers "not yet", 30 minutes.
    scheduler._heap = [event._replace(time=0.0) for event in scheduler._heap]
    monkeypatch.setattr(heap_pass, "time", clock)
    readings = clock.elapsed
    scheduler.tick()
    read = round((clock.elapsed - readings) / SLOW_CLOCK)
    assert read >= 2 * len(names), f"{read} readings: each entry reads its clock to answer, and again to be put back"
    due = (last + timedelta(hours=1)).timestamp() + heap_pass.HEAP_LAG
    late = sorted(((event.time - due, event.entry.name) for event in scheduler._heap), reverse=True)
    assert len(late) == len(names)
    assert abs(late[0][0]) < SLOW_CLOCK / 2 and abs(late[-1][0]) < SLOW_CLOCK / 2, (
        f"placed off its due moment by up to {late[0][0]:.3f}s / {late[-1][0]:.3f}s: {late[:3]}"
    )
    assert published.headers == []


def test_the_heap_lag_the_changelog_names_is_the_one_adjust_adds(monkeypatch: pytest.MonkeyPatch) -> None:
    """``zkbeat.leading.heap_pass.HEAP_LAG`` is read when beat's heap places an entry, not frozen at import."""
    from zkbeat.leading import heap_pass

    monkeypatch.setattr(heap_pass, "HEAP_LAG", 0.25)
    assert heap_pass.HeapPass().adjust(2.0) == 2.25
    assert heap_pass.HeapPass().adjust(0) == 0


class CeleryReserve(Scheduler):
    """A user's subclass whose reserve() is Celery's own (a successor run at the clock of the moment it is made)."""

    def reserve(self, entry):
        time.sleep(0.002)  # each successor made a while into the pass (a burst: its publishes before it)
        new_entry = self.schedule[entry.name] = next(entry)
        return new_entry


@pytest.mark.beat_scheduler("tests.test_planning_cost:CeleryReserve")
def test_interval_successors_a_subclass_s_reserve_made_are_not_taken_off_the_heap_early(
    make_scheduler, published: Published, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A subclass's reserve() that does not give the successor the pass's reading as its last run: the successor's
    next wait counts from when reserve() made it. Counted from the pass's reading (as zkbeat's own reserve() does),
    every successor went back on the heap early by the time the pass had taken until it was made, and was asked
    again in vain."""
    names = [f"reserved-{i:02d}" for i in range(30)]
    scheduler = make_scheduler({name: every(0.5) for name in names}, beat_max_loop_interval=1)
    lead(scheduler)
    early = early_answers(scheduler, published, monkeypatch)
    assert early == [], f"{len(early)} entries taken off the heap before they were due, e.g. {early[:3]}"

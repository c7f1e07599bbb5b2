"""Jitter: each tick goes out at slot + an offset in [0, J) that every replica
computes alike from (root, entry, slot); headers and ledger keep the nominal slot."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone

import pytest
from celery import Celery
from celery.beat import ScheduleEntry
from celery.schedules import crontab
from celery.signals import after_task_publish

from tests.support.helpers import every, lead, wait_for
from zkbeat import ConfigurationError
from zkbeat.conf import read_settings
from zkbeat.ticking.jitter import Jitter, offset
from zkbeat.ticking.ticks import HEADER_SLOT, tick_slot

SLOT = datetime(2030, 1, 1, 9, 0, tzinfo=timezone.utc)


class Sent:
    """Every message this process publishes: its headers and the moment the publish returned (time.time())."""

    def __init__(self) -> None:
        self.rows: list[tuple[dict, float]] = []
        after_task_publish.connect(self._record, weak=False)

    def _record(self, headers=None, **kwargs) -> None:
        self.rows.append((dict(headers or {}), time.time()))

    def of(self, name: str) -> list[tuple[datetime, float, dict]]:
        """(nominal slot, publish time, headers) of ``name``'s messages, in publish order."""
        return [(datetime.fromisoformat(h[HEADER_SLOT]), at, h) for h, at in self.rows if h.get("zkbeat-entry") == name]

    def close(self) -> None:
        after_task_publish.disconnect(self._record)


@pytest.fixture
def sent() -> Iterator[Sent]:
    """What this test process published, with when."""
    recorder = Sent()
    yield recorder
    recorder.close()


def entry(name: str, schedule, options: dict | None = None) -> ScheduleEntry:
    app = Celery("jitter", set_as_current=False)
    return ScheduleEntry(name=name, task="t", schedule=schedule, options=options or {}, app=app)


# -- the offset, pure ---------------------------------------------------------


def test_the_offset_is_deterministic_and_in_range() -> None:
    """The same (root, entry, slot) gives the same offset, always in [0, J); root, entry and slot each change it."""
    first = offset("/zkbeat/proj", "report", SLOT, 30)
    assert first == offset("/zkbeat/proj", "report", SLOT, 30)
    assert 0 <= first < 30
    others = {
        offset("/zkbeat/other", "report", SLOT, 30),
        offset("/zkbeat/proj", "tidy", SLOT, 30),
        offset("/zkbeat/proj", "report", SLOT + timedelta(minutes=1), 30),
    }
    assert first not in others
    assert offset("/zkbeat/proj", "report", SLOT, 0) == 0
    # The same instant in another zone names the same slot.
    assert offset("/zkbeat/proj", "report", SLOT.astimezone(timezone(timedelta(hours=2))), 30) == first


def test_offsets_of_100_entries_spread_over_the_window() -> None:
    """The same slot of 100 entries lands in at least 8 of 10 equal buckets of [0, J), all in range."""
    jitter = 60.0
    offsets = [offset("/zkbeat/proj", f"entry-{i}", SLOT, jitter) for i in range(100)]
    assert all(0 <= o < jitter for o in offsets)
    buckets = {int(o / jitter * 10) for o in offsets}
    assert len(buckets) >= 8, f"offsets bunched in buckets {sorted(buckets)}"


def test_one_entrys_offsets_spread_over_its_slots() -> None:
    """One entry's 100 consecutive slots also land in at least 8 of 10 buckets (not the same second every time)."""
    offsets = [offset("/zkbeat/proj", "report", SLOT + timedelta(minutes=i), 60) for i in range(100)]
    assert len({int(o / 6) for o in offsets}) >= 8


# -- settings and options -----------------------------------------------------


def test_the_setting_defaults_to_off_and_accepts_seconds() -> None:
    """zkbeat_jitter is 0 unless set; numbers and timedeltas are seconds."""
    assert read_settings({}, "proj", {}).jitter == 0
    assert read_settings({"zkbeat_jitter": 15}, "proj", {}).jitter == 15.0
    assert read_settings({"zkbeat_jitter": "2.5"}, "proj", {}).jitter == 2.5
    assert read_settings({"zkbeat_jitter": timedelta(seconds=90)}, "proj", {}).jitter == 90.0


@pytest.mark.parametrize("value", [-1, "soon", True, float("nan"), [5]])
def test_a_bad_setting_fails_naming_it_and_its_value(value) -> None:
    """A negative or non-numeric zkbeat_jitter fails at start-up with the setting's name and the value."""
    with pytest.raises(ConfigurationError) as caught:
        read_settings({"zkbeat_jitter": value}, "proj", {})
    assert caught.value.setting == "zkbeat_jitter"
    assert str(caught.value).startswith(f"zkbeat_jitter={value!r}: ")


def test_a_jitter_not_below_the_interval_is_logged_once_and_ignored(caplog: pytest.LogCaptureFixture) -> None:
    """An entry whose jitter is not below its interval runs without jitter, and says so in one log line."""
    jitter = Jitter("/zkbeat/proj", 0)
    wide = entry("wide", timedelta(seconds=10), {"zkbeat_jitter": 10})
    with caplog.at_level(logging.WARNING, logger="zkbeat.ticking.jitter"):
        assert [jitter.offset_for(wide, SLOT + timedelta(seconds=10 * i)) for i in range(5)] == [0.0] * 5
    lines = [r.getMessage() for r in caplog.records if "wide" in r.getMessage()]
    assert len(lines) == 1 and "zkbeat_jitter of 10s is not below its period of 10s" in lines[0], lines


def test_the_setting_too_is_ignored_for_an_entry_whose_interval_is_shorter(caplog: pytest.LogCaptureFixture) -> None:
    """zkbeat_jitter=30 jitters an hourly entry, and leaves a 10 s entry unjittered with one log line."""
    jitter = Jitter("/zkbeat/proj", 30)
    hourly, quick = entry("hourly", timedelta(hours=1)), entry("quick", timedelta(seconds=10))
    assert jitter.offset_for(hourly, SLOT) == offset("/zkbeat/proj", "hourly", SLOT, 30)
    with caplog.at_level(logging.WARNING, logger="zkbeat.ticking.jitter"):
        assert jitter.offset_for(quick, SLOT) == jitter.offset_for(quick, SLOT) == 0.0
    assert sum("quick" in r.getMessage() for r in caplog.records) == 1


def test_a_crontab_is_measured_by_the_gap_to_its_next_run(caplog: pytest.LogCaptureFixture) -> None:
    """A minutely crontab takes a 30 s jitter and refuses a 90 s one (logged once)."""
    minutely = crontab()
    ok = entry("ok", minutely, {"zkbeat_jitter": 30})
    wide = entry("wide", minutely, {"zkbeat_jitter": 90})
    slot = tick_slot(ok)
    assert 0 <= Jitter("/r", 0).offset_for(ok, slot) < 30
    assert Jitter("/r", 0).offset_for(ok, slot) == offset("/r", "ok", slot, 30)
    jitter = Jitter("/r", 0)
    with caplog.at_level(logging.WARNING, logger="zkbeat.ticking.jitter"):
        assert jitter.offset_for(wide, slot) == jitter.offset_for(wide, slot) == 0.0
    assert sum("wide" in r.getMessage() and "not below" in r.getMessage() for r in caplog.records) == 1


def test_a_bad_entry_option_is_logged_once_and_the_setting_used(caplog: pytest.LogCaptureFixture) -> None:
    """options={'zkbeat_jitter': 'soon'} logs one line naming the entry, option and value; zkbeat_jitter applies."""
    jitter = Jitter("/zkbeat/proj", 20)
    bad = entry("bad", timedelta(hours=1), {"zkbeat_jitter": "soon"})
    with caplog.at_level(logging.WARNING, logger="zkbeat.ticking.jitter"):
        first, second = jitter.offset_for(bad, SLOT), jitter.offset_for(bad, SLOT)
    assert first == second == offset("/zkbeat/proj", "bad", SLOT, 20)
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and "bad.options.zkbeat_jitter='soon'" in lines[0], lines


# -- in-process, real ZooKeeper and Redis --------------------------------------


def test_a_jittered_tick_keeps_its_nominal_slot_and_goes_out_after_slot_plus_offset(make_scheduler, sent) -> None:
    """Each publish carries the nominal slot, comes no earlier than slot + offset, and the interval counts on from the slot."""  # noqa: E501
    scheduler = make_scheduler({"spread": every(2, options={"zkbeat_jitter": 1.8})})
    root = scheduler.zk_settings.root
    lead(scheduler)
    wait_for(lambda: scheduler.tick() is not None and len(sent.of("spread")) >= 3, timeout=30)
    rows = sent.of("spread")
    for slot, at, headers in rows:
        assert at >= (slot + timedelta(seconds=offset(root, "spread", slot, 1.8))).timestamp()
        assert "zkbeat_jitter" not in headers
    # Each next slot is the last run plus the interval; the last run is the
    # nominal moment, so it lies at least the offset before the publish (the
    # jittered moment would lie after it, and the schedule would drift).
    for (slot, at, _), (following, _, _) in zip(rows, rows[1:]):
        last_run = following - timedelta(seconds=2)
        assert last_run >= slot
        assert (last_run + timedelta(seconds=offset(root, "spread", slot, 1.8))).timestamp() <= at


def test_after_a_failover_the_new_leader_computes_the_same_moment(make_scheduler, sent) -> None:
    """Two schedulers on one root: each slot goes out once, never before slot + offset, whoever leads."""
    schedule = {"spread": every(2, options={"zkbeat_jitter": 1.8})}
    first = make_scheduler(schedule, identity="first")
    root = first.zk_settings.root
    lead(first)
    # Built only now: two candidates made together race for the lowest sequence number.
    second = make_scheduler(schedule, identity="second")
    wait_for(lambda: first.tick() is not None and len(sent.of("spread")) >= 1, timeout=30)
    by_first = len(sent.of("spread"))
    first.close()
    lead(second)
    wait_for(lambda: second.tick() is not None and len(sent.of("spread")) >= by_first + 2, timeout=30)
    rows = sent.of("spread")
    slots = [slot for slot, _, _ in rows]
    assert len(slots) == len(set(slots)), "a slot was published twice"
    for slot, at, _ in rows:
        assert at >= (slot + timedelta(seconds=offset(root, "spread", slot, 1.8))).timestamp()
    for slot in slots:
        entry_first, entry_second = first.schedule["spread"], second.schedule["spread"]
        assert first.jitter.offset_for(entry_first, slot) == second.jitter.offset_for(entry_second, slot)
    assert {h["zkbeat-epoch"] for _, _, h in rows[by_first:]} == {second.election.epoch}


def test_lateness_for_the_misfire_grace_time_counts_from_the_jittered_moment(make_scheduler) -> None:
    """operating.md: "lateness for the misfire grace time counts from the jittered moment". A tick planned at a
    slot whose offset is far beyond the entry's grace is published when its jittered moment has just come, not
    skipped; it is skipped only once it is later than the grace past that moment."""
    jitter, grace = 50.0, 5.0
    options = {"zkbeat_jitter": jitter, "zkbeat_misfire_grace_time": grace}
    scheduler = make_scheduler({"spread": every(60, options=options)})
    lead(scheduler)
    wait_for(lambda: scheduler.tick() is not None and scheduler.term is not None, timeout=15)
    root = scheduler.zk_settings.root
    entry = scheduler.schedule["spread"]
    slot = next(s for s in (SLOT + timedelta(minutes=k) for k in range(1000)) if offset(root, "spread", s, jitter) > 20)
    moment = slot + timedelta(seconds=offset(root, "spread", slot, jitter))
    assert scheduler.term._decide(entry, slot, moment + timedelta(seconds=1))[0].skip is False
    assert scheduler.term._decide(entry, slot, moment + timedelta(seconds=grace + 1))[0].skip is True

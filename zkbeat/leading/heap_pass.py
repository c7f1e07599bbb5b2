"""A leader's pass over beat's heap: one tick's planning, top to bottom.

:meth:`HeapPass._lead_pass` is the whole of it, in order: settle the claims
an earlier term left pending, check the schedule's own last runs against
the clock, run the run-now requests, rebuild the heap if the schedule
changed, read the clock once, pop what is due (up to MAX_BATCH, each asked
``is_due()`` and its jitter), hand those to the term (which plans each
tick's policy, claims them in fenced parts and publishes what committed,
the next part's claim on its way meanwhile: zkbeat.leading.term), and put everything back on the heap by
when it was due.

A mixin of the scheduler (``zkbeat.LeaderScheduleMixin``): beat's heap is
the scheduler's (its current shard's), and an entry's time is asked the way
Celery asks it (``is_due``, ``_when``).
"""

from __future__ import annotations

import heapq
import logging
import time
from datetime import datetime
from typing import Any, NamedTuple

from celery import beat

from .._collector import no_collection
from ..ticking.ticks import delay_to_slot
from .term import RETRY_DELAY, Due, Requeue

__all__ = ["HEAP_LAG", "HeapPass", "MAX_BATCH"]

logger = logging.getLogger("zkbeat.scheduler")

#: Due entries claimed (and then published) per pass of the beat loop: the
#: shutdown signals are held for one pass's claims and sends, and the heap is
#: looked at again between passes. A pass claims in parts
#: (zkbeat.leading.term.CLAIM_PART); a kill -9 while a part is being sent loses
#: its unsent ticks and those of the part claimed meanwhile.
MAX_BATCH = 1000

#: How long after its due moment beat's heap holds an entry (see :meth:`HeapPass.adjust`).
HEAP_LAG = 0.001


class Answer(NamedTuple):
    """An entry's ``is_due()`` answer as a pass asks it (:meth:`HeapPass.ask`)."""

    is_due: bool
    next_time: float
    #: Answered on the entry's own clock, read as it was asked, not on the pass's reading (taken earlier): its wait
    #: counts from the moment of the answer (see HeapPass._push).
    own_clock: bool


class HeapPass:
    """A leader's pass over beat's heap: see the module docstring."""

    #: The entry the host's is_due said it answered from the pass's reading (:meth:`answered_from_reading`), in the
    #: ask under way; None outside one.
    _from_reading: beat.ScheduleEntry | None = None

    def adjust(self, n: Any, drift: float | None = None) -> Any:
        """Beat's heap time of an entry due in ``n`` seconds: ``HEAP_LAG`` after its due moment, not before.

        Celery's ``adjust`` puts it 10 ms before (its own tick then spins on
        the top entry until it is due). A leader's pass asks every entry the
        heap says has come due: woken 10 ms early it asked each one, heard
        "not yet", put it back due at once and woke again, pass after pass
        for those 10 ms (in a burst of 10,000, a scan of them all before the
        first was published).
        """
        if n and n > 0:
            return n + (HEAP_LAG if drift is None else drift)  # read when called: the module's value, if changed
        return n

    def _lead(self) -> float:
        """Pop every due entry (up to MAX_BATCH), let the term run them, push them back.

        The pass reads the clock once for the entries that go by the app's
        clock (zkbeat.ticking.passclock); the wait until the next pass is counted
        from the clock after it.
        """
        self.pass_clock.start()
        try:
            with no_collection():  # zkbeat._collector: a full collection walks the whole schedule
                interval = self._lead_pass()
        finally:
            self.pass_clock.stop()
        if interval is not None:
            return interval
        top = self._heap[0]
        return max(0.0, min(top[0] - self._when_safe(top[2], 0), self.max_interval))

    def _lead_pass(self) -> float | None:
        """The pass of :meth:`_lead`; None: wait until the top of the heap comes due."""
        term = self.term
        assert term is not None
        term.new_pass()
        if term.pending:
            term.settle()
        if not term.own_runs_checked and term.check_own_runs():
            self._heap = None
        if term.triggers is not None:
            requests = term.triggers.take()
            if self.sharded:
                # Another shard's requests are left for its leader (its own inbox reads them).
                requests = [request for request in requests if self.in_shard(request.entry)]
            term.run_manual(requests)
        if self._heap is None or not self.schedules_equal(self.old_schedulers, self.schedule):
            self.old_schedulers = dict(self.schedule)
            self.policies.forget()  # the schedule changed: its options are read again
            self.populate_heap()
            batch = term.publisher.batch
            if batch is not None:
                batch.forget_except(self.schedule)  # prepared messages of entries that left the schedule
        heap = self._heap
        if not heap:
            return self.max_interval
        looked_at = time.monotonic()
        self.pass_clock.start()  # the moment the pass looks at the heap (the heap's rebuild took time)
        dues, later = self._scan(heap)
        if dues:
            later.extend(term.run(dues))
        if self._heap is None:
            return 0  # the pass replaced the schedule's entries: rebuild the heap now, not after a sleep
        self._push(later, since=looked_at)
        self._note_advanced(dues)
        if len(dues) >= MAX_BATCH:
            return 0
        if not self._heap:
            return self.max_interval
        return None

    def _note_advanced(self, dues: list[Due]) -> None:
        """The pass's own advances are no change of the schedule: the next pass need not rebuild the heap for them.

        Each entry the pass ran was replaced by its successor (``reserve()``);
        where the copy beat compares against still holds the entry the pass
        began with, it now holds the successor, and :meth:`schedules_equal`
        passes over it by identity.
        """
        old, schedule = self.old_schedulers, self.schedule
        if old is None:
            return
        for due in dues:
            name = due.entry.name
            if old.get(name) is due.entry:
                successor = schedule.get(name)
                if successor is not None:
                    old[name] = successor

    def _idle(self, interval: float) -> float:
        """Wait out ``interval`` here, woken by a trigger request (zkbeat.ledger.controls), then come straight back.

        Beat's own sleep cannot be woken; the follower's tick waits the same way.
        """
        term = self.term
        if interval <= 0 or term is None or term.triggers is None or not self.wait_in_tick:
            return interval
        term.triggers.wait(interval)
        return 0

    def _scan(self, heap: list) -> tuple[list[Due], list[Requeue]]:
        """Pop the entries whose time has come; sort them into due and not due yet."""
        dues: list[Due] = []
        later: list[Requeue] = []
        monotonic = time.monotonic
        while heap and len(dues) < MAX_BATCH:
            event = heap[0]
            entry = event[2]
            if event[0] > self._when_safe(entry, 0):
                break
            heapq.heappop(heap)
            is_due, next_time, own_clock = self.ask(entry)
            asked = monotonic() if own_clock else None  # see _push
            try:
                wait = self.jitter.wait(entry, self.pass_clock.now()) if is_due else 0.0
            except Exception:  # noqa: BLE001 - options it cannot read (a list): the term's plan logs it and leaves it out
                wait = 0.0
            if wait > 0:
                later.append(Requeue(entry, event[1], wait))  # due, but its jittered moment is still ahead
            elif is_due:
                dues.append(Due(entry, event[1], next_time, asked))
            else:
                later.append(Requeue(entry, event[1], next_time, asked))
        return dues, later

    def _push(self, requeue: list[Requeue], since: float | None = None) -> None:
        """Put entries back on beat's heap, each ``delay`` after ``since`` (monotonic; default now).

        The delays were worked out when the pass looked at the heap; counted
        from the end of a batch that took seconds to send, each entry would
        come due that much late, and later again every round. A host's own
        ``_when`` (a subclass's: its heap may count on a clock of its own)
        places every entry, as in :meth:`_when_safe` and :meth:`heap_time`.
        """
        heap = self._heap
        if heap is None:
            return  # rebuilt from the schedule at the next pass
        clock = None if type(self)._when is not beat.Scheduler._when else self.pass_clock
        for item in requeue:
            delay = _wait(item.delay, self.max_interval)
            if delay != delay:  # NaN (a custom schedule's next look): no time is past it, the entry would sink
                delay = self.max_interval
            if item.asked is not None:
                # The wait was counted on the entry's own clock, read then (its is_due; reserve() for an
                # interval's successor): from that moment, not the pass's reading, which came earlier. From
                # the reading, an entry asked late in a long pass (a burst: seconds) would come back early,
                # be asked again in vain, and a burst of crontabs or database rows would ask each twice.
                # Where the pass's reading is of the entry's clock, it is moved on to that moment (no
                # clock read per entry: 10,000 rows' clock each pass); otherwise the entry's clock is read
                # now, less the time since, counted up to that very read (each entry's own clock is read
                # in turn: counted to the start of this put-back, the later ones would be placed late).
                when = None if clock is None else clock.when_from(item.entry, self.adjust(delay), item.asked)
                if when is None:
                    when = self._when_real(item.entry, delay)
                    when -= max(0.0, time.monotonic() - item.asked)
            else:
                when = None if clock is None or since is None else clock.when(item.entry, self.adjust(delay))
                if when is None:  # the entry's own clock, read now: less the time since the pass looked
                    when = self._when_safe(item.entry, delay)
                    when -= 0.0 if since is None else max(0.0, time.monotonic() - since)
            heapq.heappush(heap, beat.event_t(when, item.priority, item.entry))

    def ask(self, entry: beat.ScheduleEntry) -> Answer:
        """``entry.is_due()``, and whether its own clock answered; an entry whose schedule raises (or answers a due
        that is no truth value) is logged once and left out.

        It is asked again every ``max_interval`` (a fixed row or a clock that
        moved on may cure it), and logged again only when its error changes.
        Celery's own scheduler does the same only from 5.7 on. Not due with
        no time left (0, less, NaN: a custom schedule's answer) is asked again
        after RETRY_DELAY, not at once in every pass. Before Celery
        5.5 a crontab's wait ends at its slot, not an hour past it across the
        spring-forward jump (ticks.delay_to_slot). A wait that is no int or
        float, or past any float (None, a Decimal, 10**400), is beat's max
        interval: the term and the heap count only in floats.
        """
        own_clock = True
        try:
            answer = self.pass_clock.is_due(entry) if type(self).is_due is beat.Scheduler.is_due else None
            own_clock = answer is None
            if own_clock:
                self._from_reading = None
                try:
                    answer = self.is_due(entry)
                    # A host's is_due may answer from the pass's reading (zkbeat.contrib.django's interval rows): it
                    # says so by answered_from_reading, which a subclass's is_due handing the answer on keeps.
                    own_clock = self._from_reading is not entry
                finally:
                    self._from_reading = None
            is_due, next_time = answer
            # Its truth test is the schedule's too: an answer that cannot say (numpy's array of several, a
            # __bool__ that raises) would raise below, out of the pass, and in every pass after.
            is_due = bool(is_due)
        except Exception as exc:  # noqa: BLE001 - one broken entry must not stop the rest
            self.leave_out(entry, exc, "schedule")
            return Answer(False, self.max_interval, own_clock)
        if self._broken.pop((entry.name, "schedule"), None) is not None:
            logger.info("zkbeat: %s is scheduled again", entry.name)
            self.metrics.left_out(len({name for name, _ in self._broken}))
        if not is_due and not _time_left(next_time):
            # Not due with no time left (a custom schedule's 0, less, NaN): placed at once, it would be popped and
            # asked in every pass, each returning 0 (beat's loop spinning). Asked again after RETRY_DELAY instead.
            return Answer(False, min(RETRY_DELAY, self.max_interval), own_clock)
        return Answer(is_due, delay_to_slot(entry, is_due, _wait(next_time, self.max_interval)), own_clock)

    def answered_from_reading(self, entry: beat.ScheduleEntry) -> None:
        """The host's ``is_due`` answers ``entry`` from the pass's reading, not its own clock (see :meth:`ask`)."""
        self._from_reading = entry

    def leave_out(self, entry: beat.ScheduleEntry, exc: BaseException, what: str = "entry") -> None:
        """Log (once per distinct error) that ``entry`` cannot run now; the caller leaves it out.

        Its schedule raised, its clock raised, or its name cannot be a znode.
        It is tried again every ``max_interval``. An error whose repr raises
        too (it holds an object that cannot print) is named by its class.
        """
        try:
            text = repr(exc)
        except Exception:  # noqa: BLE001 - raised here, it would end the pass that is leaving the entry out
            text = f"{type(exc).__name__} (its repr raised)"
        if self._broken.get((entry.name, what)) == text:
            return
        self._broken[(entry.name, what)] = text
        self.metrics.left_out(len({name for name, _ in self._broken}))
        logger.error(
            "zkbeat: leaving out %r: it cannot be scheduled (%s); trying again every %gs",
            entry.name,
            text,
            self.max_interval,
            exc_info=not isinstance(exc, (ValueError, TypeError)),
        )

    def reserve_reading(self, entry: beat.ScheduleEntry) -> datetime | None:
        """The pass's clock reading that reserve() gives ``entry``'s successor as its last run; None: Celery's
        ``reserve`` decides (an entry class with its own ``__next__``, a clock the pass does not read)."""
        return self.pass_clock.now_for(entry) if type(entry).__next__ is beat.ScheduleEntry.__next__ else None

    def reserved_at_reading(self, successor: beat.ScheduleEntry) -> bool:
        """Whether reserve() gave ``successor`` the pass's clock reading as its last run.

        As it did, not as it would: a subclass's reserve() that makes the
        successor itself (Celery's own, at the clock of that moment) did not,
        and its successor's next wait counts from when it was made.
        """
        reading = self.reserve_reading(successor)
        if reading is None:
            return False
        try:
            return bool(successor.last_run_at == reading)
        except Exception:  # noqa: BLE001 - a last run that is no time (or a naive one): not the reading
            return False

    def heap_time(self, entry: beat.ScheduleEntry, answer: Answer) -> float:
        """Beat's heap time of ``entry`` as :meth:`ask` just answered: its due moment, counted from that answer."""
        delay = 0 if answer.is_due else answer.next_time
        if not answer.own_clock:
            return self._when_safe(entry, delay)
        try:  # the pass's reading moved on to now, where it is the entry's clock (see _push)
            when = self.pass_clock.when_from(entry, self.adjust(delay), time.monotonic())
        except Exception:  # noqa: BLE001 - a wait that is no number: Celery's own, guarded
            when = None
        return self._when_real(entry, delay) if when is None or type(self)._when is not beat.Scheduler._when else when

    def _when_real(self, entry: beat.ScheduleEntry, delay: float) -> float:
        """Celery's ``_when`` on the entry's own clock, read now (not the pass's reading)."""
        try:
            return _heap_float(self._when(entry, delay))
        except Exception:  # noqa: BLE001 - the entry's own clock (its nowfun, its zone) or its wait failed
            return time.time() + _wait(delay, self.max_interval)

    def _when_safe(self, entry: beat.ScheduleEntry, delay: float) -> float:
        """Celery's ``_when`` (the heap's timestamp); now plus the delay if the entry cannot say."""
        try:
            when = self.pass_clock.when(entry, self.adjust(delay)) if type(self)._when is beat.Scheduler._when else None
            return _heap_float(self._when(entry, delay)) if when is None else when
        except Exception:  # noqa: BLE001 - the entry's own clock (its nowfun, its zone) failed
            return time.time() + _wait(delay, self.max_interval)


def _heap_float(when: Any) -> float:
    """A ``_when`` answer as a heap time: a float (None is 0, as Celery takes it); raises for one that is no time.

    A host's own ``_when`` may answer a Decimal, or NaN: beside the pass's
    floats on one heap, the one raised at every subtraction, the other sank
    below every entry (no time is past NaN).
    """
    when = float(when or 0)
    if when != when:
        raise ValueError("a heap time that is NaN")
    return when


def _wait(seconds: Any, default: float) -> float:
    """A wait in seconds as a float: an int or a float (NaN too: its callers place it); anything else ``default``.

    None, a Decimal (whose NaN refuses ``<``), an int past any float
    (10**400, which the heap's arithmetic refuses): no wait to count.
    """
    if isinstance(seconds, (int, float)):
        try:
            return float(seconds)
        except OverflowError:
            pass
    return default


def _time_left(seconds: Any) -> bool:
    """Whether a not-due answer's wait is a time to wait: a number above 0 (None: beat's max interval, as ever)."""
    if seconds is None:
        return True
    try:
        return bool(seconds > 0)
    except Exception:  # noqa: BLE001 - TypeError, or a Decimal NaN's InvalidOperation: one entry stops no pass
        return True  # not a number: _push waits max_interval for it, as before

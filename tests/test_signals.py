"""hold_shutdown_signals: a SIGTERM inside the held stretch waits for its end; and celery beat's own
SIGTERM handler, which closes the scheduler from inside the signal, cannot hang it."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator

import pytest
from celery import beat

from tests.support.helpers import every, lead
from tests.support.signals import close_under_a_second_sigterm
from zkbeat.leading._signals import hold_shutdown_signals


class Stop(Exception):
    pass


def test_sigterm_inside_is_delivered_after_the_block() -> None:
    """The handler does not run inside the block, runs once right after it, and is restored."""
    calls: list[str] = []

    def handler(signum, frame):
        calls.append("handler")
        raise Stop

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        with pytest.raises(Stop):
            with hold_shutdown_signals():
                os.kill(os.getpid(), signal.SIGTERM)
                os.kill(os.getpid(), signal.SIGTERM)
                calls.append("rest of the block")
        assert calls == ["rest of the block", "handler"]
        assert signal.getsignal(signal.SIGTERM) is handler
    finally:
        signal.signal(signal.SIGTERM, previous)


class Exiting:
    """A SIGTERM handler that raises, as celery beat's does, and counts its calls."""

    def __init__(self) -> None:
        self.calls: list[int] = []

    def __call__(self, signum: int, frame: object) -> None:
        self.calls.append(signum)
        raise Stop


@pytest.fixture
def exiting() -> Iterator[Exiting]:
    handler = Exiting()
    previous = {signum: signal.getsignal(signum) for signum in (signal.SIGTERM, signal.SIGINT)}
    signal.signal(signal.SIGTERM, handler)
    yield handler
    for signum, old in previous.items():
        signal.signal(signum, old)


def _held_until_the_limit_timer(on_its_way: threading.Event) -> None:
    with hold_shutdown_signals(limit=0.2):
        os.kill(os.getpid(), signal.SIGTERM)
        assert on_its_way.wait(timeout=10), "the limit timer did not fire"


def test_a_limit_timer_caught_mid_send_as_the_block_ends_delivers_once(
    monkeypatch: pytest.MonkeyPatch, exiting: Exiting
) -> None:
    """The timer that re-sends a held signal at the limit is sending just as the block ends (a hung send
    returned at that moment): the handler runs once, and every handler is back."""
    on_its_way = threading.Event()
    send = signal.pthread_kill

    def stalled_send(thread_id: int, signum: int) -> None:
        on_its_way.set()
        time.sleep(0.5)  # the block ends meanwhile
        send(thread_id, signum)

    monkeypatch.setattr(signal, "pthread_kill", stalled_send)
    # What SIGINT had before (Python's default_int_handler; SIG_IGN in an xdist worker).
    sigint = signal.getsignal(signal.SIGINT)
    with pytest.raises(Stop):
        _held_until_the_limit_timer(on_its_way)
    time.sleep(0.5)  # room for a second delivery
    assert exiting.calls == [signal.SIGTERM]
    assert signal.getsignal(signal.SIGTERM) is exiting
    assert signal.getsignal(signal.SIGINT) is sigint, "a recorder was left installed"


def test_a_limit_timer_that_fires_as_the_block_ends_sends_nothing(
    monkeypatch: pytest.MonkeyPatch, exiting: Exiting
) -> None:
    """A timer past its wait when the block ends (too late to cancel) finds the block over and sends nothing."""
    on_its_way, block_over = threading.Event(), threading.Event()

    class LateTimer(threading.Timer):
        def run(self) -> None:
            self.finished.wait(self.interval)
            on_its_way.set()
            block_over.wait(10)
            self.function(*self.args, **self.kwargs)  # as one already past its check: cancel() came too late

    monkeypatch.setattr(threading, "Timer", LateTimer)
    with pytest.raises(Stop):
        _held_until_the_limit_timer(on_its_way)
    block_over.set()
    time.sleep(0.5)  # room for a second delivery
    assert exiting.calls == [signal.SIGTERM]


def test_nothing_pending_means_nothing_delivered() -> None:
    """Without a signal the block leaves handlers as they were and raises nothing."""
    before = signal.getsignal(signal.SIGINT)
    with hold_shutdown_signals() as pending:
        pass
    assert pending == []
    assert signal.getsignal(signal.SIGINT) is before


def test_off_the_main_thread_it_stands_aside() -> None:
    """Handlers can only change on the main thread; elsewhere the block is a no-op, not an error."""
    errors: list[BaseException] = []

    def run() -> None:
        try:
            with hold_shutdown_signals() as pending:
                assert pending == []
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    assert errors == []


def test_celery_beats_sigterm_landing_where_close_needs_a_lock_does_not_hang(make_scheduler, zk_client) -> None:
    """celery beat's own SIGTERM handler closes the scheduler from wherever the signal interrupted the main
    thread; landing inside the watchdog's bookkeeping (an Event's lock that close() takes too) must not hang
    it: the handler's SystemExit unwinds first, and Service.start's ``finally`` closes."""
    scheduler = make_scheduler({"tick": every(1)})
    lead(scheduler)
    scheduler.tick()  # beat's loop runs: the lock below is one of its passes'
    candidate = scheduler.election.fence.candidate
    service = beat.Service(app=scheduler.app)
    service.__dict__["scheduler"] = scheduler  # the scheduler Service.start would have built
    held = scheduler.watchdog._changed._cond  # what Event.set() holds in the main thread (watchdog.left())
    stuck: list[bool] = []

    def rescue() -> None:  # only on failure: close() waits for a lock its own thread holds
        stuck.append(True)
        held.release()

    previous = {signum: signal.getsignal(signum) for signum in (signal.SIGTERM, signal.SIGINT)}
    guard = threading.Timer(10, rescue)
    try:
        scheduler.app.Beat().install_sync_handler(service)
        held.acquire()
        guard.start()
        with pytest.raises(SystemExit):
            signal.raise_signal(signal.SIGTERM)
    finally:
        guard.cancel()
        if held._lock.locked() and not stuck:
            held.release()
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    assert not stuck, "close() hung inside celery beat's SIGTERM handler"
    service.sync()  # what Service.start's finally does once the SystemExit reached it
    assert scheduler.closed
    assert zk_client.exists(candidate) is None, "the candidate was not deleted: no graceful handover"


def test_a_sigterm_before_beats_loop_runs_closes_at_once(make_scheduler, zk_client) -> None:
    """Before the first tick, Service.start has no ``finally`` to close later: the handler's close() is the real one."""
    scheduler = make_scheduler({"tick": every(1)})
    lead(scheduler)
    candidate = scheduler.election.fence.candidate
    service = beat.Service(app=scheduler.app)
    service.__dict__["scheduler"] = scheduler
    previous = {signum: signal.getsignal(signum) for signum in (signal.SIGTERM, signal.SIGINT)}
    try:
        scheduler.app.Beat().install_sync_handler(service)
        with pytest.raises(SystemExit):
            signal.raise_signal(signal.SIGTERM)
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    assert scheduler.closed, "nothing else would close it: the SystemExit escapes Service.start before its try"
    assert zk_client.exists(candidate) is None


def test_a_second_sigterm_during_close_waits_until_close_is_done(
    make_scheduler, zk_client, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A second signal (a double Ctrl-C) while close() runs goes through only once it is done."""
    scheduler = make_scheduler({"tick": every(1)})
    lead(scheduler)
    scheduler.tick()
    candidate = scheduler.election.fence.candidate
    release = scheduler._release_pending

    def signal_during_close(final: bool = False) -> None:
        signal.raise_signal(signal.SIGTERM)  # arrives halfway through close()
        release(final)

    monkeypatch.setattr(scheduler, "_release_pending", signal_during_close)
    close_under_a_second_sigterm(scheduler)
    assert zk_client.exists(candidate) is None, "close() was cut short: the candidate was left behind"
    assert scheduler.zk_client is None or not scheduler.zk_client.connected

"""hold_shutdown_signals: a SIGTERM inside the held stretch waits for its end; and celery beat's own
SIGTERM handler, which closes the scheduler from inside the signal, cannot hang it."""

from __future__ import annotations

import os
import signal
import threading

import pytest
from celery import beat

from tests.support.helpers import every, lead
from zkbeat._signals import hold_shutdown_signals


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


def test_the_limit_timer_firing_as_the_block_ends_delivers_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """The timer that re-sends a held signal at the limit can be on its way just as the block ends
    (a hung send that returned at that moment): the handler still runs once, not twice."""
    calls: list[int] = []
    on_its_way, block_left = threading.Event(), threading.Event()
    send = signal.pthread_kill

    def late_send(thread_id: int, signum: int) -> None:  # the timer, stalled between firing and sending
        on_its_way.set()
        block_left.wait(timeout=1)
        send(thread_id, signum)

    def handler(signum: int, frame: object) -> None:
        calls.append(signum)

    monkeypatch.setattr(signal, "pthread_kill", late_send)
    previous = signal.signal(signal.SIGTERM, handler)
    try:
        with hold_shutdown_signals(limit=0.2):
            os.kill(os.getpid(), signal.SIGTERM)
            assert on_its_way.wait(timeout=10), "the limit timer did not fire"
        block_left.set()
        threading.Event().wait(0.5)  # room for a late signal to arrive and be handled
        assert calls == [signal.SIGTERM]
        assert signal.getsignal(signal.SIGTERM) is handler, "the handler was not restored"
    finally:
        signal.signal(signal.SIGTERM, previous)


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

    class Terminated(BaseException):
        pass

    def on_sigterm(signum, frame):
        raise Terminated

    previous = signal.signal(signal.SIGTERM, on_sigterm)
    try:
        with pytest.raises(Terminated):
            scheduler.close()
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert zk_client.exists(candidate) is None, "close() was cut short: the candidate was left behind"
    assert scheduler.zk_client is None or not scheduler.zk_client.connected

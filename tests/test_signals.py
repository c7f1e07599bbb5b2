"""hold_shutdown_signals: a SIGTERM inside the held stretch waits for its end."""

from __future__ import annotations

import os
import signal
import threading

import pytest

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

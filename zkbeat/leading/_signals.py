"""Hold beat's shutdown signals over a stretch that must not be cut in two."""

from __future__ import annotations

import signal
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["hold_shutdown_signals", "inside_shutdown_handler", "shutdown_signal_handled"]

SHUTDOWN_SIGNALS = (signal.SIGTERM, signal.SIGINT)


@contextmanager
def hold_shutdown_signals(
    signums: tuple[signal.Signals, ...] = SHUTDOWN_SIGNALS, limit: float | None = None
) -> Iterator[list[int]]:
    """Record SIGTERM/SIGINT inside the block and deliver them right after it.

    celery beat handles SIGTERM by raising SystemExit from wherever the main
    thread is. Between the ledger commit and the publish that would leave a
    tick recorded as run that was never sent, and the next leader would skip
    it. Blocking the signals with a mask would not work: the process-wide
    signal then lands on one of kazoo's threads and Python still runs the
    handler in the main thread. So the handlers are swapped for a recorder,
    and the recorded signals are raised again once the old handlers are back.

    Off the main thread (where handlers cannot be changed) this does nothing.

    ``limit`` bounds the hold: a signal that arrives once the block has run
    that many seconds (a send hung on a broker that went silent) is handed
    to the old handler at once, which raises in the middle of the block.
    """
    if threading.current_thread() is not threading.main_thread():
        yield []
        return
    pending: list[int] = []
    started = time.monotonic()
    timers: list[threading.Timer] = []
    armed = False  # one timer per block, even if a second signal lands while the first arms it
    # The timer sends only under this lock and only before the block ends: a
    # signal it sent later would reach the restored handler on top of the one
    # re-raised below, and celery beat's would exit twice.
    ending = threading.Lock()
    ended = False

    def come_round(signum: int) -> None:
        with ending:
            if not ended:
                signal.pthread_kill(threading.main_thread().ident, signum)

    def record(signum: int, frame: object) -> None:
        nonlocal armed
        pending.append(signum)
        if limit is None or ended:  # once ended, the re-raise below delivers it
            return
        left = limit - (time.monotonic() - started)
        if left > 0:
            if not armed:  # when the limit passes, the signal comes round again and goes through
                armed = True
                timer = threading.Timer(left, come_round, (signum,))
                timer.daemon = True
                timers.append(timer)
                timer.start()
            return
        held = list(dict.fromkeys(pending))
        pending.clear()  # delivered now, not again after the block
        for each in held:
            handler = previous[each]
            if callable(handler):
                handler(each, frame)
            elif handler in (signal.SIG_DFL, None):
                signal.signal(each, signal.SIG_DFL)
                signal.raise_signal(each)

    previous: dict[int, object] = {}
    try:
        for signum in signums:
            previous[signum] = signal.signal(signum, record)
        yield pending
    finally:
        # Handlers run on this thread only, so from here ``record`` only
        # records; a send the timer has begun lands while we wait for it.
        ended = True
        with ending:
            pass
        for timer in timers:
            timer.cancel()
        _restore(previous)
        for signum in dict.fromkeys(pending):
            signal.raise_signal(signum)


def _restore(previous: dict[int, object]) -> None:
    """Put every handler back, even if one that is back already runs and raises.

    ``signal.signal`` first runs the handlers of signals that are pending, and
    raises what they raise before it changes anything; that must not leave the
    recorder installed for the other signal (its Ctrl-C would be swallowed).
    """
    error: BaseException | None = None
    for signum, handler in previous.items():
        while True:
            try:
                signal.signal(signum, signal.SIG_DFL if handler is None else handler)  # type: ignore[arg-type]
                break
            except BaseException as exc:  # noqa: BLE001 - re-raised once every handler is back
                error = error or exc
    if error is not None:
        raise error


def inside_shutdown_handler() -> bool:
    """Whether the caller runs inside the Python handler of SIGTERM or SIGINT (on the main thread).

    celery beat's handler calls the scheduler's ``close()`` right there, in
    the middle of whatever the main thread was doing: maybe holding a lock
    that ``close()`` needs too (a ``threading.Event``'s, set on every leader
    pass), which would then never be released, and the process would hang
    instead of exiting. The handler raises SystemExit once ``close()``
    returns, and that unwinds to ``Service.start``, whose ``finally`` closes
    again with every lock released: so ``close()`` waits for that call.
    Python cannot say whether a handler is running; a frame of the handler
    installed for either signal on the caller's stack is the sign.
    """
    return shutdown_signal_handled() is not None


def shutdown_signal_handled() -> int | None:
    """The signal (SIGTERM or SIGINT) whose Python handler the caller runs inside, or None.

    See :func:`inside_shutdown_handler`; the number is the handler's first
    argument, as Python passes it to every handler.
    """
    if threading.current_thread() is not threading.main_thread():
        return None
    codes = {getattr(signal.getsignal(signum), "__code__", None) for signum in SHUTDOWN_SIGNALS} - {None}
    frame = sys._getframe(1)
    while frame is not None:
        code = frame.f_code
        if code in codes:
            signum = frame.f_locals.get(code.co_varnames[0]) if code.co_argcount else None
            return int(signum) if isinstance(signum, int) else signal.SIGTERM
        frame = frame.f_back
    return None

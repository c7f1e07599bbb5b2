"""The watchdog: a leader whose loop stopped turning gives up its lead.

Leadership follows the ZooKeeper session, which kazoo's own thread keeps
alive, not beat's loop. A leader blocked in a publish to a black-holed
broker, a hung database query or a deadlock would keep leading while
publishing nothing. So the scheduler marks the start and end of each leader
pass (``entered``/``left``), and a small thread steps the replica down when a
pass has run longer than ``zkbeat_stall_timeout``, logging the stack of the
thread that is stuck. The replica stays out of line (``step_down(hold=True)``)
until its loop turns again (``turned``, at ``tick()``'s entry), so a loop that
is still stuck never leads again.

Only time inside a leader pass counts: a follower's ``tick()`` legitimately
blocks up to ``max_interval`` waiting for leadership, and beat sleeps between
passes. What the stuck pass had claimed is safe either way: its claims
committed before the stall, so a tick it sends late is still that tick,
once, and one it never sends is logged as not published by the term.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
import traceback
from collections.abc import Callable

__all__ = ["Watchdog"]

logger = logging.getLogger(__name__)


class Watchdog:
    """Steps a replica down when one leader pass runs past ``timeout`` seconds.

    ``step_down`` is called on the watchdog's thread (it must not block: the
    election's ``step_down(hold=True)`` only flips state); ``resume`` from
    the loop's thread when it turns again.
    """

    def __init__(
        self,
        timeout: float,
        step_down: Callable[[], None],
        resume: Callable[[], None],
        *,
        describe: Callable[[], str] = lambda: "",
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.timeout = timeout
        self._step_down = step_down
        self._resume = resume
        self._describe = describe
        self._clock = clock
        self._lock = threading.Lock()
        #: (monotonic start, thread ident) of the leader pass under way, or None.
        self._pass: tuple[float, int] | None = None
        self._fired = False
        self._stop = threading.Event()
        #: Set when a pass begins or ends, so the thread sleeps until the exact deadline.
        self._changed = threading.Event()
        self._thread: threading.Thread | None = None
        #: How many times it stepped the replica down (for tests and status).
        self.stalls = 0

    def start(self) -> Watchdog:
        self._thread = threading.Thread(target=self._run, name="zkbeat-watchdog", daemon=True)
        self._thread.start()
        return self

    def close(self) -> None:
        self._stop.set()
        self._changed.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(2.0)

    # -- the loop's side -----------------------------------------------------

    def turned(self) -> None:
        """The loop reached ``tick()`` again: a replica held out of line may contend again."""
        with self._lock:
            fired, self._fired = self._fired, False
        if fired:
            logger.info("zkbeat: the beat loop turns again; rejoining the election")
            self._resume()

    def entered(self) -> None:
        """A leader pass begins on the calling thread."""
        with self._lock:
            self._pass = (self._clock(), threading.get_ident())
        self._changed.set()

    def progressed(self) -> None:
        """A stage of a long leader pass on the calling thread finished: its stall clock starts again.

        For hosts whose leader work has stages of its own (a database
        scheduler reading 100,000 rows at a takeover): each stage must finish
        within the timeout, not the whole pass. Outside a pass, or from
        another thread, it does nothing.
        """
        with self._lock:
            current = self._pass
            if current is None or current[1] != threading.get_ident():
                return
            self._pass = (self._clock(), current[1])
        self._changed.set()

    def left(self) -> None:
        """The leader pass ended (returned or raised)."""
        with self._lock:
            self._pass = None
        self._changed.set()

    # -- the watchdog's thread -----------------------------------------------

    def check(self) -> bool:
        """Step down if the pass under way is past the timeout; True if it did (once per pass)."""
        with self._lock:
            current, fired = self._pass, self._fired
            if current is None or fired or self._clock() - current[0] <= self.timeout:
                return False
            self._fired = True
            # Step down under the lock: a turned() in between would otherwise
            # clear the flag before the hold is set, and nobody would resume.
            try:
                self._step_down()
            except Exception:  # noqa: BLE001 - the watchdog must outlive a failed step-down
                logger.exception("zkbeat: the watchdog could not step down")
        started, ident = current
        self.stalls += 1
        frame = sys._current_frames().get(ident)
        stack = "".join(traceback.format_stack(frame)) if frame is not None else "(the thread is gone)\n"
        logger.error(
            "zkbeat: the beat loop has been inside one leader pass for %.1fs (zkbeat_stall_timeout %gs)%s; "
            "stepping down so that another replica leads, and contending again once the loop turns. "
            "A tick this pass claimed and sends late is still sent once; one it never sends is logged. "
            "The loop is here:\n%s",
            self._clock() - started,
            self.timeout,
            self._describe(),
            stack,
        )
        return True

    def _run(self) -> None:
        """Sleep until the deadline of the pass under way (or a change), then check: no polling."""
        while not self._stop.is_set():
            try:
                with self._lock:
                    current, fired = self._pass, self._fired
                remaining = None if current is None or fired else current[0] + self.timeout - self._clock()
                if remaining is None or remaining > 0:
                    self._changed.wait(None if remaining is None else remaining + 0.005)
                    self._changed.clear()
                    continue
                self.check()
            except Exception:  # noqa: BLE001 - never let the watchdog die
                logger.exception("zkbeat: watchdog check failed")
                self._stop.wait(1.0)

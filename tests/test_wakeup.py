"""zkbeat.leading.wakeup: a sharded replica's one wait, including under libfaketime (where a timed Event.wait hangs)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

from tests.support.processes import ROOT
from tests.test_skew import faketime_env
from zkbeat.leading.wakeup import Wakeup

WAIT_UNDER_FAKETIME = """
import threading, time
from zkbeat.leading.wakeup import Wakeup
wake = Wakeup()
print("timed out", wake.wait(0.2), flush=True)
threading.Thread(target=lambda: (time.sleep(0.2), wake.set())).start()  # a Timer's own wait would hang
print("woken", wake.wait(30), flush=True)
"""


def test_set_wakes_a_waiter_and_clear_lowers_the_flag() -> None:
    """set() from another thread ends wait() with True; after clear() a wait times out with False."""
    wake = Wakeup()
    try:
        threading.Timer(0.1, wake.set).start()
        assert wake.wait(30) is True and wake.is_set()
        assert wake.wait(30) is True, "a raised flag returns at once"
        wake.clear()
        assert not wake.is_set() and wake.wait(0.05) is False
    finally:
        wake.close()
    wake.set()  # closed: nothing happens, and a wait returns at once
    started = time.monotonic()
    assert wake.wait(30) is False
    assert time.monotonic() - started < 30


def test_a_timed_wait_returns_under_a_shifted_clock() -> None:
    """Under libfaketime (the clock-skew tests' replicas) a wait that nobody ends returns at its timeout."""
    done = subprocess.run(
        [sys.executable, "-c", WAIT_UNDER_FAKETIME],
        env={**os.environ, "PYTHONPATH": str(ROOT), **faketime_env(30)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["timed out False", "woken True"], done.stdout + done.stderr

"""zkbeat._collector across processes: a fork inside a hold, and a platform with no fork at all.

The hold registers an at-fork hook when zkbeat is imported. A child forked
while a hold is open in another thread (the dashboard's, a shard's) must
collect as usual, since no block of its own will ever end that hold. On a
platform without fork (Windows: no ``os.fork``, no ``os.register_at_fork``)
there is nothing to register, and importing zkbeat must not fail there.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _python(code: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], env=env, capture_output=True, text=True, timeout=120
    )


def test_zkbeat_imports_where_the_platform_cannot_fork() -> None:
    result = _python(
        """
        import os
        del os.fork, os.register_at_fork  # as on Windows

        import zkbeat.ledger.store  # noqa: F401 - the hold's users: Ledger.load, the leader's pass, the CLI's status
        import zkbeat.ops.cli  # noqa: F401
        import zkbeat.ops.dashboard  # noqa: F401
        import zkbeat.scheduler  # noqa: F401
        from zkbeat._collector import no_collection

        with no_collection():
            pass
        print("imported")
        """
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "imported"


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork on this platform")
def test_a_child_forked_while_another_thread_holds_collections_off_collects() -> None:
    result = _python(
        """
        import gc, os, threading

        from zkbeat._collector import no_collection

        inside, done = threading.Event(), threading.Event()

        def hold():
            with no_collection():
                inside.set()
                done.wait()

        thread = threading.Thread(target=hold)
        thread.start()
        inside.wait()
        assert gc.get_threshold()[0] == 0, "the hold is open"
        pid = os.fork()
        if pid == 0:
            child = [gc.get_threshold()[0]]
            with no_collection():  # a hold of its own, and after it collections as before
                child.append(gc.get_threshold()[0])
            child.append(gc.get_threshold()[0])
            os._exit(0 if child[0] > 0 and child[1] == 0 and child[2] == child[0] else 1)
        _, status = os.waitpid(pid, 0)
        done.set()
        thread.join()
        print(os.waitstatus_to_exitcode(status), gc.get_threshold()[0] > 0)
        """
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["0", "True"]

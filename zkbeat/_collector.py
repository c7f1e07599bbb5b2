"""No cyclic garbage collection while a leader's pass or a large read runs: a full collection walks every object.

A pass of up to 1,000 ticks allocates enough objects (the successors, the
ledger states, the messages) to set off Python's collector dozens of times,
and each full (generation 2) collection walks every object the process
holds: the whole schedule, the term's view of the ledger, the prepared
messages. The number of full collections grows with what a burst allocates
and the cost of each with the schedule's size, so a burst's collections grow
with the square of its size: measured (``python -m bench.inproc burst
--entries 100000``), 9 full collections of ~1.1 s each, a fifth of the
leader's CPU, against 3 of ~0.13 s at 10,000 entries.

While a pass runs the collector is off; it is back on when the pass ends
and runs at its usual thresholds from there (the pass's allocations count
towards its next collection, as they would have). What a pass leaves behind
is freed by reference counting as ever; only garbage in cycles waits until
the pass is over, a pass's worth at most. Where the collector was off
already (the application turned it off), a block leaves it as it was.

The same holds for the other reads that build an object per entry:
``Ledger.load`` (some fifteen containers a znode: a takeover's load of
100,000 entries spent about as long in the collector as in decoding) and
zkbeat.contrib.django's read of the table. None of them makes reference
cycles, so nothing waits for the collector; its one collection of the new
objects afterwards replaces the hundreds during.

The blocks run in several threads (the leader's pass in beat's, a load in
a shard's, or the Django admin's request), and the application may turn
the collector off or on in its own at any time. So a block does not touch
``gc.disable()``/``gc.enable()``, the application's switch, but sets the
first generation's threshold to 0 (no automatic collection, as Python's
documentation says), counted across threads: the first block in sets it,
the last one out puts back the threshold it found. An application's
``gc.disable()`` during a block stays in force after it, its ``gc.enable()``
too; a threshold the application sets during a block is kept.
"""

from __future__ import annotations

import contextlib
import gc
import os
import threading
from collections.abc import Iterator

__all__ = ["no_collection"]

_lock = threading.Lock()
#: Blocks open now, in every thread.
_open = 0
#: The first generation's threshold the first block found (0: collections were off by threshold already).
_found = 0


@contextlib.contextmanager
def no_collection() -> Iterator[None]:
    """No automatic collection for the ``with`` block; afterwards as it was (or as the application set it meanwhile)."""
    global _open, _found
    with _lock:
        if _open == 0:
            _found = gc.get_threshold()[0]
            if _found:
                gc.set_threshold(0)
        _open += 1
    try:
        yield
    finally:
        with _lock:
            _open = max(_open - 1, 0)  # 0 at most once too many: a child forked inside a block (below)
            # Put back only what a block changed: a threshold the application set meanwhile stays.
            if _open == 0 and _found and gc.get_threshold()[0] == 0:
                gc.set_threshold(_found)


def _forked() -> None:
    """A child forked while a block was open (in this thread or another): collections as found, nothing held."""
    global _lock, _open
    _lock = threading.Lock()  # another thread may have held it at the fork
    if _open and _found and gc.get_threshold()[0] == 0:
        gc.set_threshold(_found)
    _open = 0


if hasattr(os, "register_at_fork"):  # not where processes cannot fork (Windows): nothing to reset there
    os.register_at_fork(after_in_child=_forked)

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
already (the application turned it off, or another such block holds it
off), a block leaves it as it was.

The same holds for the other reads that build an object per entry:
``Ledger.load`` (some fifteen containers a znode: a takeover's load of
100,000 entries spent about as long in the collector as in decoding) and
zkbeat.contrib.django's read of the table. None of them makes reference
cycles, so nothing waits for the collector; its one collection of the new
objects afterwards replaces the hundreds during. Two blocks at once in two
threads: the first to end turns it back on, the other runs on with it on.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator

__all__ = ["no_collection"]


@contextlib.contextmanager
def no_collection() -> Iterator[None]:
    """The collector off for the ``with`` block, back on after it if it was on before."""
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()

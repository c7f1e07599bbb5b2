"""What a takeover's ``Ledger.load`` costs: N entries with 10 recent runs each, loaded five times.

``python -m bench.ledger_load [N]`` (default 100,000) against a private
standalone ZooKeeper (1 GB heap: 100,000 entries of 852 bytes do not fit the
tests' 256 MB). Prints the medians of the load's wall time and of the
loading thread's CPU (``time.thread_time()``: the decoding and the garbage
collections it starts; kazoo's reader thread is apart). The machine's load
moves the wall time, the CPU time much less. docs/performance.md's figures
of the ledger's decoding come from it.
"""

from __future__ import annotations

import statistics
import sys
import time

from kazoo.client import KazooClient

from bench.ledger_cost import _states
from tests.support.servers import ZooKeeperServer
from zkbeat.ledger.store import ABSENT, Claim, Ledger

ROUNDS = 5
#: Entries per claim while the ledger is filled (each claim is one or more transactions).
_FILL = 5000


def main(argv: list[str]) -> None:
    entries = int(argv[0]) if argv else 100_000
    _, state = _states()
    with ZooKeeperServer(heap_mb=1024) as zk:
        client = KazooClient(zk.hosts)
        client.start(15)
        try:
            ledger = Ledger(client, "/bench/load", timeout=120)
            ledger.ensure()
            candidate = "/bench/load/v1/election/candidate-x-0000000001"
            fence = client.create(candidate, b"{}", ephemeral=True, makepath=True)
            names = [f"entry-{i:06d}" for i in range(entries)]
            for start in range(0, entries, _FILL):
                claims = [Claim(name, state, ABSENT) for name in names[start : start + _FILL]]
                assert ledger.claim(claims, fence).error is None
            walls, cpus = [], []
            for _ in range(ROUNDS):
                started, cpu = time.perf_counter(), time.thread_time()
                loaded = ledger.load()
                cpus.append(time.thread_time() - cpu)
                walls.append(time.perf_counter() - started)
                assert len(loaded) == entries
                del loaded
        finally:
            client.stop()
            client.close()
    print(
        f"load of {entries} entries with 10 recent runs each: median {statistics.median(walls):.3f} s, "
        f"the loading thread's CPU {statistics.median(cpus):.3f} s ({statistics.median(walls) / entries * 1e6:.0f} µs "
        "a znode)"
    )


if __name__ == "__main__":
    main(sys.argv[1:])

"""What recent runs cost the ledger: ``Ledger.claim`` and ``Ledger.load`` of N entries, with none and with 10 each.

``python -m bench.ledger_cost [N]`` (default 3,000) against a private
standalone ZooKeeper (the tests' server, 256 MB heap); five rounds each,
medians printed. docs/operating.md's table of what recent runs cost comes
from ``python -m bench.ledger_cost 3000`` and ``... 10000``.
"""

from __future__ import annotations

import statistics
import sys
import time
from dataclasses import replace
from datetime import datetime, timedelta, timezone

from kazoo.client import KazooClient

from tests.support.servers import ZooKeeperServer
from zkbeat.ledger.history import Run, add_run
from zkbeat.ledger.store import ABSENT, Claim, EntryState, Ledger, encode_state

ROUNDS = 5


def _states() -> tuple[EntryState, EntryState]:
    """An entry's state without recent runs, and the same with 10."""
    now = datetime.now(timezone.utc)
    runs: tuple = ()
    for i in range(10):
        at = now + timedelta(seconds=i)
        runs = add_run(runs, Run.of(at, at + timedelta(milliseconds=3), "worker-3.example.com:4242", 12, "scheduled"))
    base = EntryState(last_run_at=now, total_run_count=5, epoch=12, updated_at=now, slot=now)
    return base, replace(base, recent=runs)


def measure(client: KazooClient, label: str, state: EntryState, entries: int) -> str:
    """Claim every entry ROUNDS times and load the ledger ROUNDS times; one line of medians."""
    root = f"/bench/{label.replace(' ', '_')}"
    ledger = Ledger(client, root, timeout=60)
    ledger.ensure()
    fence = client.create(f"{root}/v1/election/candidate-x-0000000001", b"{}", ephemeral=True, makepath=True)
    names = [f"entry-{i:05d}" for i in range(entries)]
    ledger.claim([Claim(n, state, ABSENT) for n in names], fence)
    versions = {n: 0 for n in names}
    claims, loads, transactions = [], [], []
    real = client.transaction
    client.transaction = lambda: (transactions.append(1), real())[1]  # type: ignore[method-assign]
    for round_ in range(ROUNDS):
        started = time.perf_counter()
        result = ledger.claim([Claim(n, replace(state, total_run_count=6 + round_), versions[n]) for n in names], fence)
        claims.append(time.perf_counter() - started)
        assert result.error is None and len(result.committed) == entries, result.error
        versions = result.committed
    client.transaction = real  # type: ignore[method-assign]
    for _ in range(ROUNDS):
        started = time.perf_counter()
        got = ledger.load()
        loads.append(time.perf_counter() - started)
        assert len(got) == entries
    return (
        f"{label}: {len(encode_state(state))} bytes per entry; claim of {entries}: median "
        f"{statistics.median(claims):.3f} s in {len(transactions) // ROUNDS} transactions; "
        f"load of {entries}: median {statistics.median(loads):.3f} s"
    )


def main(argv: list[str]) -> None:
    entries = int(argv[0]) if argv else 3000
    without, with_runs = _states()
    with ZooKeeperServer() as zk:
        client = KazooClient(zk.hosts)
        client.start(15)
        try:
            print(measure(client, "no recent runs", without, entries))
            print(measure(client, "10 recent runs", with_runs, entries))
        finally:
            client.stop()
            client.close()


if __name__ == "__main__":
    main(sys.argv[1:])

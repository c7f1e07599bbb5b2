"""Start ZooKeeper and Redis, run every scenario, print one table, write JSON.

``python -m bench`` runs the full benchmark (about twenty minutes on
two cores); ``--quick`` a short version of every scenario (under two
minutes) for building and debugging, with fewer trials and shorter windows.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
import time
from pathlib import Path

from kazoo.client import KazooClient

from bench import burst, crash, database, handover, hung, partition, punctuality, reshard, steady, swarm
from bench import shards as shards_scenario
from bench.context import Bench
from bench.stats import table
from tests.support.servers import RedisServer, ZooKeeperServer

#: The bench ZooKeeper's heap: the shards and database scenarios' 100,000-entry ledgers (three
#: trials' creates and deletes, each znode about 0.7 KB with its recent runs) exhausted 256 MB.
ZK_HEAP_MB = 1024

SCENARIOS = {
    "handover": handover.run,
    "crash": crash.run,
    "hung": hung.run,
    "partition": partition.run,
    "burst": burst.run,
    "punctuality": punctuality.run,
    "steady": steady.run,
    "swarm": swarm.run,
    "database": database.run,
    "shards": shards_scenario.run,
    "reshard": reshard.run,
}


def _versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    found = {}
    for name in ("zkbeat", "celery", "kazoo", "celery-redbeat", "redis"):
        try:
            found[name] = version(name)
        except PackageNotFoundError:
            found[name] = "missing"
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="short version of every scenario (< 2 minutes)")
    parser.add_argument("--only", action="append", choices=sorted(SCENARIOS), help="run only these scenarios")
    parser.add_argument("--tick-time", type=int, default=2000, help="ZooKeeper tickTime in ms (default 2000)")
    parser.add_argument(
        "--zk-heap-mb",
        type=int,
        default=int(os.environ.get("BENCH_ZK_HEAP_MB", ZK_HEAP_MB)),
        help=f"the bench ZooKeeper's maximum heap in MB (default $BENCH_ZK_HEAP_MB or {ZK_HEAP_MB}: "
        "100,000-entry ledgers do not fit in the tests' 256)",
    )
    parser.add_argument(
        "--json", default=".bench/bench-results.json", help="where to write the table as JSON (.bench/ is git-ignored)"
    )
    args = parser.parse_args(argv)

    started = time.time()
    load_before = os.getloadavg()
    header = {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "mode": "quick" if args.quick else "full",
        "command": "python -m bench" + (" --quick" if args.quick else ""),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}",
        "load_average_at_start": [round(x, 2) for x in load_before],
        "zookeeper_tick_time_ms": args.tick_time,
        "zookeeper_heap_mb": args.zk_heap_mb,
        "versions": _versions(),
    }
    print(
        f"zkbeat bench ({header['mode']}) {header['date']} on {header['machine']}\n"
        f"load average at start {load_before[0]:.2f} {load_before[1]:.2f} {load_before[2]:.2f}; "
        f"ZooKeeper tickTime {args.tick_time} ms, heap {args.zk_heap_mb} MB; {header['versions']}",
        file=sys.stderr,
        flush=True,
    )
    rows = []
    with ZooKeeperServer(tick_time=args.tick_time, heap_mb=args.zk_heap_mb) as zk, RedisServer() as redis:
        client = KazooClient(zk.hosts)
        client.start(timeout=30)
        bench = Bench(zk=zk, redis=redis, client=client, quick=args.quick, started=started)
        try:
            for name in args.only or SCENARIOS:
                rows += SCENARIOS[name](bench)
        finally:
            client.stop()
            client.close()
    header["load_average_at_end"] = [round(x, 2) for x in os.getloadavg()]
    header["seconds"] = round(time.time() - started, 1)
    print()
    print(
        f"zkbeat bench ({header['mode']}), {header['date']}, {header['machine']}, "
        f"load average {load_before[0]:.2f} at start / {header['load_average_at_end'][0]:.2f} at end, "
        f"ZooKeeper tickTime {args.tick_time} ms, {header['seconds']:.0f} s"
    )
    print("Cells: median / p99 over the trials (one figure where there is one measurement).")
    print()
    print(table(rows))
    for note in bench.notes:
        print(f"\n* {note}")
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    result = {**header, "notes": bench.notes, "rows": [row.as_dict() for row in rows]}
    Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    print(f"\n(written to {args.json})")
    return 0


if __name__ == "__main__":
    sys.exit(main())

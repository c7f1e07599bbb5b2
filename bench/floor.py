"""The crash floor: a bare kazoo client holding one ephemeral znode.

Run as ``python -m bench.floor HOSTS PATH SESSION_TIMEOUT``. It prints
``ready <session id>`` once the znode exists, then answers each ``touch`` line
on stdin with one request (so its session was last heard from at a known
moment) and ``touched``. The harness kills it with SIGKILL next to a zkbeat
leader and times how long ZooKeeper takes to tell a watcher the znode is
gone: no leader election can beat that.
"""

from __future__ import annotations

import sys

from kazoo.client import KazooClient


def main() -> None:
    hosts, path, timeout = sys.argv[1], sys.argv[2], float(sys.argv[3])
    client = KazooClient(hosts, timeout=timeout)
    client.start(timeout=30)
    client.create(path, b"floor", ephemeral=True, makepath=True)
    print(f"ready {client.client_id[0]}", flush=True)
    for line in sys.stdin:
        if line.strip() == "touch":
            client.exists(path)
            print("touched", flush=True)


if __name__ == "__main__":
    main()

"""The dashboard's pictures in the docs: ``python -m tests.support.screenshot [PATH] [--shards N]``.

Starts ZooKeeper, Redis and 3 real ``celery beat`` replicas on a small
schedule (intervals and a crontab in Paris), pauses one entry with a note,
runs one now, kills the leader once (so the epoch history has two leaders),
then opens ``zkbeat dashboard`` in Debian's chromium and saves a full-page
screenshot (default ``docs/_static/dashboard.png``). With ``--shards 3``
the replicas run ``zkbeat_shards = 3`` and no leader is killed: the page
shows each shard's leader and line (default
``docs/_static/dashboard-shards.png``). Everything it started is stopped
when it ends.
"""

from __future__ import annotations

import json
import signal
import sys
import tempfile
from pathlib import Path

from tests.support.browser import Dashboard, browser_page
from tests.support.faults import wait_until_watched
from tests.support.helpers import wait_for
from tests.support.processes import ROOT, Cluster
from tests.support.servers import RedisServer, ZooKeeperServer
from tests.test_cli import zkbeat

OUT = ROOT / "docs" / "_static" / "dashboard.png"
OUT_SHARDS = ROOT / "docs" / "_static" / "dashboard-shards.png"
SCHEDULE = {"heartbeat": 1, "sync-invoices": 5, "cleanup-sessions": 30, "rebuild-search-index": 3600}
SECRET = "screenshot-secret-0123456789"


def main(out: Path = OUT, shards: int = 1) -> None:
    from kazoo.client import KazooClient

    with tempfile.TemporaryDirectory() as logs, ZooKeeperServer() as zk, RedisServer() as redis:
        cluster = Cluster(3, zk_hosts=zk.hosts, broker=redis.url, root="/zkbeat/proj", schedule=SCHEDULE,
                          log_dir=Path(logs), extra_env={
                              "ZKBEAT_TEST_CRONTAB": json.dumps({"daily-report": {"minute": 30, "hour": 7}}),
                              "ZKBEAT_TEST_CONF": json.dumps({"timezone": "Europe/Paris", "zkbeat_shards": shards}),
                          })  # fmt: skip
        dashboard = None
        client = KazooClient(zk.hosts)
        client.start(timeout=15)
        try:
            cluster.start()
            wait_for(lambda: {"heartbeat", "sync-invoices"} <= {p.entry for p in cluster.publishes()}, timeout=30)
            env = {"env": dict(cluster.env)}
            if shards == 1:
                leader = wait_for(cluster.leader, timeout=30)
                wait_until_watched(client, cluster.root, leader.pid, cluster.logs)
                leader.signal(signal.SIGKILL)
                wait_for(lambda: cluster.leader() not in (None, leader), timeout=30)
            cli = ("-A", "tests.support.beatapp")
            zkbeat(*cli, "trigger", "rebuild-search-index", **env)
            zkbeat(*cli, "pause", "sync-invoices", "--note", "invoice provider maintenance until 14:00", **env)
            dashboard = Dashboard(dict(cluster.env), Path(logs), secret=SECRET)
            dashboard.wait_ready()
            # Every shard led, by three replicas once the fair share has settled.
            wait_for(
                lambda: (
                    len({s["leader"]["identity"] for s in dashboard.state()["shards"] if s["leader"]}) == min(shards, 3)
                ),
                timeout=60,
            )
            with browser_page({"width": 1500, "height": 900}) as page:
                page.goto(dashboard.url)
                wait_for(lambda: page.eval_on_selector_all("#entries tbody tr", "t => t.length") == 5, timeout=15)
                page.fill("#filter", "")
                page.click("#epochs summary")
                # One entry's recent runs open: the ones of both leaders, the failover between them.
                page.evaluate("""() => Array.from(document.querySelectorAll('#entries tbody tr'))
                    .find(tr => tr.dataset.name === 'heartbeat').querySelector('.recent summary').click()""")
                out.parent.mkdir(parents=True, exist_ok=True)
                page.screenshot(path=str(out), full_page=True)
            print(f"saved {out}")
        finally:
            if dashboard is not None:
                dashboard.stop()
            cluster.stop()
            client.stop()
            client.close()


if __name__ == "__main__":
    args = sys.argv[1:]
    count = 1
    if "--shards" in args:
        at = args.index("--shards")
        count = int(args[at + 1])
        del args[at : at + 2]
    main(Path(args[0]) if args else OUT if count == 1 else OUT_SHARDS, count)

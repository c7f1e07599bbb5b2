"""The Django admin's picture in the docs: ``python -m tests.support.screenshot_admin [PATH]``.

Starts ZooKeeper, Redis and 2 real ``celery beat --scheduler
zkbeat.DatabaseScheduler`` replicas of example_project on a SQLite database
in a temporary folder (its fast schedule), pauses one task with a note and
runs one now, then opens the admin's periodic task list in Debian's chromium
and saves a screenshot (default ``docs/_static/django-admin.png``).
Everything it started is stopped when it ends.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

from tests.support.browser import browser_page
from tests.support.djangosupport import DjangoCluster, _configure_django, replica_env, serve_project
from tests.support.helpers import wait_for
from tests.support.processes import ROOT
from tests.support.servers import RedisServer, ZooKeeperServer

OUT = ROOT / "docs" / "_static" / "django-admin.png"
ROOT_ZNODE = "/zkbeat/proj"


def main(out: Path = OUT) -> None:
    from kazoo.client import KazooClient

    with tempfile.TemporaryDirectory() as work, ZooKeeperServer() as zk, RedisServer() as redis:
        database = Path(work) / "db.sqlite3"
        os.environ["PROJ_SQLITE_PATH"] = str(database)
        _configure_django("")
        from django.contrib.auth.models import User
        from django.core.management import call_command
        from proj.celery import app

        from zkbeat.contrib.admin import zookeeper
        from zkbeat.ledger import controls

        call_command("migrate", verbosity=0)
        user = User.objects.create_superuser("ops", "ops@example.com", "not-used")
        env = replica_env(database_url="", zk_hosts=zk.hosts, broker=redis.url, root=ROOT_ZNODE,
                          record_key="zkbeat-screenshot")  # fmt: skip
        extra = {"PROJ_SQLITE_PATH": str(database), "PROJ_FAST_SCHEDULE": "1"}
        cluster = DjangoCluster(2, env, Path(work), extra)
        client = KazooClient(zk.hosts)
        client.start(timeout=15)
        try:
            cluster.start()
            names = {"cleanup-messages", "aggregate-analytics", "expire-sessions"}
            wait_for(lambda: names <= {p.entry for p in cluster.publishes()}, timeout=60, message=cluster.logs)
            controls.pause(client, ROOT_ZNODE, "expire-sessions", "ops (Django admin)", "sessions table migration")
            request = controls.request_trigger(client, ROOT_ZNODE, "aggregate-analytics", "ops (Django admin)")
            name = request.rsplit("/", 1)[-1]
            wait_for(lambda: any(p.manual == name for p in cluster.publishes()), timeout=30, message=cluster.logs)
            app.conf.update(zkbeat_hosts=zk.hosts, zkbeat_root=ROOT_ZNODE)
            from django.test import Client

            browser_client = Client(HTTP_HOST="localhost")
            browser_client.force_login(user)
            cookie = browser_client.cookies["sessionid"].value
            with serve_project() as url, browser_page({"width": 1800, "height": 480}) as page:
                page.context.add_cookies([{"name": "sessionid", "value": cookie, "url": url}])
                page.goto(f"{url}/admin/django_celery_beat/periodictask/")
                page.wait_for_selector("#result_list")
                page.click("#toggle-nav-sidebar")  # the table's width for the zkbeat columns
                out.parent.mkdir(parents=True, exist_ok=True)
                page.screenshot(path=str(out), full_page=True)
            print(f"saved {out}")
        finally:
            zookeeper.close()
            cluster.stop()
            client.stop()
            client.close()


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else OUT)

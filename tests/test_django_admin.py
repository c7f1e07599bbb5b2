"""zkbeat's Django admin app (zkbeat.contrib.admin) through Django's test client, as a superuser and as a
user who may only view, against real ZooKeeper, PostgreSQL and a real ``celery beat`` replica of the example
project; and one check of the list page in Debian's chromium."""

from __future__ import annotations

import html
import json
import logging
import os
import re
import subprocess
import sys
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from kazoo.client import KazooClient

from tests.support.browser import browser_page
from tests.support.djangosupport import (
    EXAMPLE_PROJECT,
    ON_THE_DATABASE,
    DjangoCluster,
    capture_sql,
    interval_task,
    serve_project,
)
from tests.support.helpers import wait_for
from tests.support.processes import ROOT
from tests.support.servers import ZooKeeperServer, free_port
from tests.test_cli import zkbeat

pytestmark = ON_THE_DATABASE

LIST = "/admin/django_celery_beat/periodictask/"
CLUSTER = "/admin/zkbeat_admin/cluster/"
HOSTILE = '<script>window.__pwned=1</script><img src=x onerror="window.__pwned=2">'
NOTE = "invoice provider <b>maintenance</b> until 14:00"


@pytest.fixture
def admin_on() -> Iterator[Callable[[str, str], None]]:
    """``admin_on(hosts, root)``: point the example project's Celery app (so the admin) at a ZooKeeper and root."""
    from django.test import override_settings
    from proj.celery import app

    from zkbeat.contrib.admin import zookeeper

    # The project's own spelling (namespace CELERY): Celery before 5.4 does not
    # read back a lower-case key set on a namespaced configuration.
    keys = ("CELERY_ZKBEAT_HOSTS", "CELERY_ZKBEAT_ROOT", "CELERY_ZKBEAT_SESSION_TIMEOUT")
    saved = {key: app.conf.get(key) for key in keys}

    def point(hosts: str, root: str) -> None:
        app.conf.update(dict(zip(keys, (hosts, root, 4), strict=True)))

    # Named, not left to Celery's current app: an earlier test in the same
    # worker may have made another app current (the suite runs files side by side).
    with override_settings(ZKBEAT_CELERY_APP="proj.celery:app"):
        yield point
    app.conf.update(saved)
    zookeeper.close()


def login(superuser: bool = True, perms: tuple[str, ...] = ()) -> Any:
    """A test client logged in as a superuser, or as staff with only ``perms`` (codenames of django_celery_beat)."""
    from django.contrib.auth.models import Permission, User
    from django.test import Client

    name = "admin-root" if superuser else f"admin-{'-'.join(perms) or 'none'}"
    user, _ = User.objects.get_or_create(username=name, defaults={"is_staff": True, "is_superuser": superuser})
    user.user_permissions.set(
        Permission.objects.filter(content_type__app_label="django_celery_beat", codename__in=perms)
    )
    client = Client(HTTP_HOST="localhost")
    client.force_login(user)
    return client


def task_id(name: str) -> int:
    from django_celery_beat.models import PeriodicTask

    return PeriodicTask.objects.get(name=name).pk


def act(client: Any, action: str, *names: str, note: str = "") -> Any:
    """POST an admin action on rows ``names``; the list page it redirects to, followed."""
    data = {"action": action, "_selected_action": [task_id(n) for n in names], "index": 0, "note": note}
    return client.post(LIST, data, follow=True)


def said(response: Any) -> list[str]:
    """The Django messages the page shows, as text."""
    shown = re.search(r'<ul class="messagelist">(.*?)</ul>', response.content.decode(), flags=re.S)
    items = re.findall(r"<li[^>]*>(.*?)</li>", shown.group(1), flags=re.S) if shown else []
    return [html.unescape(item).strip() for item in items]


def cells(page: str, column: str) -> list[str]:
    """The text of each row's cell in the column ``column`` (field-<column>), tags removed, unescaped."""
    found = re.findall(rf'<td class="field-{column}">(.*?)</td>', page, flags=re.S)
    return [html.unescape(re.sub(r"<[^>]+>", " ", cell)).strip() for cell in found]


def by_name(page: str, column: str) -> dict[str, str]:
    """Row name -> the text of its cell in ``column`` on a list page."""
    names = [html.unescape(n) for n in re.findall(r'<th class="field-name"><a [^>]*>(.*?)</a>', page, flags=re.S)]
    return dict(zip(names, cells(page, column), strict=True))


def status_json(cluster: DjangoCluster) -> dict:
    shown = zkbeat("-A", "proj", "status", "--json", "--all",
                   env={**cluster.env, "PYTHONPATH": f"{ROOT}:{EXAMPLE_PROJECT}"})  # fmt: skip
    assert shown.returncode == 0, shown.stderr
    return json.loads(shown.stdout)


def test_list_page_and_actions_with_a_leader(
    make_cluster: Callable[..., DjangoCluster], zk_server: ZooKeeperServer, zk_root: str, admin_on: Any
) -> None:
    """The list page shows each row's last run from the ledger (by the leader's identity and epoch), its next
    run and its pause; pause, resume and run now from the actions change ZooKeeper as ``zkbeat`` would, a run
    now is published exactly once by the leader, and a row named with markup is escaped."""
    interval_task("steady", 1)
    interval_task(HOSTILE, 1, task="jobs.aggregate_analytics")
    interval_task("hourly", 3600, task="jobs.expire_sessions")
    cluster = make_cluster(1).start()
    wait_for(lambda: {"steady", HOSTILE} <= {p.entry for p in cluster.publishes()}, timeout=40, message=cluster.logs)
    admin_on(zk_server.hosts, zk_root)
    client = login()

    page = client.get(LIST)
    assert page.status_code == 200
    text = page.content.decode()
    assert HOSTILE not in text and html.escape(HOSTILE) in text, "a row's name reached the page unescaped"
    status = {e["name"]: e for e in status_json(cluster)["entries"]}
    leader = status_json(cluster)["leader"]
    last = by_name(text, "zkbeat_last_run")
    nexts = by_name(text, "zkbeat_next_run")
    assert f"by {leader['identity']}, epoch {leader['epoch']}" in last["steady"], last
    assert f"epoch {status['steady']['epoch']}" in last["steady"]
    assert "slot " in last["steady"]
    assert last["hourly"].startswith("20") or last["hourly"] == "never run", last
    assert nexts["hourly"].startswith("20"), nexts
    assert by_name(text, "zkbeat_paused")["steady"] == "no"

    paused = act(client, "zkbeat_pause", "steady", HOSTILE, note=NOTE)
    messages = said(paused)
    assert any(m.startswith("Paused steady on every replica") for m in messages), messages
    assert any(m.startswith(f"Paused {HOSTILE}") for m in messages), messages
    status = {e["name"]: e for e in status_json(cluster)["entries"]}
    assert status["steady"]["paused"]["note"] == NOTE
    assert status["steady"]["paused"]["by"] == "admin-root (Django admin)"
    assert status[HOSTILE]["paused"]["note"] == NOTE
    shown = paused.content.decode()
    assert HOSTILE not in shown and "<b>maintenance</b>" not in shown, "a name or note reached the page unescaped"
    held = by_name(shown, "zkbeat_paused")
    assert held["steady"].startswith("by admin-root (Django admin) at ") and held["steady"].endswith(NOTE), held
    assert by_name(shown, "zkbeat_next_run")["steady"].startswith("paused"), shown

    again = said(act(client, "zkbeat_pause", "steady"))
    assert any(m.startswith("Already paused: steady (by ") for m in again), again

    before = {p.manual for p in cluster.publishes("steady") if p.manual}
    asked = said(act(client, "zkbeat_run_now", "steady"))
    request = re.search(r"Asked the leader to run steady once now \((request-\d+)\)", " ".join(asked))
    assert request, asked
    wait_for(lambda: any(p.manual == request.group(1) for p in cluster.publishes("steady")), timeout=30,
             message=cluster.logs)  # fmt: skip
    runs = [p for p in cluster.publishes("steady") if p.manual and p.manual not in before]
    assert [p.manual for p in runs] == [request.group(1)], "a run now was not published exactly once"
    cluster_page = client.get(CLUSTER)
    assert cluster_page.status_code == 200
    assert request.group(1) not in cluster_page.content.decode(), "a consumed request is still shown pending"

    resumed = said(act(client, "zkbeat_resume", "steady", HOSTILE))
    assert any(m.startswith("Resumed steady (paused by admin-root (Django admin)") for m in resumed), resumed
    status = {e["name"]: e for e in status_json(cluster)["entries"]}
    assert status["steady"]["paused"] is None and status[HOSTILE]["paused"] is None
    assert any(m == "Not paused: hourly" for m in said(act(client, "zkbeat_resume", "hourly")))
    assert [p.manual for p in cluster.publishes("steady") if p.manual and p.manual not in before] == [request.group(1)]


def test_cluster_page_and_a_pending_request(
    make_cluster: Callable[..., DjangoCluster], zk_server: ZooKeeperServer, zk_root: str, admin_on: Any
) -> None:
    """The cluster page names the leader (identity, host, version, layout) as ``zkbeat status`` does, and
    lists a run-now request no leader has taken yet with who asked."""
    from zkbeat.ledger import controls

    interval_task("steady", 1)
    cluster = make_cluster(2).start()
    wait_for(lambda: cluster.publishes("steady"), timeout=40, message=cluster.logs)
    admin_on(zk_server.hosts, zk_root)
    wait_for(lambda: status_json(cluster)["leader"] is not None, timeout=20)
    status = status_json(cluster)
    page = login().get(CLUSTER)
    assert page.status_code == 200
    text = page.content.decode()
    leader = status["leader"]
    shown = html.unescape(re.sub(r"<[^>]+>", " ", re.search(r'id="zkbeat-leader">(.*?)</p>', text, re.S).group(1)))
    assert leader["identity"] in shown and f"epoch {leader['epoch']}" in shown, shown
    body = text.split('id="zkbeat-candidates"')[1].split("<tbody>")[1].split("</tbody>")[0]
    rows = re.findall(r"<tr>(.*?)</tr>", body, re.S)
    assert len(rows) == 2
    for candidate, row in zip(status["candidates"], rows):
        for value in (candidate["identity"], candidate["host"], candidate["version"], str(candidate["layout"])):
            assert html.escape(value) in row, (value, row)

    # A request for a row the leader does not have waits (it is kept pending): the page lists it.
    zk = KazooClient(zk_server.hosts)
    zk.start(timeout=15)
    try:
        made = controls.request_trigger(zk, zk_root, "not-a-row", "someone@somewhere", scheduled=True)
    finally:
        zk.stop()
        zk.close()
    pending = login().get(CLUSTER).content.decode().split('id="zkbeat-pending"')[1]
    assert made.rsplit("/", 1)[-1] in pending and "not-a-row" in pending and "someone@somewhere" in pending


def test_actions_need_the_change_permission(zk_server: ZooKeeperServer, zk_root: str, admin_on: Any) -> None:
    """A user who may only view periodic tasks is offered none of zkbeat's actions, and posting one changes
    nothing in ZooKeeper; the list page still shows the zkbeat columns to that user."""
    interval_task("steady", 5)
    admin_on(zk_server.hosts, zk_root)
    viewer = login(superuser=False, perms=("view_periodictask",))
    page = viewer.get(LIST)
    assert page.status_code == 200
    text = page.content.decode()
    assert 'value="zkbeat_pause"' not in text and 'value="zkbeat_run_now"' not in text
    assert cells(text, "zkbeat_last_run") == ["never run"]
    for action in ("zkbeat_pause", "zkbeat_resume", "zkbeat_run_now"):
        answer = act(viewer, action, "steady")
        assert not any(
            m.startswith(("Paused", "Resumed", "Asked", "Not paused", "Refused", "Not done")) for m in said(answer)
        ), said(answer)
    zk = KazooClient(zk_server.hosts)
    zk.start(timeout=15)
    try:
        assert zk.exists(zk_root) is None, "an action of a user without the change permission wrote to ZooKeeper"
    finally:
        zk.stop()
        zk.close()
    assert CLUSTER in viewer.get("/admin/").content.decode(), "the cluster page is not linked from the index"


def test_layout_guard_refuses_with_a_message_per_row(zk_server: ZooKeeperServer, zk_root: str, admin_on: Any) -> None:
    """With no replica of layout 2 in line, pause and run now are refused as ``zkbeat pause`` refuses them
    without --force: a message per row says why, and nothing is written; a run now of a disabled task is
    refused too (the leader schedules enabled tasks only)."""
    interval_task("one", 5)
    interval_task("two", 5)
    admin_on(zk_server.hosts, zk_root)
    client = login()
    for action in ("zkbeat_pause", "zkbeat_run_now"):
        messages = said(act(client, action, "one", "two"))
        assert len(messages) == 2, messages
        assert all(
            re.match(r"Refused \((pause|trigger|run now)\) for (one|two): .*needs zkbeat layout 2", m) for m in messages
        ), messages
    interval_task("off", 5, enabled=False)
    assert said(act(client, "zkbeat_run_now", "off")) == [
        "Refused (run now) for off: the task is disabled: the leader runs enabled tasks only"
    ]
    zk = KazooClient(zk_server.hosts)
    zk.start(timeout=15)
    try:
        assert zk.exists(f"{zk_root}/v2") is None and zk.exists(f"{zk_root}/v1/triggers") is None
    finally:
        zk.stop()
        zk.close()


def test_zookeeper_down_the_admin_still_renders(zk_root: str, admin_on: Any, caplog: pytest.LogCaptureFixture) -> None:
    """With ZooKeeper unreachable the list, change and cluster pages render, zkbeat's columns say
    "unavailable", a page logs one warning, and an action says per row that it was not done."""
    interval_task("steady", 5)
    interval_task("other", 5)
    hosts = f"127.0.0.1:{free_port()}"
    admin_on(hosts, zk_root)
    client = login()
    with caplog.at_level(logging.WARNING, logger="zkbeat.contrib.admin"):
        page = client.get(LIST)
    assert page.status_code == 200
    text = page.content.decode()
    for column in ("zkbeat_last_run", "zkbeat_next_run", "zkbeat_paused"):
        assert cells(text, column) == ["unavailable", "unavailable"], column
    warnings = [r for r in caplog.records if r.name.startswith("zkbeat.contrib.admin")]
    assert len(warnings) == 1, [r.getMessage() for r in warnings]
    assert "cannot be reached" in warnings[0].getMessage()
    change = client.get(f"{LIST}{task_id('steady')}/change/")
    assert change.status_code == 200 and "unavailable" in change.content.decode()
    cluster = client.get(CLUSTER)
    assert cluster.status_code == 200 and "unavailable: ZooKeeper at" in cluster.content.decode()
    messages = said(act(client, "zkbeat_pause", "steady", "other"))
    assert sorted(messages) == [
        f"Not done (pause) for {name}: ZooKeeper at {hosts} cannot be reached (zkbeat_hosts; the admin keeps trying)"
        for name in ("other", "steady")
    ], messages


def test_without_the_app_nothing_is_registered() -> None:
    """A project that does not install zkbeat.contrib.admin keeps django-celery-beat's admin as it is, even
    after importing zkbeat.contrib.django (the DatabaseScheduler): nothing of zkbeat's is registered."""
    script = """
import django
from django.conf import settings
settings.configure(
    INSTALLED_APPS=["django.contrib.admin", "django.contrib.auth", "django.contrib.contenttypes",
                    "django.contrib.sessions", "django.contrib.messages", "django_celery_beat"],
    DATABASES={"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}},
    USE_TZ=True,
)
django.setup()
import sys
import zkbeat.contrib.django  # noqa: F401
from django.contrib import admin
from django_celery_beat.admin import PeriodicTaskAdmin
from django_celery_beat.models import PeriodicTask
registered = admin.site._registry
assert type(registered[PeriodicTask]) is PeriodicTaskAdmin, type(registered[PeriodicTask])
assert not [m for m in registered if m._meta.app_label == "zkbeat_admin"]
assert "zkbeat.contrib.admin" not in sys.modules
print("ok")
"""
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env={**env, "PYTHONPATH": str(ROOT)},
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr


@pytest.fixture
def served() -> Iterator[str]:
    """The example project served by this process (same database) on a free port; its URL."""
    with serve_project() as url:
        yield url


def test_list_page_in_a_browser(
    zk_server: ZooKeeperServer, zk_client: KazooClient, zk_root: str, admin_on: Any, served: str
) -> None:
    """In chromium the list page shows the zkbeat columns for each row (a pause with its note), and a row
    named with script and markup is shown as text, never run."""
    from zkbeat.ledger import controls

    interval_task("steady", 5)
    interval_task(HOSTILE, 5, task="jobs.aggregate_analytics")
    controls.pause(zk_client, zk_root, HOSTILE, "ops@host", NOTE, scheduled=True, force=True)
    admin_on(zk_server.hosts, zk_root)
    cookie = login().cookies["sessionid"].value
    with browser_page() as page:
        page.context.add_cookies([{"name": "sessionid", "value": cookie, "url": served}])
        page.goto(f"{served}{LIST}")
        page.wait_for_selector("#result_list")
        rows = page.eval_on_selector_all(
            "#result_list tbody tr",
            """rows => rows.map(r => ({name: r.querySelector('.field-name').innerText,
                paused: r.querySelector('.field-zkbeat_paused').innerText,
                next: r.querySelector('.field-zkbeat_next_run').innerText,
                last: r.querySelector('.field-zkbeat_last_run').innerText}))""",
        )
        assert page.evaluate("window.__pwned") is None, "a row's name ran as script"
        headers = page.eval_on_selector_all("#result_list thead th", "t => t.map(h => h.innerText.trim())")
    shown = {row["name"]: row for row in rows}
    assert set(shown) == {"steady", HOSTILE}, shown
    assert {"ZKBEAT LAST RUN", "ZKBEAT NEXT RUN", "ZKBEAT PAUSED"} <= {h.upper() for h in headers}, headers
    assert shown[HOSTILE]["paused"].startswith("by ops@host at ") and shown[HOSTILE]["paused"].endswith(NOTE)
    assert shown[HOSTILE]["next"].startswith("paused")
    assert shown["steady"]["paused"] == "no" and shown["steady"]["last"] == "never run"
    assert re.match(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d", shown["steady"]["next"]), shown


def received(zk_server: ZooKeeperServer, session: int) -> int:
    """Requests ZooKeeper has received on ``session`` (its ``cons`` report)."""
    for line in zk_server.four_letter("cons").splitlines():
        if f"sid=0x{session:x}," in line:
            return int(re.search(r"recved=(\d+)", line).group(1))
    raise AssertionError(f"session 0x{session:x} is not connected:\n{zk_server.four_letter('cons')}")


def test_a_page_reads_its_rows_in_one_batch(zk_server: ZooKeeperServer, zk_root: str, admin_on: Any) -> None:
    """A list page of 60 rows in the ledger costs ZooKeeper a handful of requests on the admin's one shared
    session (one multiRead for the rows, the election's line), not one or more per row; a second page reuses
    the session."""
    from zkbeat.contrib.admin import zookeeper
    from zkbeat.ledger import controls

    names = [f"row-{n:02d}" for n in range(60)]
    for name in names:
        interval_task(name, 5)
    zk = KazooClient(zk_server.hosts)
    zk.start(timeout=15)
    try:
        for name in names:
            controls.pause(zk, zk_root, name, "ops@host", "", scheduled=True, force=True)
    finally:
        zk.stop()
        zk.close()
    admin_on(zk_server.hosts, zk_root)
    client = login()
    first = client.get(LIST).content.decode()
    assert len(cells(first, "zkbeat_paused")) == 60
    assert all(cell.startswith("by ops@host at ") for cell in cells(first, "zkbeat_paused"))
    assert set(cells(first, "zkbeat_last_run")) == {"never run"}, "a pause's state was shown as a run"
    session = zookeeper._shared.client.client_id[0]
    before = received(zk_server, session)
    with capture_sql() as sql:
        again = client.get(LIST).content.decode()
    requests = received(zk_server, session) - before
    assert not sql.reading("django_celery_beat_intervalschedule"), "the zkbeat columns queried the rows' schedules"
    assert cells(again, "zkbeat_paused") == cells(first, "zkbeat_paused")
    assert zookeeper._shared.client.client_id[0] == session, "the second page made a new session"
    change = client.get(f"{LIST}{task_id('row-07')}/change/").content.decode()
    paused = re.search(r'<div class="readonly">(by ops@host at [^<]*)</div>', change)
    assert paused, "the change page does not show the row's pause"
    print(f"ZooKeeper requests for a page of 60 rows: {requests}")
    assert requests <= 6, f"{requests} ZooKeeper requests for one page of 60 rows"


def test_the_celery_app_named_by_a_django_setting(
    zk_server: ZooKeeperServer, zk_root: str, admin_on: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """ZKBEAT_CELERY_APP names the Celery app whose zkbeat settings the admin uses; one that cannot be
    imported leaves the columns unavailable with a warning naming the setting, and the page renders."""
    from django.test import override_settings

    interval_task("steady", 5)
    admin_on(zk_server.hosts, zk_root)
    client = login()
    with override_settings(ZKBEAT_CELERY_APP="proj.celery:app"):
        assert cells(client.get(LIST).content.decode(), "zkbeat_last_run") == ["never run"]
    with override_settings(ZKBEAT_CELERY_APP="proj.celery:no_such_app"), caplog.at_level(logging.WARNING):
        page = client.get(LIST)
    assert page.status_code == 200
    assert cells(page.content.decode(), "zkbeat_last_run") == ["unavailable"]
    assert any(
        "ZKBEAT_CELERY_APP = 'proj.celery:no_such_app' cannot be imported" in r.getMessage() for r in caplog.records
    )


def _setup_with(apps: list[str]) -> subprocess.CompletedProcess:
    """A fresh process that sets Django up with ``apps`` installed, then prints the PeriodicTask admin's class."""
    script = f"""
import django
from django.conf import settings
settings.configure(INSTALLED_APPS={apps!r}, USE_TZ=True,
                   DATABASES={{"default": {{"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}}}})
django.setup()
from django.contrib import admin
from django_celery_beat.models import PeriodicTask
print(type(admin.site._registry[PeriodicTask]).__module__)
"""
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    return subprocess.run([sys.executable, "-c", script], cwd=ROOT, env={**env, "PYTHONPATH": str(ROOT)},
                          capture_output=True, text=True, timeout=120)  # fmt: skip


BASE_APPS = ["django.contrib.admin", "django.contrib.auth", "django.contrib.contenttypes",
             "django.contrib.sessions", "django.contrib.messages"]  # fmt: skip


def test_installed_in_any_order_and_only_with_django_celery_beat() -> None:
    """The app takes over the periodic task admin whether it is listed before or after django_celery_beat;
    without django_celery_beat, Django's setup fails with a message naming INSTALLED_APPS and the app to add."""
    for apps in (
        [*BASE_APPS, "django_celery_beat", "zkbeat.contrib.admin"],
        ["zkbeat.contrib.admin", *BASE_APPS, "django_celery_beat"],
    ):
        done = _setup_with(apps)
        assert done.returncode == 0 and done.stdout.strip() == "zkbeat.contrib.admin.admin", (apps, done.stderr)
    missing = _setup_with([*BASE_APPS, "zkbeat.contrib.admin"])
    assert missing.returncode != 0
    assert (
        "ImproperlyConfigured: INSTALLED_APPS: zkbeat.contrib.admin extends django-celery-beat's admin; "
        "add 'django_celery_beat' to INSTALLED_APPS"
    ) in missing.stderr, missing.stderr

"""Django on real PostgreSQL for the DatabaseScheduler tests, and its beat replicas.

The project under test is example_project/: the pytest process configures
Django with its settings on a PostgreSQL database of its own (created here,
dropped afterwards), so tests change the schedule through the ORM as the admin
does, while beat replicas are real ``celery beat`` processes of the same
project on the same database (``-A tests.support.djangobeat``).

PostgreSQL is a system service, not started here: ``ZKBEAT_TEST_POSTGRES``
(default ``postgres://postgres@127.0.0.1:5432``). If it cannot be reached the
tests fail with a message saying how to provide one; they never skip.

A trigger records every write to django-celery-beat's task table with the
writer's ``application_name``; replicas set it (``PGAPPNAME``) to their
identity, so a test can name every process that wrote.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import threading
import uuid
from collections.abc import Callable, Iterable, Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import redis

from tests.support.helpers import Published, wait_for
from tests.support.processes import ROOT, Publish, Replica, read_publishes
from tests.support.proxy import TcpProxy
from tests.support.servers import free_port

EXAMPLE_PROJECT = ROOT / "example_project"
POSTGRES_URL = os.environ.get("ZKBEAT_TEST_POSTGRES", "postgres://postgres@127.0.0.1:5432")
POSTGRES_HINT = (
    "run PostgreSQL on 127.0.0.1:5432 with trust auth for user postgres "
    "(apt-get install -y postgresql), or point ZKBEAT_TEST_POSTGRES at one: postgres://user:password@host:port"
)
#: The tables a test starts without rows in (the schedule, its change marker, the jobs' data).
TABLES = (
    "django_celery_beat_periodictask",
    "django_celery_beat_periodictasks",
    "django_celery_beat_intervalschedule",
    "django_celery_beat_crontabschedule",
    "django_celery_beat_solarschedule",
    "django_celery_beat_clockedschedule",
    "jobs_jobrun",
    "jobs_broadcast",
    "jobs_message",
    "jobs_analyticssnapshot",
    "zkbeat_test_writes",
)
AUDIT_SQL = """
CREATE TABLE zkbeat_test_writes (
    at timestamptz NOT NULL DEFAULT clock_timestamp(),
    app text NOT NULL,
    op text NOT NULL,
    name text NOT NULL
);
CREATE FUNCTION zkbeat_test_log_write() RETURNS trigger AS $$
BEGIN
    INSERT INTO zkbeat_test_writes (app, op, name)
    VALUES (current_setting('application_name'), TG_OP, COALESCE(NEW.name, OLD.name));
    RETURN NULL;
END $$ LANGUAGE plpgsql;
CREATE TRIGGER zkbeat_test_log_write AFTER INSERT OR UPDATE OR DELETE ON django_celery_beat_periodictask
    FOR EACH ROW EXECUTE FUNCTION zkbeat_test_log_write();
"""


def _admin_connection():
    import psycopg2

    parts = urlsplit(POSTGRES_URL)
    try:
        connection = psycopg2.connect(
            host=parts.hostname or "127.0.0.1",
            port=parts.port or 5432,
            user=parts.username or "postgres",
            password=parts.password or None,
            dbname="postgres",
            connect_timeout=5,
        )
    except psycopg2.OperationalError as exc:
        raise RuntimeError(f"PostgreSQL is not reachable at {POSTGRES_URL} ({exc}): {POSTGRES_HINT}") from None
    connection.autocommit = True
    return connection


@pytest.fixture(scope="session")
def django_database() -> Iterator[str]:
    """A fresh PostgreSQL database with the example project migrated; Django configured on it."""
    name = f"zkbeat_test_{uuid.uuid4().hex[:12]}"
    admin = _admin_connection()
    with admin.cursor() as cursor:
        cursor.execute(f'CREATE DATABASE "{name}"')
    url = f"{POSTGRES_URL.rstrip('/')}/{name}"
    try:
        _configure_django(url)
        from django.core.management import call_command
        from django.db import connection

        call_command("migrate", verbosity=0)
        with connection.cursor() as cursor:
            cursor.execute(AUDIT_SQL)
        yield url
    finally:
        with contextlib.suppress(Exception):
            from django.db import connections

            connections.close_all()
        with admin.cursor() as cursor:
            cursor.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.close()


def _configure_django(url: str) -> None:
    """Django with the example project's settings on ``url``, then the environment as it was.

    The variables are removed again so that Celery apps other tests create do
    not pick up Django (Celery's Django fixup looks at DJANGO_SETTINGS_MODULE).
    """
    import django

    if str(EXAMPLE_PROJECT) not in sys.path:
        sys.path.insert(0, str(EXAMPLE_PROJECT))
    saved = {key: os.environ.get(key) for key in ("DJANGO_SETTINGS_MODULE", "DATABASE_URL")}
    os.environ.update(DJANGO_SETTINGS_MODULE="proj.settings", DATABASE_URL=url)
    try:
        django.setup()
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@pytest.fixture
def beat_db(django_database: str) -> str:
    """The test database, emptied of schedules, job runs and recorded writes."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(f"TRUNCATE {', '.join(TABLES)} RESTART IDENTITY CASCADE")
    return django_database


class CapturedSql(list):
    """SQL statements one thread sent through Django while capturing; ``rows[i]`` is the i-th one's row count."""

    def __init__(self) -> None:
        super().__init__()
        self.rows: list[int] = []

    def writes(self) -> list[str]:
        return [sql for sql in self if sql.lstrip().split(None, 1)[0].upper() in ("INSERT", "UPDATE", "DELETE")]

    def reading(self, table: str) -> list[tuple[str, int]]:
        """(statement, rows returned) of each SELECT from ``table``."""
        return [
            (sql, rows)
            for sql, rows in zip(self, self.rows)
            if sql.lstrip().upper().startswith("SELECT") and f'FROM "{table}"' in sql
        ]


@contextlib.contextmanager
def capture_sql() -> Iterator[CapturedSql]:
    """Record every statement this thread sends through Django's default connection, and its row count."""
    from django.db import connection

    captured = CapturedSql()

    def record(execute, sql, params, many, context):
        try:
            return execute(sql, params, many, context)
        finally:
            captured.append(sql)
            captured.rows.append(getattr(context["cursor"].cursor, "rowcount", -1))

    with connection.execute_wrapper(record):
        yield captured


@contextlib.contextmanager
def database_unreachable() -> Iterator[None]:
    """This process's Django connection points at a port nobody listens on: every query fails to connect.

    A real outage as the driver sees it (connection refused), for the
    in-process scheduler and the test alike: they share the connection.
    Everything is as it was again once the block ends.
    """
    with _database_at(free_port()):
        yield


@contextlib.contextmanager
def database_through_proxy(connected: bool = True) -> Iterator[TcpProxy]:
    """This process's Django connection goes through a TcpProxy to PostgreSQL, which the test can black-hole.

    The connection is open when the block starts (unless not ``connected``): a
    query sent once the proxy black-holes simply gets no answer, as from a
    server that stopped answering; a connection opened then gets no answer
    to its start-up either.
    """
    from django.db import connection

    with TcpProxy(int(connection.settings_dict["PORT"] or 5432)) as proxy, _database_at(proxy.port):
        if connected:
            connection.ensure_connection()
        yield proxy


@contextlib.contextmanager
def _database_at(port: int) -> Iterator[None]:
    """Django's default connection on 127.0.0.1:``port`` within the block; closed on entry and exit."""
    from django.db import connection

    settings = connection.settings_dict
    saved = {key: settings.get(key) for key in ("HOST", "PORT")}
    connection.close()
    settings.update(HOST="127.0.0.1", PORT=str(port))
    try:
        yield
    finally:
        connection.close()
        settings.update(saved)


def recorded_writes() -> list[tuple[datetime, str, str, str]]:
    """(at, application_name, operation, task name) of every write to the task table."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT at, app, op, name FROM zkbeat_test_writes ORDER BY at")
        return list(cursor.fetchall())


def interval_task(name: str, seconds: int, task: str = "jobs.cleanup_messages", **fields):
    """Create (like the admin would) a periodic task every ``seconds``."""
    from django_celery_beat.models import IntervalSchedule, PeriodicTask

    every, _ = IntervalSchedule.objects.get_or_create(every=seconds, period=IntervalSchedule.SECONDS)
    return PeriodicTask.objects.create(name=name, task=task, interval=every, **fields)


def one_off_task(name: str, at: datetime | None = None, task: str = "jobs.expire_sessions", **fields):
    """Create a one-off task clocked at ``at`` (now by default)."""
    from django.utils import timezone
    from django_celery_beat.models import ClockedSchedule, PeriodicTask

    clocked = ClockedSchedule.objects.create(clocked_time=at or timezone.now() - timedelta(milliseconds=1))
    return PeriodicTask.objects.create(name=name, task=task, clocked=clocked, one_off=True, **fields)


class DjangoReplica(Replica):
    """``celery beat`` of the example project with zkbeat.DatabaseScheduler (via tests.support.djangobeat)."""

    def start(self, extra_env: dict[str, str] | None = None) -> DjangoReplica:
        log = open(self.log_path, "ab")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "tests.support.djangobeat", "beat",
             "--scheduler", "zkbeat.DatabaseScheduler", "--loglevel", "INFO"],
            cwd=ROOT,
            env={
                **os.environ,
                **self._env,
                **(extra_env or {}),
                "ZKBEAT_IDENTITY": self.identity,
                "PGAPPNAME": self.identity,
                "PYTHONPATH": f"{ROOT}{os.pathsep}{EXAMPLE_PROJECT}",
            },
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
        log.close()
        return self


def replica_env(*, database_url: str, zk_hosts: str, broker: str, root: str, record_key: str,
                session_timeout: float = 2.0, record_url: str | None = None) -> dict[str, str]:  # fmt: skip
    """The environment every replica of one test shares (same image, same config).

    ``record_url`` is the Redis that keeps the record of publishes (default: the broker).
    """
    return {
        "DATABASE_URL": database_url,
        "CELERY_BROKER_URL": broker,
        "ZKBEAT_TEST_RECORD_URL": record_url or broker,
        "ZKBEAT_HOSTS": zk_hosts,
        "ZKBEAT_ROOT": root,
        "ZKBEAT_SESSION_TIMEOUT": str(session_timeout),
        "ZKBEAT_TEST_RECORD_KEY": record_key,
    }


#: A Django test module's marks (``pytestmark``): its schedulers and clusters run zkbeat.DatabaseScheduler
#: (conftest's ``beat_scheduler``) on the test database, emptied for each test.
ON_THE_DATABASE = [pytest.mark.usefixtures("beat_db"), pytest.mark.beat_scheduler("zkbeat.DatabaseScheduler")]


def pump(scheduler, until: Callable[[], Any], timeout: float = 30, message=None):
    """Run an in-process scheduler's loop (without its sleeps) until ``until()`` holds; returns what it returned."""

    def step():
        scheduler.tick()
        return until()

    return wait_for(step, timeout=timeout, interval=0.05, message=message)


def leader_with_runs(make_scheduler, published: Published, names: Iterable[str], times: int = 3, **conf):
    """A DatabaseScheduler (``make_scheduler(**conf)``) leading every shard, with a row every second for each
    name made first; returned once each was published ``times`` times and its run is not written to its row yet."""
    names = list(names)
    for name in names:
        interval_task(name, 1)
    scheduler = make_scheduler(**conf)
    for shard in scheduler._shards:
        assert shard.election.wait_for_leadership(15), f"never led shard {shard.index}"
    pump(scheduler, lambda: all(published.count(name) >= times for name in names))
    pump(scheduler, lambda: set(names) <= scheduler._dirty)
    return scheduler


def periodic_task(name: str):
    """The task's row as it is in the database now."""
    from django_celery_beat.models import PeriodicTask

    return PeriodicTask.objects.get(name=name)


def run_times(name: str) -> tuple[datetime | None, int]:
    """(last_run_at, total_run_count) of the task's row as it is in the database now."""
    row = periodic_task(name)
    return row.last_run_at, row.total_run_count


class DjangoCluster:
    """Replicas of the example project's beat (same image, same config) plus what they published."""

    def __init__(self, n: int, env: dict[str, str], log_dir: Path, extra_env: dict[str, str] | None = None) -> None:
        self.env = {**env, **(extra_env or {})}
        self.log_dir = log_dir
        self.redis = redis.Redis.from_url(env.get("ZKBEAT_TEST_RECORD_URL") or env["CELERY_BROKER_URL"])
        self.record_key = env["ZKBEAT_TEST_RECORD_KEY"]
        self.root = env["ZKBEAT_ROOT"]
        self.replicas: list[DjangoReplica] = []
        for _ in range(n):
            self._new()

    def _new(self) -> DjangoReplica:
        replica = DjangoReplica(f"replica-{len(self.replicas)}", self.env, self.log_dir)
        self.replicas.append(replica)
        return replica

    def start(self) -> DjangoCluster:
        for replica in self.replicas:
            replica.start()
        return self

    def add(self, extra_env: dict[str, str] | None = None) -> DjangoReplica:
        """One more replica; ``extra_env`` is its own (a database URL of its own, say)."""
        return self._new().start(extra_env)

    def stop(self) -> None:
        for replica in self.replicas:
            replica.stop()

    def publishes(self, entry: str | None = None) -> list[Publish]:
        return [p for p in read_publishes(self.redis, self.record_key) if entry is None or p.entry == entry]

    def replica(self, pid: int) -> DjangoReplica:
        return next(r for r in self.replicas if r.pid == pid)

    def logs(self, tail: int = 6000) -> str:
        return "\n".join(f"===== {r.identity} =====\n{r.log()[-tail:]}" for r in self.replicas)


@contextlib.contextmanager
def serve_project() -> Iterator[str]:
    """The configured Django project's WSGI app served by threads of this process on a free port; its URL.

    For a real browser on the admin: same process, same database and
    settings as the test's Django test client.
    """
    from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

    from django.contrib.staticfiles.handlers import StaticFilesHandler
    from django.core.wsgi import get_wsgi_application

    class Quiet(WSGIRequestHandler):
        def log_message(self, *args) -> None:
            pass

    class Threaded(WSGIServer):
        def process_request(self, request, client_address) -> None:
            threading.Thread(target=self._serve, args=(request, client_address), daemon=True).start()

        def _serve(self, request, client_address) -> None:
            try:
                self.finish_request(request, client_address)
            finally:
                self.shutdown_request(request)

    port = free_port()
    handler = StaticFilesHandler(get_wsgi_application())  # the admin's CSS and scripts, as runserver serves them
    server = make_server("127.0.0.1", port, handler, server_class=Threaded, handler_class=Quiet)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.shutdown()
        server.server_close()

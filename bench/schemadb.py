"""A PostgreSQL database of django-celery-beat rows for the database-schedule scenario.

The database is the example project's (``example_project/``), migrated once
per bench run, and filled by ``COPY`` (100,000 rows in about a second): the
rows are what a team's admin would hold, every one an interval task on one
shared ``IntervalSchedule``. Nothing here imports Django: the bench process
stays free of Django's settings, and every ``celery beat`` it starts is the
project's own.
"""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
import sys
import uuid
from datetime import datetime, timezone
from urllib.parse import urlsplit

import psycopg2

from bench.cluster import ROOT

EXAMPLE_PROJECT = ROOT / "example_project"
POSTGRES_URL = os.environ.get("ZKBEAT_TEST_POSTGRES", "postgres://postgres@127.0.0.1:5432")
#: What the scenario empties before each flavour's run.
TABLES = (
    "django_celery_beat_periodictask",
    "django_celery_beat_periodictasks",
    "django_celery_beat_intervalschedule",
)
#: The task every row sends (bench/djangoapp.py registers it).
TASK = "zkbench.noop"


def _connect(dbname: str):
    parts = urlsplit(POSTGRES_URL)
    connection = psycopg2.connect(
        host=parts.hostname or "127.0.0.1",
        port=parts.port or 5432,
        user=parts.username or "postgres",
        password=parts.password or None,
        dbname=dbname,
        connect_timeout=5,
    )
    connection.autocommit = True
    return connection


class ScheduleDatabase:
    """One database for the scenario: created and migrated on enter, dropped on exit."""

    def __init__(self) -> None:
        self.name = f"zkbench_{uuid.uuid4().hex[:12]}"
        self.url = f"{POSTGRES_URL.rstrip('/')}/{self.name}"

    def __enter__(self) -> ScheduleDatabase:
        admin = _connect("postgres")
        with admin.cursor() as cursor:
            cursor.execute(f'CREATE DATABASE "{self.name}"')
        admin.close()
        subprocess.run(
            [sys.executable, "-m", "django", "migrate", "--verbosity", "0"],
            cwd=ROOT,
            env={**os.environ, **self.env()},
            check=True,
        )
        return self

    def __exit__(self, *exc: object) -> None:
        admin = _connect("postgres")
        with admin.cursor() as cursor:
            cursor.execute(f'DROP DATABASE IF EXISTS "{self.name}" WITH (FORCE)')
        admin.close()

    def env(self) -> dict[str, str]:
        """What a process of the example project needs to run on this database."""
        return {
            "DATABASE_URL": self.url,
            "DJANGO_SETTINGS_MODULE": "proj.settings",
            "DJANGO_DEBUG": "0",  # DEBUG keeps every query in memory
            "PYTHONPATH": f"{ROOT}{os.pathsep}{EXAMPLE_PROJECT}",
        }

    def fill(self, count: int, every: int, last_run_at: datetime, prefix: str = "row") -> None:
        """Replace every row with ``count`` interval tasks every ``every`` s that last ran at ``last_run_at``."""
        now = datetime.now(timezone.utc).isoformat()
        last = last_run_at.isoformat()
        with contextlib.closing(_connect(self.name)) as connection, connection.cursor() as cursor:
            cursor.execute(f"TRUNCATE {', '.join(TABLES)} RESTART IDENTITY CASCADE")
            cursor.execute(
                "INSERT INTO django_celery_beat_intervalschedule (every, period) VALUES (%s, 'seconds') RETURNING id",
                [every],
            )
            interval = cursor.fetchone()[0]
            data = io.StringIO()
            for i in range(count):
                data.write(f"{prefix}-{i:06d}\t{TASK}\t[]\t{{}}\t{{}}\tt\t{last}\t0\t{now}\t\t{interval}\tf\n")
            data.seek(0)
            cursor.copy_from(
                data,
                "django_celery_beat_periodictask",
                columns=(
                    "name", "task", "args", "kwargs", "headers", "enabled", "last_run_at", "total_run_count",
                    "date_changed", "description", "interval_id", "one_off",
                ),
            )  # fmt: skip
            cursor.execute("ANALYZE django_celery_beat_periodictask")

    def count(self) -> int:
        with contextlib.closing(_connect(self.name)) as connection, connection.cursor() as cursor:
            cursor.execute("SELECT count(*) FROM django_celery_beat_periodictask")
            return cursor.fetchone()[0]

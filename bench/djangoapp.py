"""The example project's Celery app as the database-schedule scenario runs it.

``celery -A bench.djangoapp beat --scheduler zkbeat.DatabaseScheduler`` (or
django-celery-beat's own scheduler): the project's app, configured from
Django's settings as in production, plus what every benchmarked process
has (bench/app.py): log lines with ``%(created).6f`` timestamps, and each
publish appended to ``BENCH_RECORD_DIR/<pid>.tsv`` from
``before_task_publish``. The entry is read from the message's
``periodic_task_name`` header, which django-celery-beat's entries carry
under both schedulers.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from celery.signals import before_task_publish

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "example_project"))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "proj.settings")
if os.environ.get("BENCH_IDENTITY"):
    os.environ["ZKBEAT_IDENTITY"] = os.environ["BENCH_IDENTITY"]
if os.environ.get("BENCH_ROOT"):
    os.environ["ZKBEAT_ROOT"] = os.environ["BENCH_ROOT"]

from proj.celery import app  # noqa: E402 - the project's settings read the environment above

__all__ = ["app"]

#: bench/app.py's format (not imported: that module builds an app of its own).
LOG_FORMAT = "[%(created).6f %(process)d %(levelname)s %(name)s] %(message)s"

# The rows are the whole schedule: none of the project's own entries is upserted beside them.
app.conf.update(worker_log_format=LOG_FORMAT, worker_task_log_format=LOG_FORMAT, beat_schedule={})
if os.environ.get("BENCH_SHARDS"):  # bench/database.py's sharded rows (BENCH_DATABASE_SHARDS)
    app.conf.zkbeat_shards = int(os.environ["BENCH_SHARDS"])


@app.task(name="zkbench.noop")
def noop() -> None:
    """What every row sends; no worker runs it."""


_record_dir = os.environ.get("BENCH_RECORD_DIR")
_record = None


@before_task_publish.connect
def _record_publish(headers=None, **kwargs) -> None:
    """Append (entry, pid, wall time) the moment beat hands a tick to kombu."""
    global _record
    if _record_dir is None:
        return
    if _record is None:
        _record = open(os.path.join(_record_dir, f"{os.getpid()}.tsv"), "a", buffering=1)  # noqa: SIM115
    entry = (headers or {}).get("periodic_task_name", "?")
    _record.write(f"{entry}\t{os.getpid()}\t{time.time():.6f}\n")

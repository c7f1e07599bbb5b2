"""The Celery app every benchmarked ``celery beat`` process runs.

One module for all three schedulers (zkbeat, Celery's PersistentScheduler,
celery-redbeat), so what differs between them in the table is the scheduler
and nothing else. Everything comes from the environment:

``BENCH_BROKER``         Redis URL of the broker (redbeat keeps its state there too)
``BENCH_ENTRIES``        JSON list of ``{"name", "count", "every", "first_due"?}``
                         groups; ``count`` > 1 makes ``name-00000`` ... ``name-NNNNN``.
                         ``first_due`` (epoch seconds) sets ``last_run_at`` so that
                         the whole group comes due at that one moment.
``BENCH_RECORD_DIR``     where each process appends its publishes (``<pid>.tsv``)
``BENCH_ROOT``           zkbeat root / redbeat key prefix, unique per run
``BENCH_MAX_INTERVAL``   ``beat_max_loop_interval`` (unset: the scheduler's default)
``BENCH_LOCK_TIMEOUT``   ``redbeat_lock_timeout`` (unset: redbeat's default)
``BENCH_SESSION_TIMEOUT`` ``zkbeat_session_timeout``
``BENCH_LIVENESS``       ``zkbeat_liveness`` (``1``/``0``; unset: zkbeat's default, on)
``BENCH_STALL_TIMEOUT``  ``zkbeat_stall_timeout``
``BENCH_BROKER_HANDOVER`` ``zkbeat_broker_handover_timeout``
``BENCH_COUNT_ZK``       count every ZooKeeper request this process sends (not pings),
                         by type, into ``<pid>.zk.json`` beside the publish records

Publishes are recorded where they happen: ``before_task_publish`` appends
``entry, pid, time.time()`` to a per-process file, one ``write`` per line, so a
kill -9 loses nothing already recorded and no process waits on a network
round trip to record (the same small cost for every scheduler). Log lines carry
``%(created).6f`` so the harness can read leadership edges to the microsecond.
"""

from __future__ import annotations

import json
import os
import time
from datetime import datetime, timedelta, timezone

from celery import Celery
from celery.signals import before_task_publish

LOG_FORMAT = "[%(created).6f %(process)d %(levelname)s %(name)s] %(message)s"

app = Celery("zkbench")
app.conf.update(
    broker_url=os.environ["BENCH_BROKER"],
    broker_connection_retry_on_startup=True,
    worker_log_format=LOG_FORMAT,
    worker_task_log_format=LOG_FORMAT,
    zkbeat_root=os.environ.get("BENCH_ROOT", "/zkbench"),
    zkbeat_identity=os.environ.get("BENCH_IDENTITY"),
    zkbeat_session_timeout=float(os.environ.get("BENCH_SESSION_TIMEOUT", "10")),
    redbeat_redis_url=os.environ["BENCH_BROKER"],
    redbeat_key_prefix=os.environ.get("BENCH_ROOT", "/zkbench") + ":",
)
if os.environ.get("BENCH_MAX_INTERVAL"):
    app.conf.beat_max_loop_interval = float(os.environ["BENCH_MAX_INTERVAL"])
if os.environ.get("BENCH_LIVENESS"):
    app.conf.zkbeat_liveness = os.environ["BENCH_LIVENESS"] == "1"
if os.environ.get("BENCH_STALL_TIMEOUT"):
    app.conf.zkbeat_stall_timeout = float(os.environ["BENCH_STALL_TIMEOUT"])
if os.environ.get("BENCH_BROKER_HANDOVER"):
    app.conf.zkbeat_broker_handover_timeout = float(os.environ["BENCH_BROKER_HANDOVER"])
if os.environ.get("BENCH_LOCK_TIMEOUT"):
    app.conf.redbeat_lock_timeout = int(os.environ["BENCH_LOCK_TIMEOUT"])


def _schedule(groups: list[dict]) -> dict[str, dict]:
    schedule = {}
    for group in groups:
        every = float(group["every"])
        count = int(group.get("count", 1))
        names = [group["name"]] if count == 1 else [f"{group['name']}-{i:05d}" for i in range(count)]
        extra = {}
        if group.get("first_due") is not None:
            first_due = datetime.fromtimestamp(float(group["first_due"]), timezone.utc)
            extra["last_run_at"] = first_due - timedelta(seconds=every)
        for name in names:
            schedule[name] = {"task": "zkbench.noop", "schedule": timedelta(seconds=every), "args": (name,), **extra}
    return schedule


app.conf.beat_schedule = _schedule(json.loads(os.environ.get("BENCH_ENTRIES", "[]")))


@app.task(name="zkbench.noop")
def noop(name: str) -> str:
    return name


_record_dir = os.environ.get("BENCH_RECORD_DIR")
_record = None


@before_task_publish.connect
def _record_publish(body=None, **kwargs) -> None:
    """Append (entry, pid, wall time) the moment beat hands a tick to kombu."""
    global _record
    if _record_dir is None:
        return
    if _record is None:
        _record = open(os.path.join(_record_dir, f"{os.getpid()}.tsv"), "a", buffering=1)  # noqa: SIM115
    try:
        entry = body[0][0]
    except (TypeError, IndexError, KeyError):
        entry = "?"
    _record.write(f"{entry}\t{os.getpid()}\t{time.time():.6f}\n")


def _count_zookeeper_requests(record_dir: str) -> None:
    """Wrap kazoo's request queue to count requests by type (pings bypass it).

    ZooKeeper's own counters include pings, whose timing kazoo jitters at
    random, so "no traffic beyond pings" is counted here, exactly.
    """
    from collections import Counter

    from kazoo.client import KazooClient

    counts: Counter[str] = Counter()
    path = os.path.join(record_dir, f"{os.getpid()}.zk.json")
    original = KazooClient._call

    def counting_call(self, request, async_object):
        counts[type(request).__name__] += 1
        with open(path + ".tmp", "w") as out:
            json.dump(counts, out)
        os.replace(path + ".tmp", path)
        return original(self, request, async_object)

    KazooClient._call = counting_call


if os.environ.get("BENCH_COUNT_ZK") and _record_dir:
    _count_zookeeper_requests(_record_dir)

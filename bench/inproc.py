"""One zkbeat leader driven in this process: its CPU per publish, and the part of it the publish takes.

``python -m bench.inproc steady`` runs 1,000 ``beat_schedule`` entries every
5 s for a 20 s window; ``python -m bench.inproc burst`` makes 10,000 entries
due at one moment. ZooKeeper and Redis come from tests/support/servers.py;
a ``before_task_publish`` receiver records each publish, as bench/app.py's
does. CPU is ``time.process_time()`` (all threads) and
``time.thread_time()`` (beat's loop), and the time spent inside the
publisher's calls is summed apart. ``--per-message`` forces the path
RabbitMQ and older kombu take (zkbeat.leading.batch_publish.can_batch answers
False), to compare. No number here is a sleep; the machine's load moves
wall times, CPU times much less.

``--entries N`` sets the size; ``burst --every S --rounds 2`` publishes a
second round S seconds after each entry's first (every tick an entry's later
one: the steady state), whose CPU per 1,000 and lateness (publish minus the
tick's slot) are printed apart. The heap's ``is_due()`` answers in the
window (due / not yet) are counted. The time spent in the fenced claims (wall,
and CPU of beat's loop) and Python's garbage collections by generation are
printed too; ``--profile FILE`` writes a cProfile of the window (``--profile-round
N``: from round N's first publish on). Past 20,000
entries ZooKeeper gets a 2 GB heap (the tests' 256 MB runs out).

``--no-receiver`` connects no ``before_task_publish`` receiver and counts
the messages on Redis's queue after each pass instead: what a leader costs
an app without receivers (the recording receiver makes every message take
the path that hands receivers copies of their own). A burst's "all
published" is then the end of the pass that queued the last message.

``--database`` makes the entries django-celery-beat rows on PostgreSQL
(bench/schemadb.py: a database of its own, dropped at the end; the example
project's settings) led by ``zkbeat.DatabaseScheduler`` instead of
``beat_schedule`` entries led by ``zkbeat.Scheduler``.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import logging
import os
import sys
import tempfile
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

from celery import Celery
from celery.signals import before_task_publish

from tests.support import servers
from tests.support.servers import RedisServer, ZooKeeperServer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("scenario", choices=["steady", "burst"])
    parser.add_argument("--entries", type=int, help="entries (default 1,000 steady, 10,000 burst)")
    parser.add_argument("--per-message", action="store_true", help="force the per-message publish path")
    parser.add_argument("--every", type=float, help="burst: the entries' period in seconds (default 3,600)")
    parser.add_argument("--rounds", type=int, default=1, help="burst: rounds to publish (the second and later: steady)")
    parser.add_argument("--profile", metavar="FILE", help="write a cProfile of the window (beat's loop) to FILE")
    parser.add_argument("--profile-round", type=int, default=1, help="profile from this round's first publish on")
    parser.add_argument("--database", action="store_true", help="django-celery-beat rows on PostgreSQL instead")
    parser.add_argument(
        "--no-receiver", action="store_true", help="burst: count the messages on Redis, with no receiver connected"
    )
    args = parser.parse_args()
    steady = args.scenario == "steady"
    count = args.entries or (1000 if steady else 10000)
    every = 5.0 if steady else args.every or 3600.0
    rounds = 1 if steady else max(1, args.rounds)
    logs = Path(tempfile.mkdtemp(prefix="zkbench-inproc-"))
    logging.basicConfig(
        level=logging.INFO,
        filename=logs / "beat.log",
        format="[%(created).6f %(process)d %(levelname)s %(name)s] %(message)s",
    )
    import zkbeat.leading.publisher as publisher_module
    from zkbeat import Scheduler

    if args.per_message:
        publisher_module.can_batch = lambda app, producer: False
    spent = [0.0]
    for name in ("publish", "publish_many"):
        original = getattr(publisher_module.Publisher, name)

        def timed(*a, _original=original, **k):
            started = time.thread_time()
            try:
                return _original(*a, **k)
            finally:
                spent[0] += time.thread_time() - started

        setattr(publisher_module.Publisher, name, timed)

    import zkbeat.ledger.store as ledger_module

    claiming = [0.0, 0.0]  # wall, CPU of beat's loop inside the fenced claims (sending them, waiting for them)
    for owner, name in ((ledger_module.Ledger, "start_claim"), (ledger_module.ClaimInFlight, "result")):
        original = getattr(owner, name)

        def timed_claim(*a, _original=original, **k):
            started, cpu_started = time.perf_counter(), time.thread_time()
            try:
                return _original(*a, **k)
            finally:
                claiming[0] += time.perf_counter() - started
                claiming[1] += time.thread_time() - cpu_started

        setattr(owner, name, timed_claim)
    collecting = {"started": 0.0, "spent": [0.0, 0.0, 0.0], "count": [0, 0, 0]}

    def _collecting(phase: str, info: dict) -> None:
        if phase == "start":
            collecting["started"] = time.perf_counter()
        else:
            collecting["spent"][info["generation"]] += time.perf_counter() - collecting["started"]
            collecting["count"][info["generation"]] += 1

    gc.callbacks.append(_collecting)
    published = [0]
    last_publish = [0.0]
    record = (logs / "publishes.tsv").open("a", buffering=1)

    profiler: list = [None]
    late: list[list[float]] = [[] for _ in range(rounds + 1)]  # publish - slot, by round (1-based)
    round_cpu: dict[int, float] = {}  # process CPU when each round's first publish came

    def _record(body=None, headers=None, **kwargs) -> None:
        round_ = published[0] // count + 1
        if round_ not in round_cpu:
            round_cpu[round_] = time.process_time()
            if round_ == args.profile_round and profiler[0] is not None:
                profiler[0].enable()
        slot = (headers or {}).get("zkbeat-slot")
        if slot and round_ <= rounds:
            late[round_].append(time.time() - datetime.fromisoformat(slot).timestamp())
        published[0] += 1
        last_publish[0] = time.time()
        name = (headers or {}).get("periodic_task_name") or body[0][0]
        record.write(f"{name}\t{time.time():.6f}\n")

    if not args.no_receiver:
        before_task_publish.connect(_record, weak=False)
    # The tests' ZooKeeper has a 256 MB heap: a 100,000-entry ledger and its writes exhaust it.
    heap_mb = 2048 if count > 20000 else servers.DEFAULT_HEAP_MB
    zk, redis_server = ZooKeeperServer(heap_mb=heap_mb).start(), RedisServer().start()
    scheduler = None
    rows = contextlib.ExitStack()
    try:
        due = datetime.now(timezone.utc) + timedelta(seconds=5 if steady else 8)
        app = Celery("zkbench-inproc", set_as_current=False)
        app.conf.update(broker_url=redis_server.url, zkbeat_hosts=zk.hosts, zkbeat_root="/zkbench-inproc")
        if args.database:
            scheduler_class = _database(rows, app, count, every, due)
        else:
            app.conf.beat_schedule = {
                f"e-{i:05d}": {
                    "task": "zkbench.noop",
                    "schedule": timedelta(seconds=every),
                    "args": (f"e-{i:05d}",),
                    "last_run_at": due - timedelta(seconds=every),
                }
                for i in range(count)
            }
            scheduler_class = Scheduler
        scheduler = scheduler_class(app)
        assert scheduler.election.wait_for_leadership(timeout=30), "never led"
        asked = {True: 0, False: 0}  # the heap's is_due answers in the window: due, not due yet
        ask = scheduler.ask

        def counted_ask(entry):
            answer = ask(entry)
            asked[bool(answer.is_due)] += 1
            return answer

        scheduler.ask = counted_ask

        queue = None
        if args.no_receiver:
            import redis

            queue = redis.Redis.from_url(redis_server.url)

        def run_until(stop) -> None:
            while not stop():
                interval = scheduler.tick() or 0.0
                if queue is not None:
                    queued = queue.llen("celery")
                    if queued > published[0]:
                        published[0], last_publish[0] = queued, time.time()
                time.sleep(min(interval, 0.05 if not steady else 0.5))

        if steady:
            run_until(lambda: time.time() > due.timestamp() + every + 1)  # the first round
        else:
            run_until(lambda: time.time() > due.timestamp() - 0.5)
        if args.profile:
            import cProfile

            profiler[0] = cProfile.Profile()
            if args.profile_round <= 1:
                profiler[0].enable()
        cpu, main, before, spent[0] = time.process_time(), time.thread_time(), published[0], 0.0
        collecting["spent"], collecting["count"] = [0.0, 0.0, 0.0], [0, 0, 0]
        claiming[:] = [0.0, 0.0]
        asked[True] = asked[False] = 0
        window_started = time.perf_counter()
        if steady:
            window_end = time.time() + 20
            run_until(lambda: time.time() > window_end)
        else:
            limit = due.timestamp() + 300 + every * (rounds - 1)
            run_until(lambda: published[0] >= count * rounds or time.time() > limit)
        cpu, main, done = time.process_time() - cpu, time.thread_time() - main, published[0] - before
        if profiler[0] is not None:
            profiler[0].disable()
            profiler[0].dump_stats(args.profile)
        collected = ", ".join(
            f"gen {g}: {n} in {t:.2f} s" for g, (n, t) in enumerate(zip(collecting["count"], collecting["spent"]))
        )
        wall = "" if steady else f"; all published {last_publish[0] - due.timestamp():.2f} s after the due moment"
        for round_ in range(2, rounds + 1):
            got = sorted(late[round_])
            if got:
                ended = round_cpu.get(round_ + 1, time.process_time())
                wall += (
                    f"; round {round_}: {len(got)} published, CPU per 1,000 "
                    f"{(ended - round_cpu[round_]) * 1e6 / len(got):.1f} ms, lateness p50 {got[len(got) // 2]:.2f} s, "
                    f"p99 {got[min(len(got) - 1, int(len(got) * 0.99))]:.2f} s, max {got[-1]:.2f} s"
                )
        wall += (
            f"; window {time.perf_counter() - window_started:.2f} s, of it in the fenced claims "
            f"{claiming[0]:.2f} s ({claiming[1]:.2f} s of it CPU)"
        )
        path = "per message" if args.per_message else "as zkbeat chooses"
        per = 1e6 / max(done, 1)
        print(
            f"{args.scenario}, {count} entries, {path}: {done} published; CPU per 1,000: {cpu * per:.1f} ms "
            f"(beat's loop {main * per:.1f} ms, of it publishing {spent[0] * per:.1f} ms); "
            f"leader CPU {cpu:.2f} s{wall}; is_due answers due / not yet {asked[True]} / {asked[False]}; "
            f"garbage collections {collected}; logs in {logs}"
        )
    finally:
        if scheduler is not None:
            scheduler.close()
        rows.close()
        zk.stop()
        redis_server.stop()


def _database(stack: contextlib.ExitStack, app: Celery, count: int, every: float, due: datetime) -> type:
    """``count`` django-celery-beat rows due at ``due`` in a database of their own; zkbeat.DatabaseScheduler."""
    import django

    from bench.schemadb import EXAMPLE_PROJECT, ScheduleDatabase

    db = stack.enter_context(ScheduleDatabase())
    os.environ.update(db.env())
    if str(EXAMPLE_PROJECT) not in sys.path:
        sys.path.insert(0, str(EXAMPLE_PROJECT))
    django.setup()
    stack.callback(_close_connections)
    db.fill(count, int(every), due - timedelta(seconds=every))
    app.conf.update(beat_schedule={}, zkbeat_stall_timeout=300)  # a 100,000-row read is not a hung leader
    app.task(name="zkbench.noop")(lambda: None)
    from zkbeat.contrib.django import DatabaseScheduler

    return DatabaseScheduler


def _close_connections() -> None:
    from django.db import connections

    connections.close_all()  # before the database is dropped


if __name__ == "__main__":
    main()

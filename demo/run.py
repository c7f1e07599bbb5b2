"""The demo's script: servers, the example project, three replicas, two faults, the table."""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterable
from datetime import datetime, timedelta
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from demo.cluster import BEAT_COMMAND, EXAMPLE_PROJECT, ROOT, WORKER_COMMAND, Child, Event, parse
from demo.report import Handover, duration, format_table, rows
from tests.support.helpers import wait_for
from tests.support.servers import RedisServer, ZooKeeperServer

WORKDIR = ROOT / ".demo"
SESSION_TIMEOUT = 3.0
FAST_ENTRIES = ("cleanup-messages", "aggregate-analytics", "expire-sessions")


class DemoError(Exception):
    """Something the demo needs did not happen; the message says what."""


class Demo:
    def __init__(self, replicas: int, broker: str | None = None, workdir: Path = WORKDIR) -> None:
        self.n = replicas
        #: A broker the user runs (e.g. RabbitMQ); None: a private Redis, started and stopped here.
        self.broker = broker
        #: The SQLite database and the processes' logs.
        self.workdir = workdir
        self.started = time.time()
        self.servers: list[ZooKeeperServer | RedisServer] = []
        self.worker: Child | None = None
        self.beats: list[Child] = []
        self.events: list[Event] = []
        self.leader: str | None = None
        self.handovers: list[Handover] = []

    # -- narration ---------------------------------------------------------

    def say(self, text: str, at: float | None = None) -> None:
        print(f"{(at or time.time()) - self.started:6.1f}s  {text}", flush=True)

    def tell(self, event: Event) -> None:
        if event.kind == "publish":
            late = event.at - event.slot.timestamp()
            note = f"  (due {late:.1f} s ago: caught up once)" if late > 1.0 else ""
            slot = event.slot.astimezone().strftime("%H:%M:%S.%f")[:-3]
            self.say(f"  {event.replica} -> {event.entry:<26} slot {slot}{note}", event.at)
        elif event.kind == "leader":
            self.say(f"{event.replica} is leader (epoch {event.epoch})", event.at)
        elif event.kind == "stopped":
            self.say(f"{event.replica} stopped leading: {event.text}", event.at)
        else:
            self.say(f"{event.replica}: {event.text}", event.at)

    def watch(self, until: Callable[[], object], timeout: float, what: str) -> object:
        """Narrate the replicas' logs until ``until()`` is truthy; DemoError after ``timeout``."""
        deadline = time.monotonic() + timeout
        while True:
            fresh = sorted((e for b in self.beats for line in b.new_lines() if (e := parse(b.name, line))),
                           key=lambda e: e.at)  # fmt: skip
            for event in fresh:
                self.events.append(event)
                if event.kind == "leader":
                    self.leader = event.replica
                elif event.kind == "stopped" and event.replica == self.leader:
                    self.leader = None
                self.tell(event)
            result = until()
            if result:
                return result
            if time.monotonic() > deadline:
                raise DemoError(f"{what} did not happen within {timeout:g} s")
            time.sleep(0.05)

    def run_for(self, seconds: float) -> None:
        end = time.monotonic() + seconds
        self.watch(lambda: time.monotonic() >= end, seconds + 5, "waiting")

    # -- the story ---------------------------------------------------------

    def run(self) -> int:
        print("zkbeat demo: 3 `celery beat` replicas of example_project, one ZooKeeper election, one publisher.\n")
        env = self.start_servers()
        self.prepare_project(env)
        self.start_processes(env)
        self.watch(lambda: self.leader, 90, "a leader")
        followers = [b.name for b in self.beats if b.name != self.leader]
        self.say(f"{' and '.join(followers)} follow: each waits on a ZooKeeper watch of the one ahead of it")

        from jobs.models import Broadcast

        broadcast = Broadcast.objects.create(subject="Spring sale", send_at=_now() + timedelta(seconds=8))
        self.say(f'a broadcast "{broadcast.subject}" is scheduled as a one-off task for 8 s from now')
        sent = self.watch(lambda: self.published(broadcast.task_name), 40, "the broadcast")

        victim = self.beat(sent.replica)
        killed_at = time.time()
        victim.signal(signal.SIGKILL)
        self.say(f"kill -9 {victim.name} (pid {victim.pid}), right after it sent the broadcast; its database row "
                 "still says 'not sent'")  # fmt: skip
        self.await_heir("kill -9", victim.name, killed_at, SESSION_TIMEOUT + 20)
        self.run_for(10)

        victim = self.beat(self.leader)
        stopped_at = time.time()
        victim.signal(signal.SIGTERM)
        self.say(f"SIGTERM {victim.name} (pid {victim.pid}): a graceful stop deletes its election znode first")
        self.await_heir("SIGTERM", victim.name, stopped_at, 20)
        self.run_for(8)

        self.say("stopping the replicas; the worker finishes what was published")
        for beat in self.beats:
            beat.stop()
        self.watch(lambda: True, 1, "the last log lines")
        return self.summary(broadcast)

    def await_heir(self, cause: str, old: str, since: float, timeout: float) -> None:
        def heir_leads() -> Event | None:
            return next((e for e in self.events if e.kind == "leader" and e.at > since and e.replica != old), None)

        heir = self.watch(heir_leads, timeout, f"a new leader after {cause}")
        self.handovers.append(Handover(cause, old, heir.replica, heir.at - since))
        took = heir.at - since
        how = ""
        if cause == "kill -9":
            how = (" (the kernel closed the killed process's liveness socket)" if took < SESSION_TIMEOUT else
                   f" (its liveness socket was not watched yet: ZooKeeper saw the crash when the {SESSION_TIMEOUT:g} s "
                   "session expired)")  # fmt: skip
        self.say(f"{heir.replica} took over {duration(took)} after the {cause}{how}", heir.at)

    def published(self, entry: str) -> Event | None:
        return next((e for e in self.events if e.kind == "publish" and e.entry == entry), None)

    def beat(self, name: str | None) -> Child:
        return next(b for b in self.beats if b.name == name)

    # -- set-up ------------------------------------------------------------

    def start_servers(self) -> dict[str, str]:
        """ZooKeeper, and Redis as the broker unless the user named one (Redis is needed for nothing else)."""
        zookeeper = ZooKeeperServer(tick_time=500)
        self.servers.append(zookeeper)
        zookeeper.launch()
        if self.broker is None:
            redis_server = RedisServer()
            self.servers.append(redis_server)
            redis_server.launch()
            redis_server.wait_ready()
            broker, shown = redis_server.url, f"Redis on {redis_server.url}"
        else:
            broker, shown = self.broker, f"the broker at {_redacted(self.broker)}"
        zookeeper.wait_ready()
        self.say(f"ZooKeeper on {zookeeper.hosts} and {shown} are up")
        env = {key: value for key, value in os.environ.items() if key != "DATABASE_URL"}
        env.update(
            DJANGO_SETTINGS_MODULE="proj.settings",
            PROJ_SQLITE_PATH=str(self.workdir / "db.sqlite3"),
            PROJ_FAST_SCHEDULE="1",
            CELERY_BROKER_URL=broker,
            ZKBEAT_HOSTS=zookeeper.hosts,
            ZKBEAT_SESSION_TIMEOUT=str(SESSION_TIMEOUT),
            PYTHONPATH=os.pathsep.join([str(EXAMPLE_PROJECT), str(ROOT)]),
        )
        return env

    def prepare_project(self, env: dict[str, str]) -> None:
        os.environ.update(env)
        sys.path.insert(0, str(EXAMPLE_PROJECT))
        import django
        from django.core.management import call_command

        django.setup()
        call_command("migrate", verbosity=0)
        self.say(f"example_project migrated (SQLite: {_shown(self.workdir / 'db.sqlite3')}); its jobs run "
                 "every 2, 3 and 5 s (PROJ_FAST_SCHEDULE=1)")  # fmt: skip

    def start_processes(self, env: dict[str, str]) -> None:
        self.worker = Child("worker", WORKER_COMMAND, env, self.workdir).start()
        for i in range(1, self.n + 1):
            name = f"beat-{i}"
            self.beats.append(Child(name, BEAT_COMMAND, {**env, "ZKBEAT_IDENTITY": name}, self.workdir).start())
        self.say(f"started a worker and {self.n} replicas of: {' '.join(BEAT_COMMAND)}")

    # -- the end -----------------------------------------------------------

    def summary(self, broadcast) -> int:
        from django_celery_beat.models import PeriodicTask
        from jobs.models import Broadcast, JobRun

        publishes = [e for e in self.events if e.kind == "publish"]
        self.wait_for_worker(JobRun, len(publishes))
        runs: dict[str, Counter] = {}
        for periodic_task, slot in JobRun.objects.values_list("periodic_task", "slot"):
            runs.setdefault(periodic_task, Counter())[datetime.fromisoformat(slot).isoformat() if slot else ""] += 1
        intervals: dict[str, float | None] = {}
        for task in PeriodicTask.objects.filter(name__in=[*FAST_ENTRIES, broadcast.task_name]).select_related(
            "interval"
        ):
            intervals[task.name] = task.interval.schedule.run_every.total_seconds() if task.interval else None
        intervals = {name: intervals[name] for name in [*FAST_ENTRIES, broadcast.task_name] if name in intervals}
        leaders = []
        for event in self.events:
            if event.kind == "leader":
                count = len([p for p in publishes if p.epoch == event.epoch])
                leaders.append((event.replica, event.epoch, count))
        table = rows(publishes, runs, intervals)
        print()
        print(format_table(table, self.handovers, leaders))
        sent = Broadcast.objects.get(pk=broadcast.pk).times_sent
        twice = sum(r.twice for r in table)
        print(f'\nthe broadcast "{broadcast.subject}" went out {sent} time(s); ticks published twice: {twice}')
        for line in self.crash_story(sum(r.missed or 0 for r in table), intervals.values()):
            print(line)
        return 0 if twice == 0 and sent == 1 else 1

    def crash_story(self, missed: int, intervals: Iterable[float | None] = ()) -> list[str]:
        """What the kill -9 cost, as this run shows it (``intervals``: the entries' periods in seconds)."""
        crash = next((h for h in self.handovers if h.cause == "kill -9"), None)
        if crash is None:
            return []
        if crash.seconds < SESSION_TIMEOUT:
            seen = (f"the kill -9 was seen through the killed replica's liveness socket, which the kernel closed: "
                    f"{crash.new} led {duration(crash.seconds)} later, without waiting for its "
                    f"{SESSION_TIMEOUT:g} s ZooKeeper session to expire.")  # fmt: skip
        else:
            seen = (f"the kill -9 was seen when the killed replica's {SESSION_TIMEOUT:g} s ZooKeeper session expired "
                    "(its follower was not watching its liveness socket yet).")  # fmt: skip
        if missed and crash.seconds < min((every for every in intervals if every), default=0.0):
            # A handover shorter than every interval skips none of them: Celery runs what came due in it once, late.
            cost = (f"{missed} tick(s) never ran: the killed leader had claimed them in ZooKeeper and died before "
                    "handing them to the broker; a claimed tick is never sent again (at most once: docs/guarantees.md, "
                    "kill -9 while a batch is being sent).")  # fmt: skip
        elif missed:
            cost = (f"{missed} tick(s) never ran: they came due during a handover, and Celery runs what came due "
                    "in a gap once, late (set zkbeat_misfire_grace_time to skip instead).")  # fmt: skip
        else:
            cost = "no tick was missed."
        return [seen, cost]

    def wait_for_worker(self, job_run, expected: int, timeout: float = 30) -> None:
        wait_for(lambda: job_run.objects.count() >= expected, timeout, 0.2, raise_on_timeout=False)

    def cleanup(self) -> None:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        for child in [*self.beats, self.worker]:
            if child is not None:
                child.stop()
        for server in self.servers:
            server.close()
        with_django = "django" in sys.modules
        if with_django:
            from django.db import connections

            connections.close_all()
        print(f"\nstopped everything the demo started; logs are in {_shown(self.workdir)}/", flush=True)


def _shown(path: Path) -> str:
    """``path`` as the narration names it: from the repository's root when it is inside."""
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def _redacted(url: str) -> str:
    """``url`` without its password, for the narration."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return urlunsplit(parts._replace(netloc=netloc))


def _now() -> datetime:
    from django.utils import timezone

    return timezone.now()


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def options(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line; the broker defaults to $BROKER (what ``make demo BROKER=...`` sets), empty meaning none."""
    parser = argparse.ArgumentParser(prog="python -m demo", description=__doc__)
    parser.add_argument("--replicas", type=int, default=3, help="beat replicas to start (at least 3)")
    parser.add_argument(
        "--broker",
        default=os.environ.get("BROKER") or None,
        help="a running broker to use, e.g. amqp://guest:guest@127.0.0.1:5672// (default: $BROKER, "
        "else a private Redis the demo starts)",
    )
    args = parser.parse_args(argv)
    if args.replicas < 3:
        parser.error("the story needs 3 replicas: one to kill, one to stop, one to finish")
    return args


def main(argv: list[str] | None = None) -> int:
    args = options(argv)
    shutil.rmtree(WORKDIR, ignore_errors=True)
    WORKDIR.mkdir()
    demo = Demo(args.replicas, args.broker)
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        return demo.run()
    except KeyboardInterrupt:
        print("\ninterrupted", flush=True)
        return 130
    except (DemoError, RuntimeError) as exc:
        print(f"\ndemo failed: {exc}", file=sys.stderr)
        for child in [*demo.beats, demo.worker]:
            if child is not None:
                print(f"--- {child.name} ---\n{child.tail(15)}", file=sys.stderr)
        return 1
    finally:
        demo.cleanup()

"""Real ``celery beat`` replicas for the process tests, and the record of what they published.

A replica is a separate ``celery -A tests.support.beatapp beat --scheduler
zkbeat.Scheduler`` process; tests send it real signals (SIGKILL, SIGTERM,
SIGSTOP/SIGCONT) and read what every replica published from Redis.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import redis

ROOT = Path(__file__).resolve().parents[2]
#: Seconds; with tickTime 500 ms the server sees a dead replica's session end after ~2-2.5 s.
SESSION = 2.0
#: What the process tests' replicas run unless a test says otherwise: {entry: interval in seconds}.
ENTRIES = {"alpha": 1, "beta": 1, "gamma": 1}


@dataclass
class Publish:
    entry: str
    slot: datetime
    epoch: int
    pid: int
    identity: str
    at: float
    task_id: str
    #: The trigger request of a run-now (header zkbeat-manual); None for a scheduled tick.
    manual: str | None = None


def leader_epochs(logs: Iterable[str]) -> set[int]:
    """The epochs whose leadership the replicas' logs announce.

    A connection blip that keeps the session logs "became leader" again in
    the same epoch; leadership that moves (ping-pong included) changes it.
    """
    return {int(epoch) for log in logs for epoch in re.findall(r"zkbeat: became leader \(epoch (\d+)\)", log)}


def record_publishes(url: str, key: str, identity: str | None) -> None:
    """In a beat replica: append every message it hands to the broker to the Redis list ``key``.

    ``after_task_publish`` fires once the message is with the broker, which is
    what the tests count; :func:`read_publishes` reads the list back.
    """
    from celery.signals import after_task_publish

    client = redis.Redis.from_url(url)

    def record(headers=None, **kwargs) -> None:
        headers = headers or {}
        row = {
            "entry": headers.get("zkbeat-entry"),
            "slot": headers.get("zkbeat-slot"),
            "epoch": headers.get("zkbeat-epoch"),
            "task_id": headers.get("id"),
            "manual": headers.get("zkbeat-manual"),
            "pid": os.getpid(),
            "identity": identity,
            "at": time.time(),
        }
        client.rpush(key, json.dumps(row))

    after_task_publish.connect(record, weak=False)


def read_publishes(client: redis.Redis, key: str) -> list[Publish]:
    """What the replicas recorded under ``key`` (:func:`record_publishes`), in publish order."""
    rows = [json.loads(raw) for raw in client.lrange(key, 0, -1)]
    return [
        Publish(
            r["entry"],
            datetime.fromisoformat(r["slot"]),
            r["epoch"],
            r["pid"],
            r["identity"],
            r["at"],
            r["task_id"],
            r.get("manual"),
        )
        for r in rows
    ]


class LoggedProcess:
    """A child process in its own session, its output appended to a log file.

    The shared shape of a beat replica in the tests, the demo and the bench:
    its own session so a test's signals reach it alone, stdin closed.
    """

    log_path: Path
    process: subprocess.Popen | None = None

    def spawn(self, command: list[str], *, cwd: Path, env: dict[str, str]) -> None:
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                command,
                cwd=cwd,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def signal(self, sig: int) -> None:
        if self.alive:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)


class Replica(LoggedProcess):
    """One ``celery beat`` process running zkbeat.Scheduler."""

    def __init__(self, identity: str, env: dict[str, str], log_dir: Path) -> None:
        self.identity = identity
        self.log_path = log_dir / f"{identity}.log"
        self._env = {**env, "ZKBEAT_TEST_IDENTITY": identity}

    def start(self, extra_env: dict[str, str] | None = None) -> Replica:
        self.spawn(
            [sys.executable, "-m", "celery", "-A", "tests.support.beatapp", "beat", "--scheduler", "zkbeat.Scheduler",
             "--loglevel", "INFO"],
            cwd=ROOT,
            env={**os.environ, **self._env, **(extra_env or {}), "PYTHONPATH": str(ROOT)},
        )  # fmt: skip
        return self

    def wait(self, timeout: float = 20) -> int:
        """The exit code; a replica still running after ``timeout`` fails with its threads' stacks and its log."""
        assert self.process is not None
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.signal(signal.SIGWINCH)  # tests.support.beatapp: faulthandler writes every thread's stack
            time.sleep(2)
            raise AssertionError(
                f"{self.identity} (pid {self.pid}) still runs {timeout:g} s on; its stacks and log:\n"
                + self.log()[-12000:]
            ) from None

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def is_leader_by_log(self) -> bool:
        """Leadership as the replica's own log tells it (last edge wins)."""
        text = self.log()
        became, stopped = text.rfind("zkbeat: became leader"), text.rfind("zkbeat: stopped leading")
        return became > stopped

    def stop(self) -> None:
        if self.alive:
            self.signal(signal.SIGCONT)
            self.signal(signal.SIGKILL)
            self.process.wait(10)


class Cluster:
    """N replicas of the same app (same image, same config) plus the record."""

    def __init__(
        self,
        n: int,
        *,
        zk_hosts: str,
        broker: str,
        root: str,
        schedule: dict[str, float],
        log_dir: Path,
        session_timeout: float = SESSION,
        extra_env: dict[str, str] | None = None,
        record_url: str | None = None,
    ) -> None:
        self.record_key = f"zkbeat-test:{root}"
        self.root = root
        self.schedule = schedule
        env = {
            "ZKBEAT_HOSTS": zk_hosts,
            "ZKBEAT_TEST_BROKER": broker,
            "ZKBEAT_TEST_ROOT": root,
            "ZKBEAT_TEST_SCHEDULE": json.dumps(schedule),
            "ZKBEAT_TEST_SESSION_TIMEOUT": str(session_timeout),
            "ZKBEAT_TEST_RECORD_KEY": self.record_key,
            "ZKBEAT_TEST_RECORD_URL": record_url or broker,
            **(extra_env or {}),
        }
        self.env = env
        self.log_dir = log_dir
        self.redis = redis.Redis.from_url(record_url or broker)
        self.replicas = [Replica(f"replica-{i}", env, log_dir) for i in range(n)]
        self._spawned = n

    def start(self) -> Cluster:
        for replica in self.replicas:
            replica.start()
        return self

    def add(self, extra_env: dict[str, str] | None = None) -> Replica:
        replica = Replica(f"replica-{self._spawned}", self.env, self.log_dir)
        self._spawned += 1
        self.replicas.append(replica)
        return replica.start(extra_env)

    def stop(self) -> None:
        for replica in self.replicas:
            replica.stop()

    def publishes(self) -> list[Publish]:
        return read_publishes(self.redis, self.record_key)

    def leader(self) -> Replica | None:
        """The replica that published last (the one leading now, if any)."""
        rows = self.publishes()
        if not rows:
            return None
        pid = rows[-1].pid
        return next((r for r in self.replicas if r.alive and r.pid == pid), None)

    def logs(self) -> str:
        return "\n".join(f"===== {r.identity} =====\n{r.log()[-6000:]}" for r in self.replicas)


def too_close(publishes: list[Publish], interval: float, fraction: float = 0.5) -> list[tuple[str, float]]:
    """Consecutive slots of one entry closer than ``fraction`` of its interval.

    Celery's interval schedules count from the actual last run, so a repeat of
    a tick under another slot name would show up here even if slots differ.
    """
    found = []
    for entry, slots in slots_by_entry(publishes).items():
        for a, b in zip(slots, slots[1:]):
            gap = (b - a).total_seconds()
            if gap < interval * fraction:
                found.append((entry, gap))
    return found


def slots_by_entry(publishes: list[Publish]) -> dict[str, list[datetime]]:
    by_entry: dict[str, list[datetime]] = defaultdict(list)
    for p in publishes:
        by_entry[p.entry].append(p.slot)
    return {entry: sorted(slots) for entry, slots in by_entry.items()}

"""Real ``celery beat`` processes of each flavour, and what they record.

A :class:`Run` is one scenario's cluster of one flavour: its own zkbeat root
or redbeat key prefix, its own folder for logs, publish records and the
PersistentScheduler's shelve file. Leadership is read from each process's
own log (zkbeat's ``became leader`` line, redbeat's ``Acquired lock``), whose
lines carry ``%(created).6f`` timestamps (see ``bench/app.py``).

The scenarios wait with the tests' ``wait_for`` (``raise_on_timeout=False``:
a trial that timed out is recorded, not fatal). Polling only decides when to
look; every reported time comes from a timestamp a process wrote itself (a
publish record or a log line).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from tests.support.processes import LoggedProcess

ROOT = Path(__file__).resolve().parents[1]
LOG_LINE = re.compile(r"^\[(\d+\.\d+) (\d+) (\w+) ([\w.]+)\] (.*)$")
#: zkbeat's takeover line; " again" or " after <whom> (epoch <n>) left (<why>)" may follow the identity.
BECAME_LEADER = re.compile(
    r"zkbeat: became leader \(epoch (\d+)\) as (\S+)(?: [^;]*)?; (\d+) ledger entries loaded in ([\d.]+) ms"
)


@dataclass(frozen=True)
class Flavour:
    """One scheduler under test and how it is deployed."""

    key: str
    label: str
    scheduler: str
    replicas: int
    env: dict[str, str] = field(default_factory=dict)
    #: The log line that says "this process now publishes".
    leader_line: str = ""
    #: The Celery app every process runs (``-A``).
    app: str = "bench.app"


ZKBEAT = Flavour("zkbeat", "zkbeat", "zkbeat.Scheduler", 3, leader_line="zkbeat: became leader")
PLAIN = Flavour("plain", "celery beat", "celery.beat:PersistentScheduler", 1, leader_line="beat: Starting...")
REDBEAT = Flavour("redbeat", "redbeat (defaults)", "redbeat.RedBeatScheduler", 3, leader_line="beat: Acquired lock")
REDBEAT_TUNED = Flavour(
    "redbeat_tuned",
    "redbeat (tuned)",
    "redbeat.RedBeatScheduler",
    3,
    {"BENCH_MAX_INTERVAL": "1", "BENCH_LOCK_TIMEOUT": "5"},
    leader_line="beat: Acquired lock",
)
FLAVOURS = (ZKBEAT, PLAIN, REDBEAT, REDBEAT_TUNED)
#: The database scenario's two: rows in django-celery-beat's tables (bench/database.py).
ZKBEAT_DATABASE = Flavour(
    "zkbeat", "zkbeat", "zkbeat.DatabaseScheduler", 3, leader_line="zkbeat: became leader", app="bench.djangoapp"
)
DJANGO_CELERY_BEAT = Flavour(
    "dcb",
    "django-celery-beat alone",
    "django_celery_beat.schedulers:DatabaseScheduler",
    1,
    leader_line="beat: Starting...",
    app="bench.djangoapp",
)


@dataclass
class Publish:
    entry: str
    pid: int
    at: float


@dataclass
class LogEvent:
    at: float
    pid: int
    message: str


class Beat(LoggedProcess):
    """One ``celery beat`` process."""

    def __init__(self, run: Run, index: int) -> None:
        self.run = run
        self.identity = f"{run.flavour.key}-{index}"
        self.log_path = run.dir / f"{self.identity}.log"
        self.started_at = 0.0

    def start(self) -> Beat:
        flavour = self.run.flavour
        command = [
            sys.executable, "-m", "celery", "-A", flavour.app, "beat",
            "--scheduler", flavour.scheduler, "--loglevel", "INFO",
            "-s", str(self.run.dir / f"{self.identity}-schedule"),
        ]  # fmt: skip
        env = {**os.environ, **self.run.env, "BENCH_IDENTITY": self.identity, "PYTHONPATH": str(ROOT)}
        self.started_at = time.time()
        self.spawn(command, cwd=ROOT, env=env)
        return self

    def kill(self) -> None:
        if self.alive:
            os.kill(self.pid, signal.SIGCONT)
            os.kill(self.pid, signal.SIGKILL)
        if self.process is not None:
            self.process.wait(10)

    def events(self, needle: str = "") -> list[LogEvent]:
        """This process's log lines containing ``needle``, with their timestamps."""
        try:
            text = self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return []
        found = []
        for line in text.splitlines():
            match = LOG_LINE.match(line)
            if match and needle in match.group(5):
                found.append(LogEvent(float(match.group(1)), int(match.group(2)), match.group(5)))
        return found

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except FileNotFoundError:
            return "(no log)"


class Run:
    """A cluster of one flavour for one scenario, isolated by root/prefix and folder."""

    def __init__(self, flavour: Flavour, *, broker: str, zk_hosts: str, entries: list[dict], **env: str) -> None:
        self.flavour = flavour
        self.dir = Path(tempfile.mkdtemp(prefix=f"zkbench-{flavour.key}-"))
        (self.dir / "records").mkdir()
        self.root = f"/zkbench/{flavour.key}-{uuid.uuid4().hex[:8]}"
        self.env = {
            "BENCH_BROKER": broker,
            "ZKBEAT_HOSTS": zk_hosts,
            "BENCH_ROOT": self.root,
            "BENCH_RECORD_DIR": str(self.dir / "records"),
            "BENCH_ENTRIES": json.dumps(entries),
            **flavour.env,
            **env,
        }
        self.beats: list[Beat] = []

    def start(self, n: int | None = None) -> Run:
        for _ in range(self.flavour.replicas if n is None else n):
            self.add()
        return self

    def add(self) -> Beat:
        beat = Beat(self, len(self.beats))
        self.beats.append(beat)
        return beat.start()

    def alive(self) -> list[Beat]:
        return [beat for beat in self.beats if beat.alive]

    def leader(self) -> Beat | None:
        """The live process whose own log says it publishes now."""
        best, best_at = None, -1.0
        for beat in self.alive():
            became = beat.events(self.flavour.leader_line)
            if not became:
                continue
            stopped = beat.events("zkbeat: stopped leading")
            if stopped and stopped[-1].at > became[-1].at:
                continue
            if became[-1].at > best_at:
                best, best_at = beat, became[-1].at
        return best

    def publishes(self) -> list[Publish]:
        rows = []
        for path in (self.dir / "records").glob("*.tsv"):
            for line in path.read_text().splitlines():
                parts = line.split("\t")
                if len(parts) == 3:
                    rows.append(Publish(parts[0], int(parts[1]), float(parts[2])))
        rows.sort(key=lambda p: p.at)
        return rows

    def stop(self) -> None:
        for beat in self.beats:
            beat.kill()

    def close(self, keep: bool = False) -> None:
        self.stop()
        if not keep:
            shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> Run:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close(keep=any(exc))

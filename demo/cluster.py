"""The demo's processes: a Celery worker and beat replicas of example_project, and their logs.

The beat command line is the one the Docker image runs (``docker/``; a test
keeps the two the same).
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from tests.support.processes import LoggedProcess

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE_PROJECT = ROOT / "example_project"

#: What each replica runs (after ``python -m``); the image's beat command.
BEAT_COMMAND = ("celery", "-A", "proj", "beat", "--scheduler", "zkbeat.DatabaseScheduler", "--loglevel", "INFO")
#: The worker: one process, because the demo's database is SQLite.
WORKER_COMMAND = ("celery", "-A", "proj", "worker", "--pool", "solo", "--loglevel", "INFO",
                  "--without-gossip", "--without-mingle", "--without-heartbeat")  # fmt: skip

_LINE = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}): (\w+)/[^\]]*\] (.*)$")
_BECAME = re.compile(r"zkbeat: became leader \(epoch (\d+)\)")
_STOPPED = re.compile(r"zkbeat: stopped leading \([^,]+, epoch \S+\): (.*)")
_SENDING = re.compile(r"Scheduler: Sending due task (.+) \(([\w.]+)\) slot (\S+) epoch (\d+)")


@dataclass
class Event:
    """One line of a beat replica's log that the demo tells about."""

    at: float  # the log record's own time (epoch seconds)
    replica: str
    kind: str  # "leader", "stopped", "publish", "warning"
    entry: str = ""
    slot: datetime | None = None
    epoch: int | None = None
    text: str = ""


def parse(replica: str, line: str) -> Event | None:
    """The Event a log line reports, or None for lines the demo does not show."""
    match = _LINE.match(line)
    if not match:
        return None
    stamp, level, message = match.groups()
    at = datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S,%f").timestamp()  # local time, like the log
    if found := _SENDING.search(message):
        name, _, slot, epoch = found.groups()
        return Event(at, replica, "publish", entry=name, slot=datetime.fromisoformat(slot), epoch=int(epoch))
    if found := _BECAME.search(message):
        return Event(at, replica, "leader", epoch=int(found.group(1)))
    if found := _STOPPED.search(message):
        return Event(at, replica, "stopped", text=found.group(1))
    if level in ("WARNING", "ERROR", "CRITICAL") and "zkbeat" in message and "session lost" not in message:
        return Event(at, replica, "warning", text=message)
    return None


class Child(LoggedProcess):
    """One child process in its own session, its output in a log file."""

    def __init__(self, name: str, command: tuple[str, ...], env: dict[str, str], log_dir: Path) -> None:
        self.name = name
        self.command = command
        self.env = env
        self.log_path = log_dir / f"{name}.log"
        self._offset = 0
        self._partial = b""

    def start(self) -> Child:
        command = [sys.executable, "-m", *self.command]
        # Killed with the demo even if the demo itself is killed (-9).
        setpriv = shutil.which("setpriv")
        if setpriv and threading.current_thread() is threading.main_thread():
            command = [setpriv, "--pdeathsig", "KILL", "--", *command]
        # Its own session: Ctrl-C reaches the demo only; it stops the children itself.
        self.spawn(command, cwd=EXAMPLE_PROJECT, env=self.env)
        return self

    def stop(self, timeout: float = 10) -> None:
        """SIGTERM, then SIGKILL for the whole process group if it lingers."""
        if self.process is None:
            return
        self.signal(signal.SIGTERM)
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.pid, signal.SIGKILL)
            self.process.wait()

    def new_lines(self) -> list[str]:
        """Complete lines written to the log since the last call."""
        try:
            with open(self.log_path, "rb") as log:
                log.seek(self._offset)
                data = log.read()
        except FileNotFoundError:
            return []
        self._offset += len(data)
        data = self._partial + data
        lines = data.split(b"\n")
        self._partial = lines.pop()
        return [line.decode(errors="replace") for line in lines]

    def tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except FileNotFoundError:
            return "(no log)"

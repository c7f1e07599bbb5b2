"""What every scenario is handed: the servers, the mode, and a progress log."""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field

from kazoo.client import KazooClient
from kazoo.exceptions import NoNodeError, NotEmptyError

from bench import probes
from bench.cluster import Beat, Flavour, Run
from tests.support.helpers import wait_for
from tests.support.servers import RedisServer, ZooKeeperServer


@dataclass
class Bench:
    zk: ZooKeeperServer
    redis: RedisServer
    client: KazooClient
    quick: bool
    started: float
    #: Things a reader of the table must know (printed under it, kept in the JSON).
    notes: list[str] = field(default_factory=list)

    def run(self, flavour: Flavour, entries: list[dict], **env: str) -> Run:
        return Run(flavour, broker=self.redis.url, zk_hosts=self.zk.hosts, entries=entries, **env)

    def note(self, message: str) -> None:
        self.notes.append(message)
        self.say(f"  note: {message}")

    def drop(self, root: str) -> None:
        """Delete a finished run's znodes, the ledger 1,000 entries a transaction.

        The scenarios share one ZooKeeper, whose heap would otherwise hold
        every trial's 100,000-entry ledger at once.
        """
        entries = f"{root}/v1/entries"
        try:
            names = self.client.get_children(entries)
        except NoNodeError:
            names = []
        for start in range(0, len(names), 1000):
            transaction = self.client.transaction()
            for name in names[start : start + 1000]:
                transaction.delete(f"{entries}/{name}")
            transaction.commit()
        try:
            self.client.delete(root, recursive=True)
        except (NoNodeError, NotEmptyError) as exc:  # an ephemeral candidate whose session is still expiring
            self.say(f"  {root} left behind: {exc!r}")

    def say(self, message: str) -> None:
        print(f"[{time.time() - self.started:6.1f}s] {message}", file=sys.stderr, flush=True)


def wait_started(beats: list[Beat], timeout: float = 60) -> bool:
    """Every process has its scheduler up ("beat: Starting..." is logged)."""
    started = wait_for(lambda: all(b.events("beat: Starting...") for b in beats), timeout, 0.05, raise_on_timeout=False)
    return bool(started)


def wait_settled(beat: Beat, timeout: float = 60) -> bool:
    """A new replica is up and has stopped using CPU (its schedule built, election joined).

    "beat: Starting..." comes before the scheduler builds its schedule; a
    replacement still building 10,000 entries would compete for the two
    cores with the next trial's takeover.
    """
    if not wait_started([beat], timeout):
        return False
    deadline = time.monotonic() + timeout
    used = probes.cpu_seconds(beat.pid)
    while time.monotonic() < deadline and beat.alive:
        time.sleep(0.25)
        now = probes.cpu_seconds(beat.pid)
        if now - used < 0.01:
            return True
        used = now
    return False


def wait_leader_publishing(run: Run, entry: str, after: float, timeout: float = 60):
    """The leader and its first publish of ``entry`` later than ``after``."""

    def found():
        leader = run.leader()
        if leader is None:
            return None
        mine = [p for p in run.publishes() if p.pid == leader.pid and p.entry == entry and p.at > after]
        return (leader, mine[-1]) if mine else None

    return wait_for(found, timeout, 0.005, raise_on_timeout=False)


def first_publish_by_other(run: Run, pid: int, after: float):
    rows = [p for p in run.publishes() if p.pid != pid and p.at > after]
    return rows[0] if rows else None


def leader_event_by_other(run: Run, pid: int, after: float):
    """The first leadership log line after ``after`` by a process other than ``pid``."""
    events = []
    for beat in run.beats:
        if beat.process is not None and beat.pid != pid:
            events += [e for e in beat.events(run.flavour.leader_line) if e.at > after]
    return min(events, key=lambda e: e.at) if events else None


def takeover_after(run: Run, pid: int, t0: float, cap: float, publish_cap: float = 5.0):
    """(first leadership line, first publish) by a process other than ``pid`` after ``t0``; None where none came."""
    event = wait_for(lambda: leader_event_by_other(run, pid, t0), cap, 0.005, raise_on_timeout=False)
    publish = wait_for(
        lambda: first_publish_by_other(run, pid, t0), publish_cap if event else 0.1, 0.005, raise_on_timeout=False
    )
    return event, publish

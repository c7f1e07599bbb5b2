"""The chaos soak: 3 replicas, 20 entries at 1 s, a random fault every 20-60 s.

    python -m tests.support.chaos --duration 1800        # what `make chaos DURATION=1800` runs

It starts its own servers on loopback ports (a 3-member ZooKeeper ensemble,
a Redis broker, and a second Redis that keeps the record, so a broker restart
cannot erase what was counted), runs real ``celery beat`` replicas, and
injects faults into whoever leads: kill -9, SIGTERM, SIGSTOP past the session
timeout, a ZooKeeper member restart, a broker restart. Faults come in
shuffled rounds (each kind once before any repeats), so even a short run
sees every kind. At the end the replicas are stopped gracefully and the
accounting (tests/support/accounting.py) is printed; the exit status is 0 only if
nothing was published twice and nothing was lost that a kill -9 in the
middle of a send does not explain (zkbeat's documented at-most-once window).
"""

from __future__ import annotations

import argparse
import logging
import random
import signal
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from kazoo.client import KazooClient

from tests.support.accounting import Report, account, logged_skips, logged_unanswered
from tests.support.faults import leader_session, ledger_slots, member_holding
from tests.support.helpers import wait_for
from tests.support.processes import Cluster, Replica
from tests.support.servers import RedisServer, ZooKeeperEnsemble

__all__ = ["Soak", "run"]

SESSION = 2.0
FAULTS = ("kill -9", "SIGTERM", "SIGSTOP", "zookeeper member restart", "broker restart")


@dataclass
class Event:
    at: float
    fault: str
    detail: str


@dataclass
class Soak:
    """The outcome of one run: the accounting, the faults, and what died unasked."""

    report: Report
    events: list[Event]
    started: float
    duration: float
    seed: int
    unexpected_exits: list[str] = field(default_factory=list)

    def ok(self) -> bool:
        return self.report.ok() and not self.unexpected_exits

    def summary(self) -> str:
        lines = [
            f"chaos soak: {self.duration:.0f}s, {len(self.events)} faults, seed {self.seed}, "
            f"{'PASS' if self.ok() else 'FAIL'}",
            "",
            self.report.table(),
            "",
            "faults:",
        ]
        lines += [f"  {e.at - self.started:7.1f}s  {e.fault:<26} {e.detail}" for e in self.events]
        lines += ["", "who led when (seconds from start, each leader's own clock):"]
        lines.append(self.report.leader_table(self.started))
        if self.unexpected_exits:
            lines += ["", "replicas that died unasked: " + ", ".join(self.unexpected_exits)]
        details = self.report.details()
        if details:
            lines += ["", details]
        return "\n".join(lines)


def run(
    duration: float,
    *,
    entries: int = 20,
    replicas: int = 3,
    every: tuple[float, float] = (20.0, 60.0),
    seed: int | None = None,
    log_dir: Path | None = None,
    say: Callable[[str], None] = print,
) -> Soak:
    """Run the soak for ``duration`` seconds of faults and return its accounting."""
    seed = random.randrange(2**32) if seed is None else seed
    rng = random.Random(seed)
    log_dir = log_dir or Path(tempfile.mkdtemp(prefix="zkbeat-chaos-"))
    schedule = {f"entry-{i:02d}": 1.0 for i in range(entries)}
    root = f"/chaos/{uuid.uuid4().hex[:8]}"
    with ZooKeeperEnsemble(3) as ensemble, RedisServer() as broker, RedisServer() as record:
        client = KazooClient(ensemble.hosts)
        client.start(timeout=30)
        cluster = Cluster(
            replicas,
            zk_hosts=ensemble.hosts,
            broker=broker.url,
            record_url=record.url,
            root=root,
            schedule=schedule,
            log_dir=log_dir,
            session_timeout=SESSION,
        )
        driver = _Driver(cluster, ensemble, broker, client, rng, say)
        try:
            cluster.start()
            wait_for(lambda: len(cluster.publishes()) >= entries, 60, 0.1, message="chaos: nothing published")
            started = time.time()
            say(f"chaos: {replicas} replicas, {entries} entries at 1 s, logs in {log_dir}")
            deadline = time.monotonic() + duration
            while True:
                pause = rng.uniform(*every)
                if time.monotonic() + pause > deadline:
                    break
                time.sleep(pause)
                driver.inject()
            # A quiet stretch, so the last fault's recovery is in the record.
            time.sleep(max(0.0, deadline - time.monotonic()) + 10)
            unexpected = driver.unexpected_exits()
            for replica in cluster.replicas:
                replica.signal(signal.SIGCONT)
                replica.signal(signal.SIGTERM)
            for replica in cluster.replicas:
                if replica.process is not None:
                    try:
                        replica.wait(30)
                    except Exception:  # noqa: BLE001 - report it, never hang the soak
                        unexpected.append(f"{replica.identity} (did not stop on SIGTERM)")
            wait_for(lambda: client.connected, 30, 0.1, message="chaos: the accounting client is not connected")
            logs = [r.log() for r in cluster.replicas]
            report = account(
                cluster.publishes(),
                schedule,
                skips=logged_skips(logs),
                unanswered=logged_unanswered(logs),
                ledger_slots=ledger_slots(client, root),
                kills=driver.kills,
            )
            return Soak(report, driver.events, started, duration, seed, unexpected)
        finally:
            cluster.stop()
            client.stop()
            client.close()


class _Driver:
    """Picks the next fault and does it to whoever leads now."""

    def __init__(self, cluster, ensemble, broker, client, rng, say) -> None:
        self.cluster: Cluster = cluster
        self.ensemble: ZooKeeperEnsemble = ensemble
        self.broker: RedisServer = broker
        self.client: KazooClient = client
        self.rng: random.Random = rng
        self.say = say
        self.events: list[Event] = []
        self.kills: list[tuple[int, float]] = []
        self._asked_to_exit: set[int] = set()
        self._round: list[str] = []

    def inject(self) -> None:
        if not self._round:
            self._round = list(FAULTS)
            self.rng.shuffle(self._round)
        fault = self._round.pop()
        at = time.time()
        detail = getattr(self, "_" + fault.split()[0].replace("-", "_").lower())()
        event = Event(at, fault, detail)
        self.events.append(event)
        self.say(f"chaos: {fault}: {detail}")

    def unexpected_exits(self) -> list[str]:
        return [r.identity for r in self.cluster.replicas if not r.alive and r.pid not in self._asked_to_exit]

    def _leader(self) -> Replica:
        """The replica that leads now (by the election), else any live one."""
        found = leader_session(self.client, self.cluster.root) if self.client.connected else None
        live = [r for r in self.cluster.replicas if r.alive]
        if found is not None:
            for replica in live:
                if replica.identity == found[0]:
                    return replica
        return self.cluster.leader() or live[0]

    def _kill(self) -> str:
        victim = self._leader()
        self._asked_to_exit.add(victim.pid)
        victim.signal(signal.SIGKILL)
        self.kills.append((victim.pid, time.time()))
        victim.wait()
        fresh = self.cluster.add()
        return f"{victim.identity} (pid {victim.pid}) killed; {fresh.identity} started"

    def _sigterm(self) -> str:
        victim = self._leader()
        self._asked_to_exit.add(victim.pid)
        victim.signal(signal.SIGTERM)
        code = victim.wait(30)
        fresh = self.cluster.add()
        return f"{victim.identity} (pid {victim.pid}) exited {code}; {fresh.identity} started"

    def _sigstop(self) -> str:
        victim = self._leader()
        pause = SESSION + self.rng.uniform(1.0, 4.0)
        victim.signal(signal.SIGSTOP)
        time.sleep(pause)
        victim.signal(signal.SIGCONT)
        return f"{victim.identity} paused {pause:.1f}s (session {SESSION:g}s)"

    def _zookeeper(self) -> str:
        found = leader_session(self.client, self.cluster.root) if self.client.connected else None
        holding = member_holding(self.ensemble, found[1]) if found else None
        member = holding or self.rng.choice(self.ensemble.members)
        role = member.mode
        member.stop()
        self.ensemble.start()
        whose = "the zkbeat leader's member" if holding is not None else "a member"
        return f"{whose}, {member.myid} (ZooKeeper {role}), restarted"

    def _broker(self) -> str:
        down = self.rng.uniform(1.0, 10.0)
        self.broker.stop()
        time.sleep(down)
        self.broker.start()
        return f"Redis down {down:.1f}s"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.support.chaos", description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=180.0, help="seconds of faults (default 180)")
    parser.add_argument("--entries", type=int, default=20)
    parser.add_argument("--replicas", type=int, default=3)
    parser.add_argument("--min-gap", type=float, default=20.0, help="least seconds between faults")
    parser.add_argument("--max-gap", type=float, default=60.0, help="most seconds between faults")
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--logs", type=Path, default=None, help="folder for the replicas' logs")
    args = parser.parse_args(argv)
    logging.getLogger("kazoo").setLevel(logging.ERROR)  # the driver's own client rides the faults too
    soak = run(
        args.duration,
        entries=args.entries,
        replicas=args.replicas,
        every=(args.min_gap, args.max_gap),
        seed=args.seed,
        log_dir=args.logs,
        say=lambda text: print(text, flush=True),
    )
    print(soak.summary(), flush=True)
    return 0 if soak.ok() else 1


if __name__ == "__main__":
    sys.exit(main())

"""Crash failover: kill -9 the leader, through the liveness socket and through the session.

With zkbeat's liveness socket (the default) the successor sees the dead
process's connection end and deletes its candidate: the takeover no longer
waits for the session. Those trials kill the leader just before its next
tick comes due, so the first publish measures an overdue tick.

Without it (``zkbeat_liveness = False``, and what a lost host costs, where
no kernel is left to close anything) no election can notice the loss
before ZooKeeper expires the session, in tickTime buckets. So each such trial
kills two processes at the same instant on the same ZooKeeper: the zkbeat
leader, right after it published (its session was just heard from), and a
bare kazoo client holding an ephemeral znode, right after one request of its
own (``bench/floor.py``). The floor is when a watcher hears that znode
is gone; zkbeat's takeover is its new leader's log line; the difference is
what zkbeat adds. redbeat's failover is bounded by its lock timeout instead.
"""

from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
import threading
import time
import uuid

from kazoo.protocol.states import EventType

from bench.cluster import REDBEAT, REDBEAT_TUNED, ROOT, ZKBEAT, Flavour, Run
from bench.context import Bench, takeover_after, wait_leader_publishing, wait_settled, wait_started
from bench.stats import Row, Sample

ENTRIES = [{"name": "tick", "every": 1}]


class Floor:
    """A bare kazoo client in its own process, and a watch on its ephemeral znode."""

    def __init__(self, bench: Bench, session_timeout: float) -> None:
        self.path = f"/zkbench/floor/{uuid.uuid4().hex}"
        self.process = subprocess.Popen(
            [sys.executable, "-m", "bench.floor", bench.zk.hosts, self.path, str(session_timeout)],
            cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, start_new_session=True,
        )  # fmt: skip
        if not self.process.stdout.readline().startswith("ready"):
            raise RuntimeError("floor client did not start")
        self.gone_at: float | None = None
        self.gone = threading.Event()
        bench.client.exists(self.path, watch=self._on_watch)

    def _on_watch(self, event) -> None:
        if event.type == EventType.DELETED:
            self.gone_at = time.time()
            self.gone.set()

    def touch(self) -> None:
        self.process.stdin.write("touch\n")
        self.process.stdin.flush()
        self.process.stdout.readline()

    def kill(self) -> None:
        if self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGKILL)

    def close(self) -> None:
        self.kill()
        self.process.wait(10)


def _zkbeat_trials(bench: Bench, session_timeout: float, trials: int) -> dict[str, Sample]:
    cap = session_timeout * 2 + 10
    result = {name: Sample(cap=cap) for name in ("floor", "ready", "first", "overhead")}
    run = bench.run(ZKBEAT, ENTRIES, BENCH_SESSION_TIMEOUT=str(session_timeout), BENCH_LIVENESS="0")
    floor = None
    with run:
        run.start()
        wait_started(run.beats)
        mark = time.time()
        for trial in range(trials):
            floor = Floor(bench, session_timeout)
            found = wait_leader_publishing(run, "tick", mark)
            if found is None:
                bench.say("  zkbeat: no leader publishing; crash trials abandoned")
                break
            leader, _ = found
            floor.touch()
            t0 = time.time()
            leader.signal(signal.SIGKILL)
            floor.kill()
            floor.gone.wait(cap)
            event, publish = takeover_after(run, leader.pid, t0, cap)
            floor_s = floor.gone_at - t0 if floor.gone_at else math.inf
            ready_s = event.at - t0 if event else math.inf
            result["floor"].values.append(floor_s)
            result["ready"].values.append(ready_s)
            result["first"].values.append(publish.at - t0 if publish else math.inf)
            if floor_s != math.inf and ready_s != math.inf:
                result["overhead"].values.append((ready_s - floor_s) * 1000)
            bench.say(f"  zkbeat kill -9 (session {session_timeout:g} s) {trial + 1}/{trials}: "
                      f"floor {floor_s:.3f} s, new leader {ready_s:.3f} s")  # fmt: skip
            floor.close()
            leader.kill()
            wait_settled(run.add())
            mark = time.time()
    if floor is not None:
        floor.close()
    result["overhead"].cap = None
    return result


def _liveness_trials(bench: Bench, session_timeout: float, trials: int) -> dict[str, Sample]:
    """kill -9 with the liveness socket on: new leader ready, and the first publish of a tick due at the kill."""
    cap = session_timeout * 2 + 10
    result = {"ready": Sample(cap=cap), "first": Sample(cap=cap)}
    run = bench.run(ZKBEAT, ENTRIES, BENCH_SESSION_TIMEOUT=str(session_timeout), BENCH_LIVENESS="1")
    with run:
        run.start()
        wait_started(run.beats)
        mark = time.time()
        for trial in range(trials):
            found = wait_leader_publishing(run, "tick", mark)
            if found is None:
                bench.say("  zkbeat: no leader publishing; liveness trials abandoned")
                break
            leader, last = found
            # Its next tick is due one interval after the last: kill just
            # before, so the tick is overdue for the whole takeover.
            time.sleep(max(0.0, last.at + 1.0 - 0.02 - time.time()))
            t0 = time.time()
            leader.signal(signal.SIGKILL)
            event, publish = takeover_after(run, leader.pid, t0, cap)
            ready_ms = (event.at - t0) * 1000 if event else math.inf
            first_ms = (publish.at - t0) * 1000 if publish else math.inf
            result["ready"].values.append(ready_ms)
            result["first"].values.append(first_ms)
            bench.say(f"  zkbeat kill -9, liveness on (session {session_timeout:g} s) {trial + 1}/{trials}: "
                      f"new leader {ready_ms:.0f} ms, first publish {first_ms:.0f} ms")  # fmt: skip
            leader.kill()
            wait_settled(run.add())
            mark = time.time()
    return result


def _redbeat_trials(bench: Bench, flavour: Flavour, trials: int, cap: float) -> dict[str, Sample]:
    result = {"ready": Sample(cap=cap), "first": Sample(cap=cap)}
    run: Run = bench.run(flavour, ENTRIES)
    with run:
        run.start()
        wait_started(run.beats)
        mark = time.time()
        for trial in range(trials):
            found = wait_leader_publishing(run, "tick", mark)
            if found is None:
                break
            leader, _ = found
            t0 = time.time()
            leader.signal(signal.SIGKILL)
            event, publish = takeover_after(run, leader.pid, t0, cap)
            result["ready"].values.append(event.at - t0 if event else math.inf)
            result["first"].values.append(publish.at - t0 if publish else math.inf)
            bench.say(f"  {flavour.key} kill -9 {trial + 1}/{trials}: new leader "
                      f"{result['ready'].values[-1]:.3f} s")  # fmt: skip
            leader.kill()
            if event is None:
                break
            wait_settled(run.add())
            mark = time.time()
    return result


def _ms(sample: Sample) -> Sample:
    """A sample in seconds as milliseconds (a censored trial stays censored)."""
    return Sample([v * 1000 for v in sample.values], cap=sample.cap * 1000 if sample.cap else None, note=sample.note)


def run(bench: Bench) -> list[Row]:
    trials = 2 if bench.quick else 10
    timeouts = (4.0,) if bench.quick else (4.0, 10.0)
    bench.say(f"crash: kill -9 the leader x{trials}, session timeouts {timeouts}")
    redbeat = {"redbeat_tuned": _redbeat_trials(bench, REDBEAT_TUNED, 1 if bench.quick else trials, 20.0)}
    if not bench.quick:
        # redbeat's default lock timeout is 5 x beat_max_loop_interval = 1500 s.
        redbeat["redbeat"] = _redbeat_trials(bench, REDBEAT, 1, 20.0)
    rows = []
    for timeout in (10.0,) if bench.quick else (10.0, 30.0):
        live = _liveness_trials(bench, timeout, trials)
        scenario = f"crash (kill -9), liveness socket on, session {timeout:g} s"
        # redbeat has no session: its kill -9 trials (in seconds) stand beside each.
        in_ms = {key: {k: _ms(v) for k, v in r.items()} for key, r in redbeat.items()}
        rows += [
            Row(
                scenario,
                "new leader ready after kill -9",
                "ms",
                {"zkbeat": live["ready"], **{k: r["ready"] for k, r in in_ms.items()}},
                target="p99 ≤ 100 ms",
                check=lambda row: row.values["zkbeat"].p99 <= 100,
            ),
            Row(
                scenario,
                "first publish of the tick due at the kill, after kill -9",
                "ms",
                {"zkbeat": live["first"], **{k: r["first"] for k, r in in_ms.items()}},
                target="p99 ≤ 150 ms",
                check=lambda row: row.values["zkbeat"].p99 <= 150,
            ),
        ]
    for timeout in timeouts:
        zk = _zkbeat_trials(bench, timeout, trials)
        scenario = f"crash (kill -9), liveness off (as a lost host), session {timeout:g} s"
        others = {key: r for key, r in redbeat.items()} if timeout == timeouts[0] else {}
        plain = {"plain": Sample(note="never (1 replica)")}
        rows += [
            Row(scenario, "floor: a killed kazoo client's znode seen gone", "s", {"zkbeat": zk["floor"]}, digits=3),
            Row(
                scenario,
                "new leader ready after kill -9",
                "s",
                {"zkbeat": zk["ready"], **{k: r["ready"] for k, r in others.items()}, **plain},
                target="p99 ≤ floor p99 + 0.1 s",
                check=lambda row, floor=zk["floor"]: row.values["zkbeat"].p99 <= floor.p99 + 0.1,
                digits=3,
            ),
            Row(
                scenario,
                "first publish after kill -9",
                "s",
                {"zkbeat": zk["first"], **{k: r["first"] for k, r in others.items()}, **plain},
                digits=3,
            ),
            Row(scenario, "zkbeat's own part: new leader − floor, same trial", "ms", {"zkbeat": zk["overhead"]}),
        ]
    return rows

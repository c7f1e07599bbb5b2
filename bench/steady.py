"""Steady load: 1,000 entries every 10 s; the leader's cost, idle followers, memory.

The window starts once the first round of all 1,000 has been published. In
it we read: the leader's CPU (all threads, /proc), its publishes, and for
zkbeat what ZooKeeper wrote (each transaction takes one zxid; each ledger
write bumps one entry znode's version). The same window measures the idle
followers: their CPU, their ZooKeeper packets next to those of a bare kazoo
client that only keeps its session alive (so "beyond session pings" is
measured, not assumed), and the watches each holds. RSS of every replica is
read at the end.
"""

from __future__ import annotations

import json
import time

from bench import probes, wire
from bench.cluster import FLAVOURS, ZKBEAT, Run
from bench.context import Bench
from bench.crash import Floor
from bench.stats import Row, Sample
from bench.windows import run_windows
from tests.support.helpers import wait_for
from zkbeat.ledger.store import Ledger

COUNT = 1000


def _settle(run: Run) -> None:
    wait_for(lambda: len(run.publishes()) >= COUNT, 120, 0.1, raise_on_timeout=False)


def _sessions(bench: Bench, run: Run) -> dict[str, int]:
    """zkbeat identity -> ZooKeeper session id, from the election candidates."""
    path = f"{run.root}/v1/election"
    found = {}
    for child in bench.client.get_children(path):
        data, stat = bench.client.get(f"{path}/{child}")
        found[json.loads(data)["identity"]] = stat.ephemeralOwner
    return found


def _quiet(run: Run, every: float) -> None:
    """Wait for a pause between rounds, so no claim is written but not yet published.

    Without it a claim committed just before the ledger is read and published
    just after the records are read counts as a write without its publish.
    """

    def quiet() -> bool:
        return time.time() - max((p.at for p in run.publishes()), default=0) > 0.3

    wait_for(quiet, every * 2, 0.05, raise_on_timeout=False)


def zookeeper_requests(run: Run, pid: int) -> int:
    """Requests (not pings) process ``pid`` sent so far (``BENCH_COUNT_ZK``)."""
    try:
        return sum(json.loads((run.dir / "records" / f"{pid}.zk.json").read_text()).values())
    except FileNotFoundError:
        return 0


def _ledger_versions(bench: Bench, run: Run) -> int:
    """Writes the ledger took so far: each create counts 1, each set 1 more."""
    return sum(record.version + 1 for record in Ledger(bench.client, run.root).load().values())


def run(bench: Bench) -> list[Row]:
    every, duration = (5.0, 10.0) if bench.quick else (10.0, 60.0)
    bench.say(f"steady: {COUNT} entries every {every:g} s, {duration:g} s window; idle followers; memory")
    floor: dict[str, Floor] = {}

    def settle(run: Run) -> None:
        _settle(run)
        if run.flavour is ZKBEAT:
            floor["zkbeat"] = Floor(bench, float(run.env.get("BENCH_SESSION_TIMEOUT", "10")))
            floor["zkbeat"].touch()

    def snapshot(run: Run) -> dict:
        leader = run.leader()
        snap = {"leader": leader}
        if run.flavour is ZKBEAT:
            _quiet(run, every)
            # Ledger versions, zxid and publish count read back to back: a
            # publish between them would be counted without its write.
            snap["versions"] = _ledger_versions(bench, run)
            snap["zxid"] = probes.last_zxid(bench.zk.port)
        snap["published"] = len(run.publishes())
        snap["cpu"] = {b.pid: probes.cpu_seconds(b.pid) for b in run.alive()}
        if run.flavour is ZKBEAT:
            snap["sessions"] = _sessions(bench, run)
            snap["packets"] = probes.sessions(bench.zk.port)
            snap["requests"] = {b.pid: zookeeper_requests(run, b.pid) for b in run.alive()}
            # The bare floor session; None when its connection dropped (the
            # row then says it cannot compare, instead of ending the run).
            snap["floor_sid"] = next(
                (sid for sid, fields in snap["packets"].items() if fields.get("lop") == "EXIS" and sid not in
                 snap["sessions"].values()),
                None,
            )  # fmt: skip
        return snap

    def measure(run: Run, snap: dict, elapsed: float) -> dict:
        leader = snap["leader"]
        cpu = {b.pid: probes.cpu_seconds(b.pid) - snap["cpu"].get(b.pid, 0.0) for b in run.alive()}
        if run.flavour is ZKBEAT:
            _quiet(run, every)
            versions = _ledger_versions(bench, run)
            zxid = probes.last_zxid(bench.zk.port)
        published = len(run.publishes()) - snap["published"]
        if leader.pid not in cpu:
            # It exited inside the window (redbeat tuned's leader dies of
            # LockNotOwnedError under load): say so rather than end the run.
            bench.note(f"steady: {run.flavour.key}: its leader (pid {leader.pid}) exited during the window; "
                       "its leader CPU is not measured")  # fmt: skip
        leader_cpu = cpu.get(leader.pid, float("nan"))
        out = {
            "leader_cpu_pct": leader_cpu / elapsed * 100,
            "leader_cpu_per_1000": leader_cpu / max(published, 1) * 1000 * 1000,
            "follower_cpu_pct": [cpu[b.pid] / elapsed * 100 for b in run.alive() if b is not leader],
            "rss": [probes.rss_mb(b.pid) for b in run.alive()],
            "published": published,
        }
        if run.flavour is ZKBEAT:
            out["txn_per_publish"] = (zxid - snap["zxid"]) / max(published, 1)
            out["writes_per_publish"] = (versions - snap["versions"]) / max(published, 1)
            packets = probes.sessions(bench.zk.port)
            watches = probes.watches_by_session(bench.zk.port)

            def received(sid: int | None) -> int | float:
                if sid not in packets or sid not in snap["packets"]:
                    return float("nan")  # its session is gone: cannot measure
                return int(packets[sid]["recved"]) - int(snap["packets"][sid]["recved"])

            ping_floor = received(snap["floor_sid"])
            if ping_floor != ping_floor:
                ping_floor = "not measured: the floor client's connection dropped"
            followers = [b for b in run.alive() if b is not leader]
            sids = [snap["sessions"].get(b.identity) for b in followers]
            out["follower_requests"] = [zookeeper_requests(run, b.pid) - snap["requests"][b.pid] for b in followers]
            out["follower_packets"] = [received(sid) for sid in sids]
            out["follower_watches"] = [len(watches.get(sid, [])) for sid in sids]
            out["ping_floor"] = ping_floor
            floor.pop("zkbeat").close()
        return out

    results = run_windows(
        bench,
        FLAVOURS,
        lambda: [{"name": "s", "count": COUNT, "every": every, "first_due": time.time() + 4}],
        duration,
        settle,
        snapshot,
        measure,
        env={"BENCH_COUNT_ZK": "1"},
    )
    for key, result in results.items():
        bench.say(f"  {key}: {json.dumps({k: v for k, v in result.items()}, default=str)[:400]}")

    def column(pick, keys=tuple(results)) -> dict[str, Sample]:
        return {key: Sample(list(pick(results[key]))) for key in keys if key in results}

    messages = wire.zkbeat_messages(bench.redis.url)
    floor_cpu = wire.push(bench.redis.url, messages, 5 * COUNT)[0] if messages else float("nan")
    bench.say(
        f"  floor: {len(messages)} of zkbeat's messages pushed by a redis-py pipeline: {floor_cpu:.1f} ms a 1,000"
    )
    followers = ("zkbeat", "redbeat", "redbeat_tuned")
    zk = results.get("zkbeat", {})
    scenario = f"steady: {COUNT:,} entries every {every:g} s, {duration:g} s"
    rows = [
        Row(
            scenario,
            "leader CPU per 1,000 publishes",
            "ms",
            column(lambda r: [r["leader_cpu_per_1000"]]),
            target="≤ 200 ms",
            check=lambda row: row.values["zkbeat"].median <= 200,
        ),
        Row(
            scenario,
            "floor: zkbeat's own messages pushed by a bare redis-py pipeline, CPU per 1,000",
            "ms",
            {"zkbeat": Sample([floor_cpu])},
        ),
        Row(scenario, "leader CPU", "% of a core", column(lambda r: [r["leader_cpu_pct"]]), digits=2),
        Row(
            scenario,
            "ZooKeeper znode writes per publish",
            "per publish",
            {"zkbeat": Sample([zk.get("writes_per_publish", float("nan"))])},
            target="≤ 1",
            check=lambda row: row.values["zkbeat"].median <= 1,
            digits=3,
        ),
        Row(
            scenario,
            "ZooKeeper transactions per publish",
            "per publish",
            {"zkbeat": Sample([zk.get("txn_per_publish", float("nan"))])},
            digits=4,
        ),  # fmt: skip
        Row(
            f"idle follower, {duration:g} s",
            "CPU (each follower)",
            "% of a core",
            column(lambda r: r["follower_cpu_pct"], followers),
            target="≤ 0.1 %",
            check=lambda row: row.values["zkbeat"].p99 <= 0.1,
            digits=3,
        ),
        Row(
            f"idle follower, {duration:g} s",
            "ZooKeeper requests other than pings",
            "requests",
            {"zkbeat": Sample(zk.get("follower_requests", []))},
            target="0",
            check=lambda row: max(row.values["zkbeat"].values) <= 0,
            digits=0,
        ),
        Row(
            f"idle follower, {duration:g} s",
            f"ZooKeeper packets received from it (a bare idle kazoo session: {zk.get('ping_floor', '?')})",
            "packets",
            {"zkbeat": Sample(zk.get("follower_packets", []))},
            digits=0,
        ),
        Row(
            f"idle follower, {duration:g} s",
            "ZooKeeper watches held",
            "watches",
            {"zkbeat": Sample(zk.get("follower_watches", []))},
            target="exactly 1",
            check=lambda row: set(row.values["zkbeat"].values) == {1},
            digits=0,
        ),
        Row(
            "memory (steady load)",
            "RSS per replica, largest",
            "MB",
            column(lambda r: [max(r["rss"], default=float("nan"))]),
            target="≤ celery beat + 15 MB",
            check=lambda row: row.values["zkbeat"].median <= row.values["plain"].median + 15,
        ),
    ]
    return rows

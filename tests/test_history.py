"""An entry's recent runs against real ``celery beat`` replicas, ZooKeeper and Redis: kept across a kill -9
failover, bounded, with kinds; ``zkbeat history`` and ``zkbeat next``; bad data in the ledger survived."""

from __future__ import annotations

import json
import signal
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from celery import Celery
from celery.beat import ScheduleEntry
from kazoo.client import KazooClient

from tests.support.helpers import wait_for
from tests.support.processes import Cluster, Publish, Replica
from tests.support.servers import RedisServer, ZooKeeperServer
from tests.test_cli import zkbeat
from zkbeat.ledger.history import RECENT_RUNS, Run
from zkbeat.ledger.store import Ledger, decode_state
from zkbeat.ops.dashboard.describe import next_fires
from zkbeat.ops.status import read_entry
from zkbeat.ticking.jitter import offset

pytestmark = pytest.mark.processes

APP = "tests.support.beatapp"
SCHEDULE = {"tick": 1, "hourly": 3600}
#: "hourly" is published up to 10 minutes after each slot.
OPTIONS = {"hourly": {"zkbeat_jitter": 600}}


@pytest.fixture
def cluster(zk_server: ZooKeeperServer, redis_server: RedisServer, zk_root: str, tmp_path: Path) -> Iterator[Cluster]:
    cluster = Cluster(2, zk_hosts=zk_server.hosts, broker=redis_server.url, root=zk_root, schedule=SCHEDULE,
                      log_dir=tmp_path, extra_env={"ZKBEAT_TEST_ENTRY_OPTIONS": json.dumps(OPTIONS)})  # fmt: skip
    cluster.start()
    yield cluster
    cluster.stop()


def cli(cluster: Cluster, *args: str):
    return zkbeat("-A", APP, *args, env=dict(cluster.env))


def runs(zk_client: KazooClient, cluster: Cluster, name: str) -> tuple[Run, ...]:
    """The entry's recent runs, read as ``zkbeat history`` reads them."""
    record = read_entry(zk_client, cluster.root, "-", name)
    assert record is not None and record.state is not None
    return record.state.recent


def ms(moment: datetime) -> datetime:
    return moment.replace(microsecond=moment.microsecond // 1000 * 1000)


def key(publish: Publish) -> tuple[datetime, int, str, str]:
    return ms(publish.slot), publish.epoch, publish.identity, "manual" if publish.manual else "-"


def run_key(run: Run) -> tuple[datetime, int, str, str]:
    return run.slot, run.epoch, run.replica, "manual" if run.kind == "manual" else "-"


def stop_gracefully(replica: Replica) -> None:
    replica.signal(signal.SIGTERM)
    replica.wait(30)


def test_history_keeps_the_last_runs_across_a_kill_9_failover_with_their_kinds(
    cluster: Cluster, zk_client: KazooClient
) -> None:
    """After a kill -9 failover the entry's history holds both replicas' runs and epochs, newest first, bounded at
    K; a run-now is manual, the tick a pause made late a catch-up; a pause and a resume keep the list; at the end it
    is exactly the last K publishes, and `zkbeat history` prints it (text and --json)."""
    ticks = lambda: [p for p in cluster.publishes() if p.entry == "tick"]  # noqa: E731
    wait_for(lambda: len(ticks()) >= RECENT_RUNS + 2, timeout=60, message=cluster.logs)
    first = cluster.leader()
    assert first is not None
    assert len(runs(zk_client, cluster, "tick")) == RECENT_RUNS  # bounded, though more have run
    wait_for(lambda: "watching the liveness" in "".join(r.log() for r in cluster.replicas), timeout=30)
    first.signal(signal.SIGKILL)
    second = next(r for r in cluster.replicas if r is not first)
    wait_for(lambda: any(p.identity == second.identity for p in ticks()), timeout=30, message=cluster.logs)

    # Read at once (the new leader adds a run a second): both replicas' runs, newest first, epochs in order.
    seen = runs(zk_client, cluster, "tick")
    assert len(seen) == RECENT_RUNS
    assert {run.replica for run in seen} == {first.identity, second.identity}, seen
    assert [run.at for run in seen] == sorted((run.at for run in seen), reverse=True)
    assert [run.epoch for run in seen] == sorted((run.epoch for run in seen), reverse=True)
    assert len({run.epoch for run in seen}) == 2
    assert {run.kind for run in seen} <= {"scheduled", "catch-up"}

    # A run-now is recorded as manual.
    triggered = cli(cluster, "trigger", "tick", "--json")
    assert triggered.returncode == 0, triggered.stderr
    assert any(run.kind == "manual" for run in runs(zk_client, cluster, "tick"))
    # A pause and a resume keep the list; the tick the pause held back is published late: a catch-up.
    assert cli(cluster, "pause", "tick", "--note", "a while").returncode == 0
    held = runs(zk_client, cluster, "tick")
    assert len(held) == RECENT_RUNS
    # Its ticks come due and are held back (the leader writes nothing for a paused entry), for over a period.
    wait_for(lambda: "zkbeat: tick is paused" in second.log(), timeout=30, message=cluster.logs)
    wait_for(lambda: datetime.now(timezone.utc) - held[0].at > timedelta(seconds=2.5), timeout=10)
    assert runs(zk_client, cluster, "tick") == held
    assert cli(cluster, "resume", "tick").returncode == 0
    wait_for(lambda: runs(zk_client, cluster, "tick")[0] != held[0], timeout=30, message=cluster.logs)
    resumed = runs(zk_client, cluster, "tick")
    kept = resumed.index(held[0])  # the runs since the resume come first, the ones before follow unchanged
    assert kept >= 1 and resumed[kept:] == held[: RECENT_RUNS - kept]
    assert resumed[kept - 1].kind == "catch-up", resumed[kept - 1]
    stop_gracefully(second)

    # At rest: the history is the last K publishes, newest first. (A kill -9 between a claim and its send leaves
    # at most one run the killed leader claimed and never sent; it is in the history, never in the publishes.)
    final = runs(zk_client, cluster, "tick")
    published = [key(p) for p in reversed(ticks())]
    recorded = [run_key(run) for run in final]
    unsent = [k for k in recorded if k not in published]
    assert len(unsent) <= 1 and all(k[2] == first.identity for k in unsent), unsent
    assert [k for k in recorded if k not in unsent] == published[: RECENT_RUNS - len(unsent)]

    shown = cli(cluster, "history", "tick", "--json")
    assert shown.returncode == 0, shown.stderr
    data = json.loads(shown.stdout)
    assert data["ok"] and data["entry"] == "tick" and data["kept"] == RECENT_RUNS
    assert data["runs"] == [run.as_dict() for run in final]
    assert set(data["runs"][0]) == {"slot", "at", "late_seconds", "replica", "epoch", "kind"}
    text = cli(cluster, "history", "tick")
    assert text.returncode == 0, text.stderr
    print(text.stdout)
    lines = text.stdout.splitlines()
    assert lines[0] == f"tick: {RECENT_RUNS} recent runs, newest first (at most {RECENT_RUNS} kept)"
    assert lines[1].split() == ["slot", "published", "late", "replica", "epoch", "kind"]
    assert len(lines) == 2 + RECENT_RUNS
    for line, run in zip(lines[2:], final):
        assert run.replica in line and f" {run.epoch} " in line and line.rstrip().endswith(run.kind)
        # Shown to the nearest second: a slot at 11:34:59.7 reads 11:35:00.
        shown = (run.slot + timedelta(microseconds=500_000)).replace(microsecond=0)
        assert f"{shown:%Y-%m-%d %H:%M:%S} (" in line and "ago)" in line, (run.slot, line)


def test_next_prints_the_fire_times_with_the_entrys_jitter(cluster: Cluster, zk_client: KazooClient) -> None:
    """`zkbeat next` prints the next n fire times as the leader publishes them: each slot plus its jitter offset,
    the same as the dashboard computes them."""
    wait_for(lambda: cluster.publishes(), timeout=60, message=cluster.logs)  # a start under load
    # Run once, so that the ledger holds its last run (before it, every process counts from its own start).
    assert cli(cluster, "trigger", "hourly").returncode == 0
    shown = cli(cluster, "next", "hourly", "-n", "4", "--json")
    assert shown.returncode == 0, shown.stderr
    data = json.loads(shown.stdout)
    assert data["ok"] and data["entry"] == "hourly" and data["schedule"] == "every 1 h" and data["paused"] is None
    fires = data["next"]
    assert len(fires) == 4
    slots = [datetime.fromisoformat(f["slot"]) for f in fires]
    assert [b - a for a, b in zip(slots, slots[1:])] == [timedelta(hours=1)] * 3
    for fire, slot in zip(fires, slots):
        jitter = (datetime.fromisoformat(fire["at"]) - slot).total_seconds()
        assert jitter == pytest.approx(offset(cluster.root, "hourly", slot, 600), abs=1e-6)
        assert 0 <= jitter < 600
    assert len({f["at"] for f in fires}) == 4 and any(f["at"] != f["slot"] for f in fires)
    # The dashboard's own computation, from the same ledger state, says the same.
    record = read_entry(zk_client, cluster.root, "-", "hourly")
    app = Celery("same", set_as_current=False)
    entry = ScheduleEntry(name="hourly", task="beatapp.record", schedule=timedelta(hours=1), app=app,
                          options=OPTIONS["hourly"])  # fmt: skip
    assert next_fires(entry, record.state, cluster.root, 0.0, datetime.now(timezone.utc), 4) == fires

    text = cli(cluster, "next", "tick")
    assert text.returncode == 0, text.stderr
    print(text.stdout)
    lines = text.stdout.splitlines()
    assert lines[0] == "tick (every 1 s): next 10 fire times"
    assert lines[1].split() == ["slot", "published", "at", "jitter"]
    assert len(lines) == 12 and all(line.rstrip().endswith("0.000s") for line in lines[2:])

    # operating.md: "a slot already due comes first, marked `due now`, and a paused entry says that none of them
    # is published until it is resumed". Paused, tick's next slot comes due and stays due.
    assert cli(cluster, "pause", "tick", "--note", "held for next").returncode == 0

    def paused_and_due() -> list[str] | None:
        shown = cli(cluster, "next", "tick", "-n", "3")
        assert shown.returncode == 0, shown.stderr
        found = shown.stdout.splitlines()
        return found if "(due now)" in found[3] else None

    lines = wait_for(paused_and_due, timeout=30, message=cluster.logs)
    assert "none of these is published until resumed" in lines[1] and lines[1].lstrip().startswith("paused by ")
    assert "(due now)" not in "".join(lines[4:])
    data = json.loads(cli(cluster, "next", "tick", "-n", "3", "--json").stdout)
    assert data["paused"]["note"] == "held for next" and data["next"][0]["due"] is True
    assert [f["due"] for f in data["next"][1:]] == [False, False]
    assert cli(cluster, "resume", "tick").returncode == 0


def test_an_unknown_entry_is_a_clear_failure_in_text_and_json(cluster: Cluster, zk_root: str,
                                                              zk_server: ZooKeeperServer) -> None:  # fmt: skip
    """history and next of an entry nobody knows exit 1 naming it, and --json says so as JSON; an empty name or a
    count out of range is one line, exit 2; next without the app cannot know the schedule: exit 2, saying to pass
    -A."""
    wait_for(lambda: cluster.publishes(), timeout=60, message=cluster.logs)  # a start under load
    for command in ("history", "next"):
        text = cli(cluster, command, "nope")
        assert text.returncode == 1 and text.stdout == "", (command, text.stdout, text.stderr)
        assert "unknown entry 'nope'" in text.stderr and text.stderr.count("\n") == 1, text.stderr
        shown = cli(cluster, command, "nope", "--json")
        assert shown.returncode == 1
        data = json.loads(shown.stdout)
        assert data["ok"] is False and data["entry"] == "nope" and "unknown entry 'nope'" in data["error"]
    for command in (("history", ""), ("next", " ")):
        empty = cli(cluster, *command)
        assert empty.returncode == 2 and "the entry name is empty" in empty.stderr, empty.stderr
    for count in ("0", "1001", "x"):
        bad = cli(cluster, "next", "tick", "-n", count)
        assert bad.returncode == 2 and "'-n'" in bad.stderr and "Traceback" not in bad.stderr, bad.stderr
    bare = zkbeat("--hosts", zk_server.hosts, "--root", zk_root, "next", "tick", "--json")
    assert bare.returncode == 2 and "pass your Celery app with -A" in json.loads(bare.stdout)["error"]
    # Without the app, history still reads the ledger.
    from_root = zkbeat("--hosts", zk_server.hosts, "--root", zk_root, "history", "tick", "--json")
    assert from_root.returncode == 0 and json.loads(from_root.stdout)["runs"], from_root.stderr


def test_bad_history_in_the_ledger_is_logged_and_survived(cluster: Cluster, zk_client: KazooClient) -> None:
    """A malformed 'recent' list (bad data in ZooKeeper) reads as no history and keeps the entry's state; a field
    of a later release is ignored; `zkbeat history` shows both; a new leader logs it, runs both entries, and the
    malformed list starts again while the other keeps its runs."""
    wait_for(lambda: len([p for p in cluster.publishes() if p.entry == "tick"]) >= 3, timeout=60,
             message=cluster.logs)  # fmt: skip
    assert cli(cluster, "trigger", "hourly").returncode == 0
    for replica in cluster.replicas:
        stop_gracefully(replica)
    ledger = Ledger(zk_client, cluster.root)
    raw, _ = zk_client.get(ledger.entry_path("tick"))
    before = decode_state(raw)
    broken = json.loads(raw)
    broken["recent"] = [["not a time", 1, "someone", None, "scheduled"], "junk"]
    zk_client.set(ledger.entry_path("tick"), json.dumps(broken).encode())
    raw, _ = zk_client.get(ledger.entry_path("hourly"))
    hourly_before = decode_state(raw)
    assert hourly_before.recent
    later = json.loads(raw)
    later["a_later_release"] = {"field": [1, 2, 3]}
    zk_client.set(ledger.entry_path("hourly"), json.dumps(later).encode())

    shown = cli(cluster, "history", "tick", "--json")
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["runs"] == []
    assert "none recorded" in cli(cluster, "history", "tick").stdout
    assert json.loads(cli(cluster, "history", "hourly", "--json").stdout)["runs"] == [
        run.as_dict() for run in hourly_before.recent
    ]
    status = json.loads(cli(cluster, "status", "--json").stdout)
    tick = next(e for e in status["entries"] if e["name"] == "tick")
    assert tick["readable"] and tick["total_run_count"] == before.total_run_count and tick["recent_runs"] == []

    new = cluster.add()
    wait_for(lambda: len([r for r in runs(zk_client, cluster, "tick") if r.replica == new.identity]) >= 2,
             timeout=60, message=cluster.logs)  # fmt: skip
    assert "'recent' runs record zkbeat cannot read" in new.log()
    after = decode_state(zk_client.get(ledger.entry_path("tick"))[0])
    assert after.total_run_count > before.total_run_count  # the entry's state was kept and went on
    assert {run.replica for run in after.recent} == {new.identity}  # started again from the new leader's runs
    # The later release's field did not stop the entry; it is left as it is until the entry's next claim (an hour).
    assert decode_state(zk_client.get(ledger.entry_path("hourly"))[0]).recent == hourly_before.recent

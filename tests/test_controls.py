"""Operator controls against real ``celery beat`` replicas, ZooKeeper and Redis:
pause and resume, trigger (run now), and what bad input does to them."""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import pytest
from kazoo.client import KazooClient

from tests.support.helpers import wait_for
from tests.support.processes import Cluster
from tests.support.servers import RedisServer, ZooKeeperServer
from tests.test_cli import zkbeat
from zkbeat.ledger.store import Ledger, decode_state

pytestmark = pytest.mark.processes

SCHEDULE = {"held": 1, "steady": 1}


@pytest.fixture
def cluster(zk_server: ZooKeeperServer, redis_server: RedisServer, zk_root: str, tmp_path: Path) -> Iterator[Cluster]:
    cluster = Cluster(2, zk_hosts=zk_server.hosts, broker=redis_server.url, root=zk_root, schedule=SCHEDULE,
                      log_dir=tmp_path)  # fmt: skip
    cluster.start()
    wait_for(lambda: {"held", "steady"} <= {p.entry for p in cluster.publishes()}, timeout=30, message=cluster.logs)
    yield cluster
    cluster.stop()


def cli(cluster: Cluster, *args: str):
    return zkbeat("-A", "tests.support.beatapp", *args, env=dict(cluster.env))


def rows(cluster: Cluster) -> list[dict]:
    """Every publish as recorded, with its zkbeat-manual header (None for a scheduled tick)."""
    return [json.loads(raw) for raw in cluster.redis.lrange(cluster.record_key, 0, -1)]


def ledger_slot(zk_client: KazooClient, root: str, name: str) -> datetime:
    raw, _ = zk_client.get(Ledger(zk_client, root).entry_path(name))
    return decode_state(raw).slot


def scheduled_after(cluster: Cluster, name: str, slot: datetime) -> list:
    """Publishes of ``name`` for slots after ``slot`` (this test triggers nothing, so all are scheduled)."""
    return [p for p in cluster.publishes() if p.entry == name and p.slot > slot]


def test_pause_holds_an_entry_on_every_leader_until_resumed(cluster: Cluster, zk_client: KazooClient,
                                                            zk_root: str) -> None:  # fmt: skip
    """A paused entry publishes nothing, through a kill -9 failover, until resumed, then catches up once; the other
    entry keeps running."""
    paused = cli(cluster, "pause", "held", "--note", "db migration, back at 3pm", "--json")
    assert paused.returncode == 0, paused.stderr
    assert json.loads(paused.stdout)["paused"]["note"] == "db migration, back at 3pm"
    held_slot = ledger_slot(zk_client, zk_root, "held")  # the last tick claimed before the pause

    shown = json.loads(cli(cluster, "status", "--json").stdout)
    entry = next(e for e in shown["entries"] if e["name"] == "held")
    assert entry["paused"]["note"] == "db migration, back at 3pm" and "@" in entry["paused"]["by"]
    text = cli(cluster, "status").stdout
    print(text)
    assert "paused (1):" in text and "held: by " in text and "db migration" in text

    start = len(cluster.publishes())
    wait_for(lambda: sum(p.entry == "steady" for p in cluster.publishes()[start:]) >= 3, timeout=20,
             message=cluster.logs)  # fmt: skip
    leader = cluster.leader()
    leader.signal(signal.SIGKILL)
    wait_for(lambda: any(p.entry == "steady" and p.pid != leader.pid for p in cluster.publishes()[start:]),
             timeout=30, message=cluster.logs)  # fmt: skip
    follower_start = len(cluster.publishes())
    wait_for(lambda: sum(p.entry == "steady" for p in cluster.publishes()[follower_start:]) >= 3, timeout=20)
    assert scheduled_after(cluster, "held", held_slot) == [], "a paused entry was published"
    assert ledger_slot(zk_client, zk_root, "held") == held_slot
    assert "held is paused (by " in cluster.logs()
    # operating.md: "the leader logs the pause once" (a term's line, not one per tick it holds back).
    said = [r.log().count("held is paused (by ") for r in cluster.replicas]
    assert sum(said) >= 1 and max(said) == 1, (said, cluster.logs())

    resumed_at = time.time()
    resumed = cli(cluster, "resume", "held", "--json")
    assert resumed.returncode == 0, resumed.stderr
    assert json.loads(resumed.stdout)["was_paused"]["note"] == "db migration, back at 3pm"
    wait_for(lambda: len(scheduled_after(cluster, "held", held_slot)) >= 2, timeout=20, message=cluster.logs)
    # What it missed while paused follows the catch-up policy (the default, once): one run, late.
    caught_up = [p for p in scheduled_after(cluster, "held", held_slot) if p.slot.timestamp() < resumed_at]
    assert len(caught_up) == 1, f"the missed ticks did not run once on resume: {caught_up}\n{cluster.logs()}"
    slots = [p.slot for p in cluster.publishes() if p.entry == "held"]
    assert len(slots) == len(set(slots)), "a tick was published twice"
    again = cli(cluster, "resume", "held", "--json")
    assert again.returncode == 0 and json.loads(again.stdout)["changed"] is False


def test_trigger_runs_once_while_leading_while_paused_and_across_a_kill(cluster: Cluster) -> None:
    """Each trigger is one extra publish with its manual header and request-derived task id, never two."""
    first = cli(cluster, "trigger", "steady", "--json")
    assert first.returncode == 0, first.stderr
    done = json.loads(first.stdout)
    print(f"zkbeat trigger returned {done['seconds'] * 1000:.0f} ms after the request, once published")
    manual = [r for r in rows(cluster) if r["manual"] == done["request"]]
    assert len(manual) == 1 and manual[0]["task_id"] == done["published"]["task_id"]

    assert cli(cluster, "pause", "held").returncode == 0
    while_paused = cli(cluster, "trigger", "held", "--json")
    assert while_paused.returncode == 0, while_paused.stderr
    request = json.loads(while_paused.stdout)["request"]
    assert [r["entry"] for r in rows(cluster) if r["manual"] == request] == ["held"]

    leader = cluster.leader()
    # Stopped first, so the request is surely still pending when its leader
    # dies (a leader killed between its claim and the send loses the run, at most once).
    leader.signal(signal.SIGSTOP)
    asked = cli(cluster, "trigger", "steady", "--no-wait", "--json")
    leader.signal(signal.SIGKILL)
    killed = json.loads(asked.stdout)["request"]
    wait_for(lambda: any(r["manual"] == killed for r in rows(cluster)), timeout=30, message=cluster.logs)
    # The new leader goes on publishing; the request must not come back.
    after = len(rows(cluster))
    wait_for(lambda: sum(r["entry"] == "steady" for r in rows(cluster)[after:]) >= 3, timeout=20)
    for name in (done["request"], request, killed):
        assert sum(r["manual"] == name for r in rows(cluster)) == 1, name
    ids = [r["task_id"] for r in rows(cluster)]
    assert len(ids) == len(set(ids))
    assert sum(r["entry"] == "held" and r["manual"] is None for r in rows(cluster)[after:]) == 0


def test_bad_input_is_refused_or_removed_and_never_runs_twice(cluster: Cluster, zk_client: KazooClient,
                                                              zk_root: str) -> None:  # fmt: skip
    """Unknown entries, bad notes and a hand-written garbage request: a clear error or logged and removed."""
    for command in (("pause", "nope"), ("resume", "nope"), ("trigger", "nope")):
        result = cli(cluster, *command)
        assert result.returncode == 1 and "'nope'" in result.stderr, (command, result.stderr)
        assert len(result.stderr.strip().splitlines()) == 1
    long = cli(cluster, "pause", "held", "--note", "x" * 10_000)
    assert long.returncode == 2 and "10000 characters" in long.stderr
    control = cli(cluster, "pause", "held", "--note", "line\nforged\x1b[2J")
    assert control.returncode == 2 and "control characters" in control.stderr
    entries = json.loads(cli(cluster, "status", "--json").stdout)["entries"]
    assert next(e for e in entries if e["name"] == "held")["paused"] is None

    triggers = f"{zk_root}/v1/triggers"
    zk_client.ensure_path(triggers)
    junk = [
        zk_client.create(f"{triggers}/request-", b"\xff\x00 not json", sequence=True),
        zk_client.create(
            f"{triggers}/request-",
            json.dumps({"entry": "gone-entry", "by": "x", "at": "2024-01-01T00:00:00+00:00"}).encode(),
            sequence=True,
        ),  # noqa: E501
        zk_client.create(f"{triggers}/somebody-elses", b"{}"),
    ]
    good = cli(cluster, "trigger", "steady", "--json")
    assert good.returncode == 0, good.stderr + cluster.logs()
    wait_for(lambda: all(zk_client.exists(path) is None for path in junk), timeout=20, message=cluster.logs)
    assert "removing the trigger request" in cluster.logs() and "gone-entry" in cluster.logs()
    assert all(r.alive for r in cluster.replicas)
    request = json.loads(good.stdout)["request"]
    assert sum(r["manual"] == request for r in rows(cluster)) == 1
    assert not any(r["entry"] == "gone-entry" for r in rows(cluster))

"""What `zkbeat trigger`, `pause` and `status` report against real ``celery
beat`` replicas when a run-now does not simply run: consumed without a
receipt, kept pending by a leader whose schedule lacks the entry, refused;
and the command's answers to bad arguments, always one line (or one JSON
object with --json), never a traceback."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from kazoo.client import KazooClient
from kazoo.security import ACL, Id, Permissions, make_digest_acl

from tests.support.helpers import wait_for
from tests.support.processes import Cluster
from tests.support.servers import RedisServer, ZooKeeperServer
from tests.test_cli import APP, zkbeat

pytestmark = pytest.mark.processes

SCHEDULE = {"steady": 1}
#: The schedule of the release being rolled out: one entry more.
NEWER = {"steady": 1, "coming-soon": 1}


def make(zk_server: ZooKeeperServer, redis_server: RedisServer, root: str, log_dir: Path, **env: str) -> Cluster:
    cluster = Cluster(1, zk_hosts=zk_server.hosts, broker=redis_server.url, root=root, schedule=SCHEDULE,
                      log_dir=log_dir, extra_env=env)  # fmt: skip
    cluster.start()
    wait_for(lambda: cluster.publishes(), timeout=30, message=cluster.logs)
    return cluster


@pytest.fixture
def cluster(zk_server: ZooKeeperServer, redis_server: RedisServer, zk_root: str, tmp_path: Path) -> Iterator[Cluster]:
    cluster = make(zk_server, redis_server, zk_root, tmp_path)
    yield cluster
    cluster.stop()


def cli(cluster: Cluster, *args: str, schedule: dict | None = None):
    env = dict(cluster.env)
    if schedule is not None:
        env["ZKBEAT_TEST_SCHEDULE"] = json.dumps(schedule)
    return zkbeat("-A", APP, *args, env=env)


def manual_rows(cluster: Cluster, request: str) -> list[dict]:
    return [json.loads(raw) for raw in cluster.redis.lrange(cluster.record_key, 0, -1)
            if json.loads(raw).get("manual") == request]  # fmt: skip


def test_trigger_says_what_became_of_a_request_it_waited_for_in_vain(
    cluster: Cluster, zk_client: KazooClient, zk_server: ZooKeeperServer, zk_root: str
) -> None:
    """Consumed but no receipt: exit 3 with the task id that went out. Kept pending by a leader whose schedule
    lacks the entry: exit 1 with the leader's reason, listed by status, and run once when a replica with the
    newer schedule leads."""
    # Another ZooKeeper user owns triggers/done: every receipt write fails, the runs themselves go out.
    zk_client.ensure_path(f"{zk_root}/v1/triggers")
    stranger = KazooClient(zk_server.hosts, auth_data=[("digest", "stranger:pw")])
    stranger.start(timeout=15)
    read_only = [make_digest_acl("stranger", "pw", all=True), ACL(Permissions.READ, Id("world", "anyone"))]
    try:
        stranger.create(f"{zk_root}/v1/triggers/done", b"", acl=read_only)
    finally:
        stranger.stop()
        stranger.close()
    consumed = cli(cluster, "trigger", "steady", "--wait-timeout", "10", "--json")
    assert consumed.returncode == 3, consumed.stdout + consumed.stderr + cluster.logs()
    report = json.loads(consumed.stdout)
    assert report["state"] == "consumed" and report["ok"] is False
    [row] = manual_rows(cluster, report["request"])
    assert report["task_id"] == row["task_id"]
    assert row["task_id"] in consumed.stderr and "no receipt came" in consumed.stderr
    assert "receipt could not be written" in cluster.logs()

    pending = cli(cluster, "trigger", "coming-soon", "--wait-timeout", "3", "--json", schedule=NEWER)
    assert pending.returncode == 1, pending.stdout + pending.stderr
    report = json.loads(pending.stdout)
    assert report["state"] == "pending" and report["published"] is None
    assert "not in this leader's schedule" in report["held"]["why"]
    assert "still pending" in pending.stderr and "not in this leader's schedule" in pending.stderr
    request = report["request"]

    shown = json.loads(cli(cluster, "status", "--json", schedule=NEWER).stdout)
    [waiting] = shown["pending"]
    assert waiting["request"] == request and waiting["entry"] == "coming-soon" and "@" in waiting["by"]
    text = cli(cluster, "status", schedule=NEWER).stdout
    assert "run-now requests waiting (1):" in text and f"{request}: coming-soon by " in text, text

    newer = cluster.add({"ZKBEAT_TEST_SCHEDULE": json.dumps(NEWER)})
    wait_for(lambda: "joining the election" in newer.log(), timeout=30)
    assert cli(cluster, "step-down", "--wait").returncode == 0
    wait_for(lambda: manual_rows(cluster, request), timeout=30, message=cluster.logs)
    assert [r["identity"] for r in manual_rows(cluster, request)] == [newer.identity]
    assert json.loads(cli(cluster, "status", "--json").stdout)["pending"] == []


def test_a_refused_request_and_bad_arguments_are_answered_in_one_line_or_one_json_object(
    zk_server: ZooKeeperServer, redis_server: RedisServer, zk_root: str, tmp_path: Path
) -> None:
    """A leader past its patience refuses (exit 1, its reason); empty names, negative timeouts and unknown entries
    get one line and, with --json, a JSON object; pause works for an entry that never ran."""
    cluster = make(zk_server, redis_server, zk_root, tmp_path, ZKBEAT_TEST_TRIGGER_PATIENCE="0")
    try:
        refused = cli(cluster, "trigger", "coming-soon", "--json", schedule=NEWER)
        assert refused.returncode == 1, refused.stdout + refused.stderr + cluster.logs()
        report = json.loads(refused.stdout)
        assert report["state"] == "refused" and "'coming-soon' is not in the leader's schedule" in report["reason"]
        assert "was refused by the leader" in refused.stderr

        for command in (("pause", ""), ("trigger", ""), ("resume", " ")):
            empty = cli(cluster, *command)
            assert empty.returncode == 2 and "the entry name is empty" in empty.stderr, empty.stderr
            assert "Traceback" not in empty.stderr and len(empty.stderr.strip().splitlines()) == 1
        for flags in (("--timeout", "-1", "status"), ("trigger", "steady", "--wait-timeout", "-1"),
                      ("step-down", "--wait-timeout", "-5")):  # fmt: skip
            negative = cli(cluster, *flags)
            flag = next(f for f in flags if f.startswith("--"))
            assert negative.returncode == 2 and f"'{flag}'" in negative.stderr, negative.stderr
        for command in ("pause", "resume", "trigger"):
            unknown = cli(cluster, command, "nope", "--json")
            assert unknown.returncode == 1, unknown.stderr
            answer = json.loads(unknown.stdout)
            assert answer["ok"] is False and answer["entry"] == "nope" and "'nope'" in answer["error"]

        never = cli(cluster, "pause", "hourly", "--note", "not yet", "--json", schedule={**SCHEDULE, "hourly": 3600})
        assert never.returncode == 0, never.stderr
        assert json.loads(never.stdout)["paused"]["note"] == "not yet"
        shown = json.loads(cli(cluster, "status", "--json", schedule={**SCHEDULE, "hourly": 3600}).stdout)
        assert next(e for e in shown["entries"] if e["name"] == "hourly")["paused"]["note"] == "not yet"
        resumed = cli(cluster, "resume", "hourly", "--json", schedule={**SCHEDULE, "hourly": 3600})
        assert resumed.returncode == 0 and json.loads(resumed.stdout)["changed"] is True
    finally:
        cluster.stop()


def test_an_entry_that_never_ran_paused_on_a_running_leader_counts_its_next_run_from_the_pause(
    zk_server: ZooKeeperServer, redis_server: RedisServer, zk_root: str, tmp_path: Path
) -> None:
    """docs/operating.md: an entry of the app's schedule that never ran can be paused; its ledger state starts at
    the pause, no replica publishes it until it is resumed, and once resumed it counts its next run from the
    pause. Here the running leader's own count (from its start) would name another slot."""
    every = 15  # its first tick, counted from the replica's start: long after the pause below
    schedule = {**SCHEDULE, "fresh": every}
    cluster = Cluster(1, zk_hosts=zk_server.hosts, broker=redis_server.url, root=zk_root, schedule=schedule,
                      log_dir=tmp_path)  # fmt: skip
    cluster.start()
    try:
        wait_for(lambda: cluster.publishes(), timeout=30, message=cluster.logs)
        paused = cli(cluster, "pause", "fresh", "--note", "not yet", "--json", schedule=schedule)
        assert paused.returncode == 0, paused.stdout + paused.stderr + cluster.logs()
        at = json.loads(paused.stdout)["paused"]["at"]
        [shown] = [e for e in json.loads(cli(cluster, "status", "--json", schedule=schedule).stdout)["entries"]
                   if e["name"] == "fresh"]  # fmt: skip
        assert shown["paused"]["note"] == "not yet" and shown["total_run_count"] == 0, shown
        assert datetime.fromisoformat(shown["last_run_at"]) == datetime.fromisoformat(at), "not started at the pause"
        assert [p for p in cluster.publishes() if p.entry == "fresh"] == [], "it ran before the pause: too slow a start"
        # Due on the leader's own count (from its start): it finds the pause instead, and says so once.
        wait_for(lambda: "fresh is paused" in cluster.logs(), timeout=every + 30, message=cluster.logs)
        assert [p for p in cluster.publishes() if p.entry == "fresh"] == [], "published while paused"
        resumed = cli(cluster, "resume", "fresh", "--json", schedule=schedule)
        assert resumed.returncode == 0 and json.loads(resumed.stdout)["changed"] is True, resumed.stderr
        [run] = wait_for(lambda: [p for p in cluster.publishes() if p.entry == "fresh"], timeout=every + 30,
                         message=cluster.logs)  # fmt: skip
        assert run.slot == datetime.fromisoformat(at) + timedelta(seconds=every), (run.slot, at)
        assert cluster.logs().count("fresh is paused") == 1
    finally:
        cluster.stop()

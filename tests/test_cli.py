"""The `zkbeat` command against real replicas: status, step-down, health, and
its one-line failures."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from kazoo.client import KazooClient

from tests.support.helpers import wait_for
from tests.support.processes import ROOT, Cluster
from tests.support.servers import RedisServer, ZooKeeperServer, free_port

pytestmark = pytest.mark.processes

SCHEDULE = {"cleanup": 1, "report": 3}
#: The replicas' Celery app, as `celery -A` names it.
APP = "tests.support.beatapp"


def zkbeat(*args: str, env: dict[str, str] | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "zkbeat.ops.cli", *args],
        env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
    )


@pytest.fixture
def cluster(zk_server: ZooKeeperServer, redis_server: RedisServer, zk_root: str, tmp_path: Path) -> Iterator[Cluster]:
    cluster = Cluster(
        3, zk_hosts=zk_server.hosts, broker=redis_server.url, root=zk_root, schedule=SCHEDULE, log_dir=tmp_path
    )
    cluster.start()
    wait_for(lambda: len(cluster.publishes()) >= 2, timeout=30, message=cluster.logs)
    wait_for(lambda: all("joining the election" in r.log() for r in cluster.replicas), timeout=30)
    yield cluster
    cluster.stop()


def app_env(cluster: Cluster) -> dict[str, str]:
    """The environment under which `-A tests.support.beatapp` is the cluster's own app."""
    return {key: value for key, value in cluster.env.items()}


def test_status_shows_leader_candidates_and_entries(cluster: Cluster) -> None:
    """status names the publishing replica as leader, lists all three candidates in order, and each entry's runs."""
    wait_for(
        lambda: len(json.loads(zkbeat("-A", APP, "status", "--json", env=app_env(cluster)).stdout)["candidates"]) == 3,
        timeout=30,
    )
    result = zkbeat("-A", APP, "status", "--json", env=app_env(cluster))
    assert result.returncode == 0, result.stderr
    found = json.loads(result.stdout)
    publisher = cluster.publishes()[-1]
    assert found["leader"]["identity"] == publisher.identity
    assert found["leader"]["pid"] == publisher.pid
    assert found["leader"]["leader_since"]
    sequences = [c["sequence"] for c in found["candidates"]]
    assert sequences == sorted(sequences) and len(sequences) == 3
    # Only the leader has an epoch: the others never led under their candidates.
    assert [c["epoch"] for c in found["candidates"]] == [found["leader"]["epoch"], None, None]
    entries = {e["name"]: e for e in found["entries"]}
    assert set(entries) == set(SCHEDULE)
    assert entries["cleanup"]["total_run_count"] >= 1 and entries["cleanup"]["next_due"]

    text = zkbeat("-A", APP, "status", env=app_env(cluster))
    assert text.returncode == 0
    assert f"leader: {publisher.identity}" in text.stdout
    assert "candidates (3):" in text.stdout and "entries (2):" in text.stdout


def test_step_down_wait_moves_leadership(cluster: Cluster) -> None:
    """step-down --wait returns once another replica leads and publishes; the old leader stays, at the back."""
    old = cluster.publishes()[-1]
    result = zkbeat("-A", APP, "step-down", "--wait", env=app_env(cluster))
    assert result.returncode == 0, result.stderr
    found = json.loads(zkbeat("-A", APP, "status", "--json", env=app_env(cluster)).stdout)
    assert found["leader"]["identity"] != old.identity
    assert found["candidates"][-1]["identity"] == old.identity
    wait_for(lambda: any(p.identity != old.identity for p in cluster.publishes()), timeout=10)
    assert all(r.alive for r in cluster.replicas)


def test_health_exit_status(cluster: Cluster, zk_server: ZooKeeperServer, zk_client: KazooClient) -> None:
    """health exits 0 with a leader, 1 with none or a foreign root, 2 when ZooKeeper or the app is out of reach."""
    ok = zkbeat("-A", APP, "health", env=app_env(cluster))
    assert ok.returncode == 0 and ok.stdout.startswith("ok:"), ok.stderr

    zk_client.ensure_path("/not-zkbeat/v2")
    foreign = zkbeat("--hosts", zk_server.hosts, "--root", "/not-zkbeat", "health")
    assert foreign.returncode == 1
    assert "not a zkbeat root" in foreign.stderr and len(foreign.stderr.strip().splitlines()) == 1

    zk_client.ensure_path("/empty-zkbeat/v1/election")
    nobody = zkbeat("--hosts", zk_server.hosts, "--root", "/empty-zkbeat", "health")
    assert nobody.returncode == 1 and "no leader" in nobody.stderr

    unreachable = zkbeat("--hosts", f"127.0.0.1:{free_port()}", "--timeout", "1", "health")
    assert unreachable.returncode == 2
    assert unreachable.stderr.strip().splitlines() == [unreachable.stderr.strip()]
    assert "cannot reach ZooKeeper" in unreachable.stderr

    missing_app = zkbeat("-A", "no_such_module_here", "status")
    assert missing_app.returncode == 2 and "cannot import the Celery app" in missing_app.stderr

    bad_flag = zkbeat("--hosts", "host:notaport", "status")
    assert bad_flag.returncode == 2 and "--hosts" in bad_flag.stderr


def test_runs_as_a_celery_subcommand(cluster: Cluster) -> None:
    """`celery -A proj zkbeat status` reads the same cluster through Celery's own -A."""
    result = subprocess.run(
        [sys.executable, "-m", "celery", "-A", APP, "zkbeat", "status", "--json"],
        env={**os.environ, "PYTHONPATH": str(ROOT), **app_env(cluster)},
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert result.returncode == 0, result.stderr
    assert len(json.loads(result.stdout)["candidates"]) == 3


def test_health_local_follows_this_replicas_connection(
    zk_server_private: ZooKeeperServer, redis_server: RedisServer, zk_root: str, tmp_path: Path
) -> None:
    """health --local is 0 while the replica on this machine is connected and 1 once its ZooKeeper is gone."""
    port = free_port()
    cluster = Cluster(
        1,
        zk_hosts=zk_server_private.hosts,
        broker=redis_server.url,
        root=zk_root,
        schedule={"cleanup": 1},
        log_dir=tmp_path,
        extra_env={"ZKBEAT_TEST_METRICS_PORT": str(port)},
    )
    env = {**cluster.env, "ZKBEAT_TEST_METRICS_PORT": str(port)}
    try:
        cluster.start()
        wait_for(lambda: cluster.publishes(), timeout=30, message=cluster.logs)
        local = zkbeat("-A", APP, "health", "--local", env=env)
        assert local.returncode == 0, local.stderr
        zk_server_private.stop()
        wait_for(lambda: zkbeat("-A", APP, "--timeout", "1", "health", "--local", env=env).returncode == 1, timeout=30)
        down = zkbeat("-A", APP, "--timeout", "1", "health", "--local", env=env)
        assert "not connected" in down.stderr
    finally:
        cluster.stop()

"""A rolling upgrade with controls in use: replicas of the previous release
(layout 1, commit 019ccae) beside this one must never publish a paused entry
nor drop a trigger. The old release runs from ``git archive`` of that commit."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tarfile
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import pytest
from kazoo.client import KazooClient

from tests.support.helpers import wait_for
from tests.support.processes import ROOT, Cluster, Replica
from tests.support.servers import RedisServer, ZooKeeperServer
from tests.test_cli import zkbeat
from zkbeat.ledger.store import Ledger, decode_state

pytestmark = pytest.mark.processes

#: The release before layout 2: it ignores unknown keys in an entry's znode.
PREVIOUS = "019ccae"


@pytest.fixture(scope="module")
def previous_release(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A checkout of the previous release's tree (no git worktree: nothing is registered in the repository)."""
    target = tmp_path_factory.mktemp("zkbeat-previous")
    archive = target / "tree.tar"
    subprocess.run(["git", "-C", str(ROOT), "archive", "-o", str(archive), PREVIOUS], check=True)
    with tarfile.open(archive) as tar:
        tar.extractall(target, filter="data")
    return target


class OldReplica(Replica):
    """``celery beat`` of the previous release: its zkbeat, from its own tree first on the path."""

    tree: Path

    def start(self, extra_env: dict[str, str] | None = None) -> OldReplica:
        self.spawn(
            [sys.executable, "-m", "celery", "-A", "tests.beatapp", "beat", "--scheduler", "zkbeat.Scheduler",
             "--loglevel", "INFO"],
            cwd=self.tree,
            env={**os.environ, **self._env, **(extra_env or {}), "PYTHONPATH": str(self.tree)},
        )  # fmt: skip
        return self


@pytest.fixture
def mixed(zk_server: ZooKeeperServer, redis_server: RedisServer, zk_root: str, tmp_path: Path,
          previous_release: Path) -> Iterator[Cluster]:  # fmt: skip
    cluster = Cluster(0, zk_hosts=zk_server.hosts, broker=redis_server.url, root=zk_root,
                      schedule={"held": 1, "steady": 1}, log_dir=tmp_path)  # fmt: skip
    for index in range(2):
        old = OldReplica(f"old-{index}", cluster.env, tmp_path)
        old.tree = previous_release
        cluster.replicas.append(old)
    yield cluster
    cluster.stop()


def rows(cluster: Cluster) -> list[dict]:
    return [json.loads(raw) for raw in cluster.redis.lrange(cluster.record_key, 0, -1)]


def held_slot(zk_client: KazooClient, root: str):
    raw, _ = zk_client.get(Ledger(zk_client, root).entry_path("held"))
    return decode_state(raw).slot


def test_old_replicas_never_publish_a_paused_entry_nor_drop_a_trigger(mixed: Cluster, zk_client: KazooClient,
                                                                      zk_root: str) -> None:  # fmt: skip
    """Old replicas lead, a new one joins and takes over; once paused, no old replica leads, and a trigger waits."""
    cluster = mixed
    old = list(cluster.replicas)
    for replica in old:
        replica.start()
    wait_for(lambda: {"held", "steady"} <= {r["entry"] for r in rows(cluster)}, timeout=30, message=cluster.logs)
    new = cluster.add()
    # The old leader sees a layout-2 candidate and steps aside for it.
    wait_for(lambda: any(r["identity"] == new.identity for r in rows(cluster)), timeout=60, message=cluster.logs)
    assert any("refusing to lead" in r.log() for r in old), cluster.logs()

    env = dict(cluster.env)
    assert zkbeat("-A", "tests.support.beatapp", "pause", "held", "--note", "upgrade", env=env).returncode == 0
    slot = held_slot(zk_client, zk_root)
    triggered = zkbeat("-A", "tests.support.beatapp", "trigger", "steady", "--json", env=env)
    assert triggered.returncode == 0, triggered.stderr + cluster.logs()

    # The new replica dies: the old ones see <root>/v2 and refuse to lead.
    new.signal(signal.SIGKILL)
    new.wait()
    wait_for(lambda: f"{zk_root}/v2 holds a newer zkbeat layout" in cluster.logs(), timeout=60, message=cluster.logs)
    waiting = json.loads(
        zkbeat("-A", "tests.support.beatapp", "trigger", "steady", "--no-wait", "--json", env=env).stdout
    )
    before = len(rows(cluster))

    # A new replica comes back: it leads, runs the waiting trigger once, and keeps the pause.
    back = cluster.add()
    wait_for(lambda: any(r.get("manual") == waiting["request"] for r in rows(cluster)), timeout=60,
             message=cluster.logs)  # fmt: skip
    wait_for(lambda: sum(r["entry"] == "steady" for r in rows(cluster)[before:]) >= 3, timeout=30)
    published = rows(cluster)
    assert all(r["identity"] == back.identity for r in published[before:]), "an old replica published"
    held = [r for r in published if r["entry"] == "held" and r.get("manual") is None]
    late = [r for r in held if datetime.fromisoformat(r["slot"]) > slot]
    assert late == [], f"a paused entry was published: {late}"
    for request in (json.loads(triggered.stdout)["request"], waiting["request"]):
        assert sum(r.get("manual") == request for r in published) == 1
    ids = [r["task_id"] for r in published]
    assert len(ids) == len(set(ids))

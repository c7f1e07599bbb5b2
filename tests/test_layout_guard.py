"""A command of this release in front of replicas of the previous one: `zkbeat
pause` and `trigger` need layout 2, whose marker makes every layout-1 replica
refuse to lead, so with only layout-1 replicas in line they refuse (naming
them) instead of stopping the cluster, unless told ``--force``.

The replicas run the last layout-1 release (test_controls_upgrade.py's
``git archive`` of it), as a bastion upgraded before the fleet would see them."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from kazoo.client import KazooClient

from tests.support.helpers import wait_for
from tests.support.processes import Cluster
from tests.support.servers import RedisServer, ZooKeeperServer
from tests.test_cli import APP, zkbeat
from tests.test_controls_upgrade import OldReplica, previous_release  # noqa: F401 - the fixture

pytestmark = pytest.mark.processes

SCHEDULE = {f"entry-{i}": 1 for i in range(3)}


@pytest.fixture
def old_cluster(zk_server: ZooKeeperServer, redis_server: RedisServer, zk_root: str, tmp_path: Path,
                previous_release: Path) -> Iterator[Cluster]:  # noqa: F811 - the fixture imported above  # fmt: skip
    cluster = Cluster(0, zk_hosts=zk_server.hosts, broker=redis_server.url, root=zk_root, schedule=SCHEDULE,
                      log_dir=tmp_path)  # fmt: skip
    for index in range(3):
        old = OldReplica(f"old-{index}", cluster.env, tmp_path)
        old.tree = previous_release
        cluster.replicas.append(old)
        old.start()
    wait_for(lambda: set(SCHEDULE) <= {p.entry for p in cluster.publishes()}, timeout=60, message=cluster.logs)
    wait_for(lambda: all("joining the election" in r.log() for r in cluster.replicas), timeout=60)
    yield cluster
    cluster.stop()


def cli(cluster: Cluster, *args: str):
    return zkbeat("-A", APP, *args, env=dict(cluster.env))


def test_commands_that_need_layout_2_refuse_in_front_of_layout_1_replicas(
    old_cluster: Cluster, zk_client: KazooClient, zk_root: str
) -> None:
    """pause and trigger exit 1 naming each replica in line with its version and layout, write nothing, and every
    entry keeps publishing; --force pauses (and the layout-1 replicas then step aside, as documented)."""
    cluster = old_cluster
    for command in (("pause", "entry-0", "--note", "upgrade"), ("trigger", "entry-1")):
        refused = cli(cluster, *command)
        assert refused.returncode == 1, refused.stdout + refused.stderr
        assert refused.stdout == "", f"{command[0]} printed success: {refused.stdout}"
        line = refused.stderr.strip()
        assert len(line.splitlines()) == 1, line
        for replica in cluster.replicas:
            assert f"{replica.identity} (zkbeat 0.1.0, layout 1)" in line, line
        assert "--force" in line and f"{zk_root}/v2" in line
        as_json = json.loads(cli(cluster, *command, "--json").stdout)
        assert as_json["ok"] is False and as_json["exit_status"] == 1 and "layout 1" in as_json["error"]
    assert zk_client.exists(f"{zk_root}/v2") is None
    assert zk_client.exists(f"{zk_root}/v1/triggers") is None

    moment = time.time()
    wait_for(lambda: {p.entry for p in cluster.publishes() if p.at > moment + 2} == set(SCHEDULE), timeout=30,
             message=cluster.logs)  # fmt: skip
    assert "refusing to lead" not in cluster.logs()

    forced = cli(cluster, "pause", "entry-0", "--force", "--json")
    assert forced.returncode == 0, forced.stderr
    assert json.loads(forced.stdout)["changed"] is True
    assert zk_client.exists(f"{zk_root}/v2") is not None
    wait_for(lambda: "refusing to lead" in cluster.logs(), timeout=30, message=cluster.logs)

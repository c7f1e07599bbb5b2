"""Rotating ``zkbeat_auth`` with real ``celery beat`` replicas.

A replica whose credential differs may not read the others' candidates
(each grants only the identity that made it). Such a child, named as zkbeat
names candidates, is a replica it cannot identify: it keeps its place in
line (logged once, naming zkbeat_auth), so a replica with the new
credential never leads beside one with the old. The documented rotation
(docs/operating.md: every replica holds both credentials, ``zkbeat acl``
grants the new one on what exists, then the old one goes) moves a running
cluster to the new credential with every tick published once, and leaves
nothing the old credential can read.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from kazoo.client import KazooClient
from kazoo.exceptions import NoAuthError
from kazoo.security import ACL, Id, Permissions, make_digest_acl

from tests.support.accounting import accounting, assert_clean
from tests.support.helpers import wait_for
from tests.support.processes import Cluster, Replica
from tests.support.servers import RedisServer, ZooKeeperServer
from tests.test_cli import APP, zkbeat

pytestmark = pytest.mark.processes

SCHEDULE = {"entry-0": 1, "entry-1": 1}
OLD = ["digest", "zkbeat:old-secret"]
NEW = ["digest", "zkbeat-2027:new-secret"]


def conf(*auth: list[str]) -> dict[str, str]:
    return {"ZKBEAT_TEST_CONF": json.dumps({"zkbeat_auth": list(auth)})}


@pytest.fixture
def cluster(zk_server: ZooKeeperServer, redis_server: RedisServer, zk_root: str, tmp_path: Path) -> Iterator[Cluster]:
    made = Cluster(0, zk_hosts=zk_server.hosts, broker=redis_server.url, root=zk_root, schedule=SCHEDULE,
                   log_dir=tmp_path)  # fmt: skip
    yield made
    made.stop()


@pytest.fixture
def client_as(zk_server: ZooKeeperServer) -> Iterator:
    made: list[KazooClient] = []

    def make(*auth: list[str]) -> KazooClient:
        client = KazooClient(zk_server.hosts, auth_data=[tuple(a) for a in auth])
        client.start(timeout=15)
        made.append(client)
        return client

    yield make
    for client in made:
        client.stop()
        client.close()


def keeps_publishing(cluster: Cluster, by: Replica | None = None, ticks: int = 3) -> None:
    """Every entry publishes ``ticks`` more times from now on (by ``by``, if given)."""
    moment = time.time()

    def counts() -> int:
        return min(
            sum(1 for p in cluster.publishes() if p.entry == name and p.at > moment and (by is None or p.pid == by.pid))
            for name in SCHEDULE
        )

    wait_for(lambda: counts() >= ticks, timeout=60, message=cluster.logs)  # may span a replica's start


def replace(cluster: Cluster, old: Replica, *auth: list[str]) -> Replica:
    """A rolling restart's step: a replica with ``auth`` joins, then ``old`` stops (SIGTERM, a graceful handover)."""
    new = cluster.add(conf(*auth))
    wait_for(lambda: "joining the election" in new.log(), timeout=60, message=new.log)
    old.signal(15)
    old.wait()
    keeps_publishing(cluster)
    return new


def test_a_replica_without_the_credential_waits_behind_one_it_cannot_read(
    cluster: Cluster, client_as, zk_root: str
) -> None:
    """zkbeat_auth turned on in a rolling restart: a replica still without it cannot read the candidate of one
    with it, yet never leads beside it once that one leads: it follows that unidentified candidate, and says
    once, loudly, that zkbeat_auth differs."""
    first = cluster.add(conf())
    keeps_publishing(cluster, first)
    guarded = cluster.add(conf(NEW))
    wait_for(lambda: "joining the election" in guarded.log(), timeout=60, message=guarded.log)
    behind = cluster.add(conf())
    wait_for(lambda: "joining the election" in behind.log(), timeout=60, message=behind.log)
    first.signal(15)
    first.wait()
    keeps_publishing(cluster, guarded, ticks=4)
    assert "became leader" not in behind.log(), "two leaders:\n" + cluster.logs()
    assert [p for p in cluster.publishes() if p.pid == behind.pid] == []
    log = behind.log()
    assert "zkbeat_auth" in log and "keeps its place" in log, log
    assert log.count("may not be read with this replica's credentials") == 1, log
    assert_clean(accounting(cluster, client_as(NEW)), cluster.logs())


def test_the_documented_rotation_moves_a_running_cluster_to_the_new_credential(
    cluster: Cluster, client_as, zk_root: str
) -> None:
    """Both credentials everywhere, `zkbeat acl`, the new one alone, `zkbeat acl` again: every tick once, nobody
    denied anything on the way, and at the end the old credential reads nothing under the root."""
    first, second = cluster.add(conf(OLD)), cluster.add(conf(OLD))
    keeps_publishing(cluster)
    # 1. Every replica holds both credentials (the new one first: what it creates grants both).
    first = replace(cluster, first, NEW, OLD)
    second = replace(cluster, second, NEW, OLD)
    # 2. Grant the new credential on every znode that exists.
    granted = zkbeat("-A", APP, "acl", env={**cluster.env, **conf(NEW, OLD)})
    assert granted.returncode == 0, granted.stderr
    assert "digest:zkbeat-2027, digest:zkbeat" in granted.stdout, granted.stdout
    # 3. The old credential goes from every replica.
    first = replace(cluster, first, NEW)
    second = replace(cluster, second, NEW)
    # 4. And from every znode.
    revoked = zkbeat("-A", APP, "acl", env={**cluster.env, **conf(NEW)})
    assert revoked.returncode == 0, revoked.stderr
    keeps_publishing(cluster)

    old = client_as(OLD)
    with pytest.raises(NoAuthError):
        old.get_children(f"{zk_root}/v1/entries")
    for name in SCHEDULE:
        with pytest.raises(NoAuthError):
            old.get(f"{zk_root}/v1/entries/{name}")
    new = client_as(NEW)
    for name in SCHEDULE:
        assert new.get_acls(f"{zk_root}/v1/entries/{name}")[0] == [make_digest_acl("zkbeat-2027", "new-secret",
                                                                                    all=True)]  # fmt: skip
    logs = "\n".join(r.log() for r in cluster.replicas)
    assert "NoAuth" not in logs and "may not" not in logs, logs
    assert_clean(accounting(cluster, new), cluster.logs())


def test_zkbeat_acl_changes_what_it_may_and_names_what_it_may_not(cluster: Cluster, client_as, zk_root: str) -> None:
    """A stranger's znode under the root that these credentials may not administer is left as it is and named
    (exit 1); every other znode, below it or beside it, gets the ACL."""
    owner = client_as(NEW)
    mine = [make_digest_acl("zkbeat-2027", "new-secret", all=True)]
    open_to_create = [*mine, ACL(Permissions.CREATE, Id("world", "anyone"))]
    owner.create(f"{zk_root}/v1/entries", b"", acl=open_to_create, makepath=True)
    owner.create(f"{zk_root}/v1/entries/a", b"{}", acl=mine)
    stranger = client_as(["digest", "stranger:pw"])
    locked = stranger.create(f"{zk_root}/v1/entries/locked", b"", acl=[make_digest_acl("stranger", "pw", all=True)])
    done = zkbeat("-A", APP, "acl", "--json", env={**cluster.env, **conf(NEW, OLD)})
    assert done.returncode == 1, done.stderr
    assert locked in done.stderr and "NoAuth" in done.stderr, done.stderr
    report = json.loads(done.stdout)
    assert report["refused"] == [locked] and report["znodes"] >= 4, report
    both = [*mine, make_digest_acl("zkbeat", "old-secret", all=True)]
    for path in (zk_root, f"{zk_root}/v1", f"{zk_root}/v1/entries", f"{zk_root}/v1/entries/a"):
        assert owner.get_acls(path)[0] == both, path
    assert stranger.get_acls(locked)[0] == [make_digest_acl("stranger", "pw", all=True)]


def test_zkbeat_acl_lists_again_a_znode_it_may_administer_but_not_read(
    cluster: Cluster, client_as, zk_root: str
) -> None:
    """A znode that grants these credentials ADMIN but not READ cannot be listed before its ACL changes; once
    changed (the new ACL grants READ) it is listed again: it is counted done, not named as refused, and the
    znodes under it get the ACL too."""
    owner = client_as(NEW, OLD)
    owner.ensure_path(zk_root.rsplit("/", 1)[0])  # open to all: other tests' roots sit beside this one
    mine = [make_digest_acl("zkbeat-2027", "new-secret", all=True)]
    owner.create(f"{zk_root}/v1/entries", b"", acl=mine, makepath=True)
    admin_only = [ACL(Permissions.ADMIN, Id("digest", mine[0].id.id))]
    half = owner.create(f"{zk_root}/v1/entries/half", b"", acl=[*admin_only, make_digest_acl("x", "y", all=True)])
    x = client_as(["digest", "x:y"])
    child = x.create(f"{half}/child", b"", acl=[make_digest_acl("zkbeat", "old-secret", all=True), *mine])

    done = zkbeat("-A", APP, "acl", "--json", env={**cluster.env, **conf(NEW, OLD)})
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["refused"] == [], report
    both = [*mine, make_digest_acl("zkbeat", "old-secret", all=True)]
    assert owner.get_acls(half)[0] == both
    assert owner.get_acls(child)[0] == both

"""The dashboard's model against a real ZooKeeper: it follows changes through watches alone, after a lost
session too, and survives data zkbeat cannot read."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from kazoo.client import KazooClient
from kazoo.security import make_digest_acl

from tests.support.helpers import every, lead, wait_for
from tests.support.servers import ZooKeeperServer, expire_session
from zkbeat.conf import read_settings
from zkbeat.coordination._zookeeper import make_client
from zkbeat.coordination.shards import shard_of
from zkbeat.ledger import controls
from zkbeat.ops.dashboard.model import ClusterModel
from zkbeat.ops.status import read_status


@pytest.fixture
def model(zk_server: ZooKeeperServer, zk_root: str) -> Iterator[ClusterModel]:
    client = KazooClient(zk_server.hosts)
    client.start(timeout=15)
    made = ClusterModel(client, read_settings({"zkbeat_hosts": zk_server.hosts, "zkbeat_root": zk_root}, None))
    made.start()
    yield made
    made.stop()
    client.stop()
    client.close()


def entry(model: ClusterModel, name: str) -> dict[str, Any] | None:
    return next((e for e in model.snapshot()["entries"] if e["name"] == name), None)


def test_the_model_follows_the_cluster_across_a_lost_session_and_survives_bad_data(
    make_scheduler: Callable[..., Any],
    model: ClusterModel,
    zk_client: KazooClient,
    zk_root: str,
    zk_server: ZooKeeperServer,
) -> None:
    """Entries, pauses, strangers and unreadable znodes reach the model by watches, also after its session expired."""
    scheduler = make_scheduler({"a": every(0.2)}, identity="leader-1")
    lead(scheduler)
    wait_for(lambda: scheduler.tick() is not None and entry(model, "a") is not None, timeout=15)
    shard = model.snapshot()["shards"][0]
    assert shard["leader"]["identity"] == "leader-1"
    before = entry(model, "a")["total_run_count"]
    wait_for(lambda: scheduler.tick() is not None and entry(model, "a")["total_run_count"] > before, timeout=10)

    # Its recent runs, newest first, by the in-process leader.
    runs = entry(model, "a")["recent_runs"]
    assert runs and {run["replica"] for run in runs} == {"leader-1"} and runs[0]["kind"] == "scheduled"
    assert [run["at"] for run in runs] == sorted((run["at"] for run in runs), reverse=True)

    zk_client.create(f"{zk_root}/v1/entries/broken", b"\xff not json")
    # A readable state whose history is not: the state shows, the history is empty.
    half = b'{"last_run_at": "2026-01-01T12:00:00+00:00", "total_run_count": 7, "recent": [["junk"]]}'
    zk_client.create(f"{zk_root}/v1/entries/half", half)
    zk_client.create(f"{zk_root}/v1/election/somebody-elses", b"{}")
    wait_for(lambda: entry(model, "broken") is not None and entry(model, "broken")["readable"] is False, timeout=10)
    wait_for(lambda: entry(model, "half") is not None, timeout=10)
    assert entry(model, "half")["readable"] and entry(model, "half")["total_run_count"] == 7
    assert entry(model, "half")["recent_runs"] == []
    wait_for(lambda: model.snapshot()["shards"][0]["strangers"], timeout=10)
    assert model.snapshot()["shards"][0]["leader"]["identity"] == "leader-1"

    expire_session(model.client, zk_server.hosts)
    wait_for(lambda: model.connection == "CONNECTED", timeout=15)
    controls.pause(zk_client, zk_root, "a", "tester", "after the expiry")
    wait_for(lambda: (entry(model, "a")["paused"] or {}).get("note") == "after the expiry", timeout=10)
    zk_client.delete(f"{zk_root}/v1/entries/broken")
    wait_for(lambda: entry(model, "broken") is None, timeout=10)
    changes = model.changes(0)
    assert "broken" in changes["removed"]

    scheduler.close()  # the leader leaves: the model sees an empty line
    wait_for(lambda: model.snapshot()["shards"][0]["leader"] is None, timeout=10)
    observed = model.snapshot()["epochs"]["observed"]
    assert observed[-1]["identity"] == "leader-1" and observed[-1]["until"] is not None


def test_the_model_reads_an_acl_root_with_the_apps_credentials_and_says_when_it_has_none(
    make_scheduler: Callable[..., Any], zk_server: ZooKeeperServer, zk_root: str
) -> None:
    """With the app's zkbeat_auth the model reads an ACL'd root; without it, it says NoAuth rather than show nothing."""
    auth = [("digest", "beat:s3cret")]
    scheduler = make_scheduler({"a": every(0.2)}, zkbeat_auth=auth)
    lead(scheduler)
    wait_for(lambda: scheduler.tick() is not None and scheduler.metrics.last_publish is not None, timeout=15)
    for given, readable in ((auth, True), (None, False)):
        settings = read_settings({"zkbeat_hosts": zk_server.hosts, "zkbeat_root": zk_root, "zkbeat_auth": given}, None)
        client = make_client(settings)
        client.start(timeout=15)
        made = ClusterModel(client, settings).start()
        try:
            if readable:
                wait_for(lambda m=made: entry(m, "a") is not None, timeout=10)
                assert made.snapshot()["error"] is None
            else:
                wait_for(lambda m=made: m.snapshot()["error"], timeout=10)
                assert "NoAuth" in made.snapshot()["error"] and made.snapshot()["entries"] == []
        finally:
            made.stop()
            client.stop()
            client.close()


def test_the_model_shows_each_shard_s_election(
    make_scheduler: Callable[..., Any], zk_server: ZooKeeperServer, zk_root: str
) -> None:
    """With zkbeat_shards = 3, ``shards`` holds three elements, each with its own line and announced leader,
    and each entry its shard."""
    first = make_scheduler({"a": every(0.5), "b": every(0.5)}, identity="one", zkbeat_shards=3)
    second = make_scheduler({"a": every(0.5), "b": every(0.5)}, identity="two", zkbeat_shards=3)
    for scheduler in (first, second):
        scheduler.wait_in_tick = False
    client = KazooClient(zk_server.hosts)
    client.start(timeout=15)
    settings = read_settings({"zkbeat_hosts": zk_server.hosts, "zkbeat_root": zk_root, "zkbeat_shards": 3}, None)
    model = ClusterModel(client, settings).start()
    try:

        def every_shard_led() -> bool:
            first.tick()
            second.tick()
            shards = model.snapshot()["shards"]
            return len(shards) == 3 and all(s["leader"] is not None and len(s["candidates"]) == 2 for s in shards)

        wait_for(every_shard_led, timeout=30, message=lambda: repr(model.snapshot()["shards"]))
        shards = model.snapshot()["shards"]
        assert [s["shard"] for s in shards] == [0, 1, 2]
        assert [s["election"] for s in shards] == [f"{zk_root}/v1/shards/3/{k}/election" for k in range(3)]
        assert {s["leader"]["identity"] for s in shards} <= {"one", "two"}

        # Each entry's shard is the one its leaders run it in, and "by" names its shard's leader of that epoch.
        def every_entry_ran() -> bool:
            first.tick()
            second.tick()
            entries = model.snapshot()["entries"]
            return {e["name"] for e in entries} == {"a", "b"} and all(e["by"] for e in entries)

        wait_for(every_entry_ran, timeout=30, message=lambda: repr(model.snapshot()["entries"]))
        entries = {e["name"]: e for e in model.snapshot()["entries"]}
        assert {name: e["shard"] for name, e in entries.items()} == {n: shard_of(zk_root, n, 3) for n in ("a", "b")}
        for e in entries.values():
            # (Its candidate is still in line unless the fair share moved leadership since.)
            for candidate in shards[e["shard"]]["candidates"]:
                if candidate["sequence"] == e["epoch"]:
                    assert e["by"] == candidate["identity"], (e, shards[e["shard"]])
    finally:
        model.stop()
        client.stop()
        client.close()


def test_one_entry_under_someone_else_s_acl_is_shown_unreadable_and_the_page_goes_on(
    make_scheduler: Callable[..., Any], model: ClusterModel, zk_client: KazooClient, zk_root: str
) -> None:
    """A stranger's znode under the ledger that denies READ is one unreadable entry, not "start with -A" for
    the whole page: the model keeps following every other entry (nothing single blanks the dashboard)."""
    scheduler = make_scheduler({"a": every(0.2)}, identity="leader-1")
    lead(scheduler)
    wait_for(lambda: scheduler.tick() is not None and entry(model, "a") is not None, timeout=15)
    zk_client.create(f"{zk_root}/v1/entries/denied", b"{}", acl=[make_digest_acl("stranger", "pw", all=True)])
    wait_for(lambda: entry(model, "denied") is not None, timeout=10, message=lambda: repr(model.snapshot()["error"]))
    assert entry(model, "denied")["readable"] is False
    # The page says why (this dashboard has no credentials) and goes on following every other entry.
    wait_for(lambda: "1 ledger entry denies" in (model.snapshot()["error"] or ""), timeout=10)
    before = entry(model, "a")["total_run_count"]
    wait_for(lambda: scheduler.tick() is not None and entry(model, "a")["total_run_count"] > before, timeout=10)
    zk_client.delete(f"{zk_root}/v1/entries/denied")  # DELETE is the parent's permission, not the child's
    wait_for(lambda: entry(model, "denied") is None, timeout=10)
    wait_for(lambda: model.snapshot()["error"] is None, timeout=10)

    # A run-now request nobody may read is skipped (its leader refuses it too); one made by zkbeat shows.
    zk_client.ensure_path(f"{zk_root}/v1/triggers")
    zk_client.create(
        f"{zk_root}/v1/triggers/request-", b"{}", sequence=True, acl=[make_digest_acl("x", "pw", all=True)]
    )
    zk_client.create(f"{zk_root}/v1/triggers/request-", json.dumps({"entry": "a", "by": "op"}).encode(), sequence=True)
    wait_for(lambda: entry(model, "a")["pending"], timeout=10, message=lambda: repr(model.snapshot()["error"]))
    assert model.snapshot()["error"] is None and [p["by"] for p in entry(model, "a")["pending"]] == ["op"]

    # The run-now inbox itself under someone else's ACL: no pending request shows, the page goes on.
    for child in zk_client.get_children(f"{zk_root}/v1/triggers"):
        zk_client.delete(f"{zk_root}/v1/triggers/{child}")
    zk_client.delete(f"{zk_root}/v1/triggers")
    zk_client.create(f"{zk_root}/v1/triggers", b"", acl=[make_digest_acl("x", "pw", all=True)])
    wait_for(lambda: not entry(model, "a")["pending"], timeout=10, message=lambda: repr(model.snapshot()["error"]))
    before = entry(model, "a")["total_run_count"]
    wait_for(lambda: scheduler.tick() is not None and entry(model, "a")["total_run_count"] > before, timeout=10)
    assert model.snapshot()["error"] is None


def test_status_without_the_app_s_settings_survives_a_stranger_s_shards_znode_it_may_not_read(
    make_scheduler: Callable[..., Any], zk_client: KazooClient, zk_root: str, zk_server: ZooKeeperServer
) -> None:
    """`zkbeat status --hosts/--root` looks under <root>/v1/shards for sharded replicas when the default
    election is empty; a stranger's znode there that denies READ is not "denied access, use -A"."""
    scheduler = make_scheduler({"a": every(0.2)}, identity="sharded", zkbeat_shards=2)
    scheduler.wait_in_tick = False
    wait_for(lambda: scheduler.tick() is not None and scheduler.metrics.last_publish is not None, timeout=30)
    zk_client.ensure_path(f"{zk_root}/v1/shards/9/0")
    zk_client.create(f"{zk_root}/v1/shards/9/0/election", b"", acl=[make_digest_acl("x", "pw", all=True)])
    status = read_status(zk_client, zk_root, zk_server.hosts)
    assert {c.identity for c in status.candidates} == {"sharded"} and len(status.shards) == 2


def test_a_dashboard_without_credentials_is_told_so_when_zkbeat_s_own_entries_deny_it_read(
    make_scheduler: Callable[..., Any], model: ClusterModel, zk_client: KazooClient, zk_root: str
) -> None:
    """zkbeat_auth turned on for a root that had none (docs/operating.md, steps 3 and 4): the ledger's listing
    stays open, the entries the replicas make from then on grant their identity only. A dashboard started
    without -A can read none of those: it must say it needs credentials, not show them as a stranger's."""
    before = make_scheduler({"old": every(0.2)}, identity="before-auth")  # the root as it was: open to everyone
    lead(before)
    wait_for(lambda: before.tick() is not None and entry(model, "old") is not None, timeout=15)
    before.close()
    scheduler = make_scheduler(
        {"old": every(0.2), "secret": every(0.2)}, identity="with-auth", zkbeat_auth=[("digest", "beat:pw")]
    )
    lead(scheduler)
    wait_for(
        lambda: scheduler.tick() is not None and entry(model, "secret") is not None,
        timeout=15,
        message=lambda: repr(model.snapshot()["error"]),
    )
    wait_for(lambda: entry(model, "secret")["readable"] is False, timeout=10)
    assert model.client.auth_data == set()  # the dashboard truly has no credentials
    assert model.snapshot()["error"] is not None, (
        "zkbeat's own entry is unreadable to a dashboard without credentials and the page says nothing is wrong"
    )


def test_an_entry_that_denied_read_is_followed_again_once_its_acl_lets_it_read(
    make_scheduler: Callable[..., Any],
    model: ClusterModel,
    zk_client: KazooClient,
    zk_root: str,
    zk_server: ZooKeeperServer,
) -> None:
    """A read that ZooKeeper refuses sets no watch: once the znode's ACL is put right (``setAcl``, ``zkbeat acl``)
    (a credential rotation's step 2, for an entry a replica on the old credential alone made) the dashboard must
    come to show the entry's state, as it did when NoAuth made it read everything again until it could."""
    from kazoo.security import OPEN_ACL_UNSAFE

    owner = KazooClient(zk_server.hosts, auth_data=[("digest", "x:pw")])
    owner.start(timeout=15)
    try:
        scheduler = make_scheduler({"a": every(0.2)}, identity="leader-1")
        lead(scheduler)
        wait_for(lambda: scheduler.tick() is not None and entry(model, "a") is not None, timeout=15)
        closed = [make_digest_acl("x", "pw", all=True)]
        owner.create(f"{zk_root}/v1/entries/fixed", b"{}", acl=closed)
        wait_for(lambda: entry(model, "fixed") is not None and entry(model, "fixed")["readable"] is False, timeout=10)

        owner.set_acls(f"{zk_root}/v1/entries/fixed", OPEN_ACL_UNSAFE)
        owner.set(f"{zk_root}/v1/entries/fixed", b'{"last_run_at": "2026-01-01T12:00:00+00:00", "total_run_count": 7}')
        wait_for(
            lambda: scheduler.tick() is not None and (entry(model, "fixed") or {}).get("readable") is True,
            timeout=10,
            message=lambda: f"the entry is still shown unreadable: {entry(model, 'fixed')}",
        )
        assert entry(model, "fixed")["total_run_count"] == 7
    finally:
        owner.stop()
        owner.close()


def test_status_without_credentials_is_refused_where_the_cluster_s_own_shard_elections_deny_it_read(
    make_scheduler: Callable[..., Any], zk_client: KazooClient, zk_root: str, zk_server: ZooKeeperServer
) -> None:
    """zkbeat_auth turned on for a root that had none: the paths made before stay open, a shard election made
    since grants the replicas' identity only. `zkbeat status --hosts/--root` without credentials must be told
    it is denied (NoAuth: "use -A"), not shown a cluster with no replica in it."""
    from kazoo.exceptions import NoAuthError

    for path in ("election", "shards", "entries", "triggers"):
        zk_client.ensure_path(f"{zk_root}/v1/{path}")  # made before zkbeat_auth was turned on: open to everyone
    scheduler = make_scheduler(
        {"a": every(0.2)}, identity="sharded", zkbeat_shards=2, zkbeat_auth=[("digest", "beat:pw")]
    )
    scheduler.wait_in_tick = False
    wait_for(lambda: scheduler.tick() is not None and scheduler.metrics.last_publish is not None, timeout=30)
    try:
        status = read_status(zk_client, zk_root, zk_server.hosts)
    except NoAuthError:
        return
    raise AssertionError(f"denied READ on the cluster's own elections, status says: {status.candidates}")

"""Strangers' znodes in the election against a real ZooKeeper: a persistent or
badly named "candidate" is logged once and never led by, waited on or shown as
the leader; `zkbeat health` sees an election whose head does not lead."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator

import pytest
from kazoo.client import KazooClient
from kazoo.security import ACL, ANYONE_ID_UNSAFE, OPEN_ACL_UNSAFE, Permissions

from tests.support.helpers import Published, every, names_in_every_shard, wait_for
from tests.support.processes import ROOT
from tests.support.servers import ZooKeeperServer
from tests.test_shards import lead_every_shard
from tests.test_shards import zkbeat as shards_zkbeat
from tests.test_shards_review import Loop
from zkbeat.coordination.election import LeaderElection
from zkbeat.coordination.shards import election_path


@pytest.fixture
def root(zk_root: str) -> str:
    return zk_root


@pytest.fixture
def path(root: str) -> str:
    return f"{root}/v1/election"


@pytest.fixture
def made() -> Iterator[list[LeaderElection]]:
    elections: list[LeaderElection] = []
    yield elections
    for election in elections:
        election.close()


def _election(zk_client: KazooClient, path: str, made: list[LeaderElection], identity: str) -> LeaderElection:
    election = LeaderElection(zk_client, path, {"identity": identity})
    made.append(election)
    election.start()
    wait_for(lambda: election.candidate is not None, message="candidate created")
    return election


def _persistent_lookalike(client: KazooClient, path: str) -> str:
    """A znode named exactly as zkbeat names candidates, but persistent."""
    client.ensure_path(path)
    return client.create(f"{path}/candidate-{uuid.uuid4().hex}-", b"{}", sequence=True)


def test_a_persistent_candidate_sorting_first_is_not_waited_on(
    zk_client: KazooClient, path: str, made: list[LeaderElection]
) -> None:
    """A persistent znode named like a candidate, sorting first, does not stall the election."""
    stranger = _persistent_lookalike(zk_client, path)
    election = _election(zk_client, path, made, "real")
    assert election.epoch > int(stranger[-10:])
    assert election.wait_for_leadership(timeout=10)


def test_a_badly_named_candidate_sorting_first_is_not_waited_on(
    zk_client: KazooClient, path: str, made: list[LeaderElection]
) -> None:
    """An ephemeral child named candidate-x-0000000000 (not zkbeat's name) does not stall the election."""
    zk_client.ensure_path(path)
    zk_client.create(f"{path}/candidate-x-0000000000", b"{}", ephemeral=True)
    election = _election(zk_client, path, made, "real")
    assert election.wait_for_leadership(timeout=10)


def test_strangers_of_both_kinds_around_real_candidates(
    zk_client: KazooClient, path: str, made: list[LeaderElection], caplog: pytest.LogCaptureFixture
) -> None:
    """With strangers before and between real candidates, the lowest real one leads and the next waits on it alone."""
    caplog.set_level(logging.WARNING, logger="zkbeat")
    _persistent_lookalike(zk_client, path)
    zk_client.create(f"{path}/candidate-x-0000000000", b"\xff", ephemeral=True)
    first = _election(zk_client, path, made, "first")
    between = _persistent_lookalike(zk_client, path)
    second = _election(zk_client, path, made, "second")
    assert first.epoch < int(between[-10:]) < second.epoch
    assert first.wait_for_leadership(timeout=10)
    for _ in range(3):
        second.recheck()
        first.recheck()
        assert first.wait_for_leadership(timeout=10)
    assert not second.is_leader
    first.close()
    assert second.wait_for_leadership(timeout=10), "the follower waited on the stranger between them"
    mentions = [r.getMessage() for r in caplog.records if between.rsplit("/", 1)[1] in r.getMessage()]
    # Once by each election's reader (first's and second's), not on every pass.
    assert len([m for m in mentions if "not ephemeral" in m]) == 2, mentions
    assert [name for name, _ in second.candidates()] == [second.candidate.rsplit("/", 1)[1]]


def zkbeat(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "zkbeat.ops.cli", *args],
        env={**os.environ, "PYTHONPATH": str(ROOT), **env},
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )


def _app_env(zk_server: ZooKeeperServer, root: str) -> dict[str, str]:
    """`-A tests.support.beatapp` on this root, with a 2 s session timeout (nothing connects to the broker)."""
    return {
        "ZKBEAT_HOSTS": zk_server.hosts,
        "ZKBEAT_TEST_ROOT": root,
        "ZKBEAT_TEST_BROKER": "redis://127.0.0.1:1/0",
        "ZKBEAT_TEST_SESSION_TIMEOUT": "2",
    }


def test_health_names_the_real_leader_not_a_stranger(
    zk_server: ZooKeeperServer, zk_client: KazooClient, root: str, path: str, made: list[LeaderElection]
) -> None:
    """health is ok with the real leader's name when a stranger's persistent znode sorts first."""
    _persistent_lookalike(zk_client, path)
    zk_client.create(f"{path}/candidate-x-0000000000", b"{}", ephemeral=True)
    election = _election(zk_client, path, made, "real-leader")
    assert election.wait_for_leadership(timeout=10)
    result = zkbeat("-A", "tests.support.beatapp", "health", env=_app_env(zk_server, root))
    assert result.returncode == 0, result.stderr
    assert "real-leader leads" in result.stdout and f"epoch {election.epoch}" in result.stdout


def test_health_fails_when_the_head_of_the_election_does_not_lead(
    zk_server: ZooKeeperServer, zk_client: KazooClient, root: str, path: str
) -> None:
    """health exits 1 with one line when the lowest real candidate has not taken the lead for a session timeout."""
    zk_client.ensure_path(path)
    # A live session's candidate, named as zkbeat names them, whose owner never leads.
    zk_client.create(f"{path}/candidate-{uuid.uuid4().hex}-", b'{"identity": "stuck"}', ephemeral=True, sequence=True)
    result = zkbeat("-A", "tests.support.beatapp", "health", env=_app_env(zk_server, root))
    assert result.returncode == 1, result.stdout
    assert "stuck" in result.stderr and "has not" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    # operating.md: status shows such a head as "leader: none yet: X heads the line ...", and in JSON `leader` is
    # null while `head` names it.
    status = zkbeat("-A", "tests.support.beatapp", "status", env=_app_env(zk_server, root))
    assert status.returncode == 0, status.stderr
    assert "\nleader: none yet: stuck (host ?, pid ?) heads the line but has not run a pass" in status.stdout
    found = json.loads(zkbeat("-A", "tests.support.beatapp", "status", "--json", env=_app_env(zk_server, root)).stdout)
    assert found["leader"] is None and found["head"]["identity"] == "stuck", found


def test_a_failed_announcement_is_made_again(zk_client: KazooClient, path: str, made: list[LeaderElection]) -> None:
    """A leader whose announcement ZooKeeper refused announces on its next pass, so health can see it lead."""
    refuse_writes = [
        ACL(Permissions.READ | Permissions.CREATE | Permissions.DELETE | Permissions.ADMIN, ANYONE_ID_UNSAFE)
    ]
    zk_client.create(path, b"", acl=refuse_writes, makepath=True)
    election = _election(zk_client, path, made, "leader")
    assert election.wait_for_leadership(timeout=10)
    # Replies and their callbacks come back in order: once this sync's has run, the refused write's has too.
    done = threading.Event()
    zk_client.sync_async(path).rawlink(lambda _: done.set())
    assert done.wait(10)
    assert zk_client.get(path)[0] == b"", "the test needs the first announcement refused"
    zk_client.set_acls(path, OPEN_ACL_UNSAFE)
    election.recheck()
    name = election.candidate.rsplit("/", 1)[1]
    wait_for(lambda: json.loads(zk_client.get(path)[0] or b"{}").get("leader") == name, message="announced")


def test_a_stranger_s_candidate_nested_past_the_recursion_limit_stops_no_loop_and_no_takeover(
    make_scheduler, zk_client: KazooClient, zk_root: str, published: Published
) -> None:
    """A live session's znode named as zkbeat names candidates, in each shard's election, whose data is valid JSON
    nested deeper than Python's recursion limit (json raises RecursionError, not ValueError): it is a candidate
    whose data cannot be read, as any other. Before, the fair share's read of the lines raised it out of
    tick() (a beat loop ended), `zkbeat status` failed, and a follower's election check failed on every try,
    so the shards of a leader that stopped were led by nobody."""
    entries = {name: every(0.5) for name in names_in_every_shard(zk_root, 2)}
    settings = {"zkbeat_shards": 2, "beat_max_loop_interval": 0.2}
    first = make_scheduler(entries, identity="first", **settings)
    lead_every_shard(first)
    second = make_scheduler(entries, identity="second", **settings)
    for shard in range(2):
        zk_client.create(
            f"{election_path(zk_root, shard, 2)}/candidate-{uuid.uuid4().hex}-9999999999",
            b"[" * 100_000 + b"]" * 100_000,
            ephemeral=True,
        )
    with Loop(first) as first_loop, Loop(second):
        since = len(published.headers)
        wait_for(lambda: all(published.entries()[since:].count(name) >= 3 for name in entries), timeout=60)
        shown = shards_zkbeat(first, "status")
        assert shown.returncode == 0, shown.stderr
        first_loop.__exit__(None, None, None)  # first stops: second must lead both shards
        wait_for(
            lambda: all(s.election.leadership is not None for s in second._shards),
            timeout=60,
            message="second never led both shards",
        )
        since = len(published.headers)
        wait_for(lambda: all(published.entries()[since:].count(name) >= 3 for name in entries), timeout=60)


def test_sharded_health_fails_naming_each_shard_that_has_no_leader(
    zk_server: ZooKeeperServer, zk_client: KazooClient, root: str, made: list[LeaderElection]
) -> None:
    """docs/sharding.md: `zkbeat health` is ok only when every shard has a leader. With 3 shards, shard 0 led,
    shard 1 headed by a live session's candidate that never leads and shard 2 with nobody in line, health
    exits 1 with one line naming shards 1 and 2 (and why), not shard 0; once both are led it is ok."""
    env = {**_app_env(zk_server, root), "ZKBEAT_TEST_CONF": json.dumps({"zkbeat_shards": 3})}
    led = _election(zk_client, election_path(root, 0, 3), made, "leader-0")
    assert led.wait_for_leadership(timeout=10)
    zk_client.ensure_path(election_path(root, 1, 3))
    stuck = zk_client.create(
        f"{election_path(root, 1, 3)}/candidate-{uuid.uuid4().hex}-",
        b'{"identity": "stuck"}',
        ephemeral=True,
        sequence=True,
    )
    zk_client.ensure_path(election_path(root, 2, 3))

    result = zkbeat("-A", "tests.support.beatapp", "health", env=env)
    assert result.returncode == 1, result.stdout
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert "shard 1/3: stuck" in result.stderr and "has not taken the lead" in result.stderr, result.stderr
    assert "shard 2/3: nobody in its election" in result.stderr, result.stderr
    assert "shard 0/3" not in result.stderr, result.stderr
    assert result.stdout == ""

    zk_client.delete(stuck)
    for shard in (1, 2):
        assert _election(zk_client, election_path(root, shard, 3), made, f"leader-{shard}").wait_for_leadership(10)
    ok = zkbeat("-A", "tests.support.beatapp", "health", env=env)
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.startswith("ok: every shard has a leader (0: leader-0"), ok.stdout

"""What docs/sharding.md says of sharded replicas, proven with real ``celery beat`` processes and real signals.

Each test names the sentence it proves; assertions are outcomes (who leads
what, how many threads a replica runs), never timings.
"""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import pytest
from kazoo.client import KazooClient

from tests.support.helpers import wait_for
from tests.test_shards_processes import (
    SCHEDULE,
    SETTLE_TIMEOUT,
    MakeCluster,
    heads,
    replica_named,
    settled,
    shards_env,
    wait_settled,
    wait_watched,
)
from zkbeat.coordination.candidates import CandidateReader
from zkbeat.coordination.shards import election_path

pytestmark = pytest.mark.processes


def lines(client: KazooClient, root: str, shards: int) -> dict[int, list[str]]:
    """Each shard's line, head first, by identity."""
    return {
        shard: [
            c.data.get("identity")
            for c in CandidateReader(client, election_path(root, shard, shards)).read().candidates
        ]
        for shard in range(shards)
    }


def test_a_crashed_leaders_shard_goes_to_the_replica_with_the_fewest_shards(
    make_cluster: MakeCluster, zk_client: KazooClient
) -> None:
    """ "A follower that is next in line for a shard while it already leads its share steps back in that line,
    so that a crash of the shard's leader moves it to the replica with the fewest shards": 4 replicas, 3
    shards, one leads none; once the others stepped back it is next in every line, and a kill -9 of a leader
    moves that leader's shard to it, directly (no handover after), leaving no replica above its share."""
    cluster = make_cluster(4, schedule=SCHEDULE, extra_env=shards_env(3)).start()
    led = wait_settled(zk_client, cluster, 3)
    idle = next(r.identity for r in cluster.replicas if r.identity not in led.values())
    wait_for(
        lambda: all(line[1:2] == [idle] for line in lines(zk_client, cluster.root, 3).values()),
        timeout=SETTLE_TIMEOUT,
        interval=0.2,
        message=lambda: f"{idle}, leading none, never came next in every line: {lines(zk_client, cluster.root, 3)}",
    )
    victim_shard, victim = 1, led[1]
    # Its follower watches its liveness socket before it is killed (else only the session sees it).
    wait_watched(zk_client, cluster, victim_shard, 3, replica_named(cluster, victim))
    replica_named(cluster, victim).signal(signal.SIGKILL)
    first = wait_for(
        lambda: (head := heads(zk_client, cluster.root, 3)[victim_shard]) not in (None, victim) and head,
        timeout=SETTLE_TIMEOUT,
        interval=0.05,
        message=cluster.logs,
    )
    assert first == idle, f"shard {victim_shard} of the killed {victim} went to {first}, not to {idle} (leading none)"
    after = settled(zk_client, cluster, 3)
    assert after is not None and max(list(after.values()).count(r) for r in set(after.values())) == 1, after


def threads_of(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Threads:"):
            return int(line.split()[1])
    raise AssertionError(f"no thread count for {pid}")


def test_each_shard_costs_a_replica_about_three_threads(make_cluster: MakeCluster, zk_client: KazooClient) -> None:
    """ "Each shard costs every replica ... about three threads: the shard's election worker, the liveness
    watch on its predecessor and its broker-handover thread (that one not with
    `zkbeat_broker_handover_timeout = 0`)": one replica leading every shard, with 1, 8 and 64 shards, then
    1 and 8 without the broker handover (/proc/<pid>/status): each shard beyond the first is 3 more threads,
    2 without the handover, give or take 2 in all."""
    counts: dict[tuple[int, bool], int] = {}
    for shards, handover in ((1, True), (8, True), (64, True), (1, False), (8, False)):
        env = shards_env(shards)
        if not handover:
            conf = json.loads(env["ZKBEAT_TEST_CONF"])
            env = {"ZKBEAT_TEST_CONF": json.dumps({**conf, "zkbeat_broker_handover_timeout": 0})}
        cluster = make_cluster(1, schedule=SCHEDULE, extra_env=env).start()
        replica = cluster.replicas[0]
        wait_settled(zk_client, cluster, shards)
        wait_for(
            lambda shards=shards, replica=replica: replica.log().count("zkbeat: became leader") >= shards,
            timeout=SETTLE_TIMEOUT,
            message=cluster.logs,
        )
        # The fewest threads seen over a few seconds: those a start leaves behind (a connection's, a first
        # read's) end at their own pace on a loaded machine, while what each shard costs stays.
        samples = []
        for _ in range(20):  # samples over 5 s (the least is kept: no bound on how long a start's threads live)
            samples.append(threads_of(replica.pid))
            time.sleep(0.25)
        counts[shards, handover] = min(samples)
        replica.signal(signal.SIGTERM)
        replica.wait(30)
    print("threads of one replica (shards, broker handover):", counts)
    for shards in (8, 64):
        assert abs((counts[shards, True] - counts[1, True]) - 3 * (shards - 1)) <= 2, counts
    assert abs((counts[8, False] - counts[1, False]) - 2 * 7) <= 2, counts

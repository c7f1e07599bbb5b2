"""The leader says since when it leads without touching any watched znode."""

from __future__ import annotations

import json

from tests.support.helpers import wait_for
from zkbeat.election import LeaderElection


def test_leadership_is_announced_on_the_election_node_not_the_candidate(zk_client, zk_root):
    """A follower watches its predecessor's candidate; writing there would wake it for nothing."""
    path = f"{zk_root}/election"
    leader = LeaderElection(zk_client, path, {"identity": "a"})
    follower = LeaderElection(zk_client, path, {"identity": "b"})
    leader.start()
    assert leader.wait_for_leadership(10)
    follower.start()
    try:
        name = leader.candidate.rsplit("/", 1)[1]

        def announced():
            data = json.loads(zk_client.get(path)[0] or b"{}")
            return data if data.get("leader") == name else None

        assert wait_for(announced, 10)["leader_since"]
        assert zk_client.exists(leader.candidate).version == 0
    finally:
        follower.close()
        leader.close()

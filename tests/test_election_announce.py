"""The leader says since when it leads without touching any watched znode."""

from __future__ import annotations

import json

from tests.support.helpers import wait_for
from zkbeat.coordination.election import LeaderElection


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


def test_a_takeover_names_the_head_that_left_unannounced_not_the_leader_before_it(zk_client, zk_root):
    """A head of the line that never announced itself (a replica whose schedule did not load) and then left is
    the predecessor of the one behind it: the takeover does not name the last announced leader, with the note of
    its own, older departure."""
    from zkbeat.coordination.election import request_step_down

    path = f"{zk_root}/election"
    a = LeaderElection(zk_client, path, {"identity": "replica-0"}, announce=False)
    b = LeaderElection(zk_client, path, {"identity": "replica-1"}, announce=False)
    c = LeaderElection(zk_client, path, {"identity": "replica-2"}, announce=False)
    try:
        a.start()
        assert a.wait_for_leadership(10)
        a.announce(a.leadership)
        b.start()
        wait_for(lambda: b.candidate is not None, 10)  # start() joins in the background: b must be in line first
        c.start()
        wait_for(lambda: c.predecessor is not None and c.predecessor.path == b.candidate, 10)
        request_step_down(zk_client, a.candidate, by="ops")
        assert b.wait_for_leadership(10)  # b leads, and never announces itself
        unannounced = b.candidate
        b.close()
        assert c.wait_for_leadership(10)
        handover = c.handover(c.leadership)
        assert handover is not None
        assert handover.previous == unannounced.rsplit("/", 1)[1], handover
        assert handover.identity == "replica-1" and handover.departure is None, handover
    finally:
        for election in (c, b, a):
            election.close()

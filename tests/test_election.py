"""LeaderElection against a real ZooKeeper: who leads, who watches what, and
what happens on close, suspension, session loss and step-down."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from kazoo.client import KazooClient
from kazoo.protocol.states import KazooState
from kazoo.retry import KazooRetry

from tests.support.helpers import wait_for
from tests.support.proxy import TcpProxy
from tests.support.servers import ZooKeeperServer, drop_connection, expire_session
from zkbeat.coordination.election import LeaderElection, candidate_sequence


class Pool:
    """Kazoo clients and elections made by one test, all closed afterwards."""

    def __init__(self, hosts: str, path: str) -> None:
        self.hosts = hosts
        self.path = path
        self.clients: list[KazooClient] = []
        self.elections: list[LeaderElection] = []

    def client(self, **kwargs) -> KazooClient:
        kwargs.setdefault("timeout", 4)
        kwargs.setdefault("connection_retry", KazooRetry(max_tries=-1, delay=0.05, max_delay=0.5))
        client = KazooClient(self.hosts, **kwargs)
        client.start(timeout=15)
        self.clients.append(client)
        return client

    def election(self, client: KazooClient | None = None, start: bool = True) -> LeaderElection:
        election = LeaderElection(client or self.client(), self.path, {"identity": f"e{len(self.elections)}"})
        self.elections.append(election)
        if start:
            election.start()
            wait_for(lambda: election.candidate is not None, message="candidate created")
        return election

    def leaders(self) -> list[LeaderElection]:
        return [e for e in self.elections if e.is_leader]

    def close(self) -> None:
        for election in self.elections:
            election.close()
        for client in self.clients:
            client.stop()
            client.close()


@pytest.fixture
def pool(zk_server: ZooKeeperServer, zk_root: str) -> Iterator[Pool]:
    pool = Pool(zk_server.hosts, f"{zk_root}/election")
    yield pool
    pool.close()


def _only_leader(pool: Pool) -> LeaderElection:
    leaders = wait_for(lambda: pool.leaders(), message="a leader is elected")
    assert len(leaders) == 1, f"{len(leaders)} leaders at once"
    return leaders[0]


def test_lowest_candidate_leads_alone(pool: Pool) -> None:
    """Of several candidates exactly one leads, and it is the lowest sequence."""
    elections = [pool.election() for _ in range(4)]
    leader = _only_leader(pool)
    assert leader.epoch == min(e.epoch for e in elections)
    for follower in elections:
        if follower is not leader:
            assert not follower.wait_for_leadership(timeout=0.2)
    assert len(pool.leaders()) == 1


def _watches_by_session(server: ZooKeeperServer) -> dict[int, set[str]]:
    """The server's own view (4lw ``wchc``): session id -> watched paths."""
    watches: dict[int, set[str]] = {}
    current = None
    for line in server.four_letter("wchc").splitlines():
        if line.startswith("0x"):
            current = int(line, 16)
            watches[current] = set()
        elif line.strip() and current is not None:
            watches[current].add(line.strip())
    return watches


def test_each_follower_watches_only_its_predecessor(pool: Pool, zk_server: ZooKeeperServer) -> None:
    """No herd: the server holds exactly one watch per candidate — the predecessor's node, or the leader's own."""
    elections = [pool.election() for _ in range(5)]
    _only_leader(pool)
    ordered = sorted(elections, key=lambda e: e.epoch)

    def expected() -> bool:
        watches = _watches_by_session(zk_server)
        for index, election in enumerate(ordered):
            mine = {p for p in watches.get(election.client.client_id[0], set()) if p.startswith(pool.path)}
            want = {ordered[index - 1].candidate} if index else {election.candidate}
            if mine != want:
                return False
        return True

    wait_for(expected, message=lambda: f"watches: {_watches_by_session(zk_server)}")


def test_close_hands_over_through_the_watch(pool: Pool, zk_client: KazooClient) -> None:
    """close() deletes the leader's candidate; the next in line leads; closing twice is harmless."""
    first, second, third = (pool.election() for _ in range(3))
    leader = _only_leader(pool)
    assert leader is first
    candidate = first.candidate
    first.close()
    first.close()
    assert zk_client.exists(candidate) is None
    assert second.wait_for_leadership(timeout=10)
    assert not first.is_leader and not third.is_leader


def test_listeners_hear_edges_only(pool: Pool) -> None:
    """A listener hears 'became leader' once and 'stopped' once, not every re-check."""
    edges: list[bool] = []
    election = pool.election(start=False)
    election.add_listener(edges.append)
    election.start()
    wait_for(lambda: edges == [True], message=lambda: f"edges {edges}")
    election.recheck()
    wait_for(lambda: election.is_leader)
    election.close()
    assert edges == [True, False]


def test_suspended_stops_leading_at_once_then_resumes(zk_server: ZooKeeperServer, zk_root: str) -> None:
    """While the connection is down the leader is not leader; with the same session back it leads again."""
    # The server goes away behind a proxy (every connection reset, new ones refused), not by
    # restarting its JVM: a client that reconnects while a restarted ZooKeeper loads its data
    # is left unanswered for its whole connect timeout (ZooKeeper's close of that connection
    # fails), and the session it then comes back with has expired. That tests ZooKeeper's
    # start-up, not the election; tests/test_servers.py covers a restart.
    with TcpProxy(zk_server.port) as proxy:
        pool = Pool(proxy.hosts, f"{zk_root}/election")
        try:
            leader = pool.election()
            assert leader.wait_for_leadership(timeout=10)
            epoch, session = leader.epoch, leader.client.client_id[0]
            seen_while_suspended: list[bool] = []

            def probe(state: KazooState) -> None:
                if state == KazooState.SUSPENDED:
                    seen_while_suspended.append(leader.is_leader)

            leader.client.add_listener(probe)
            proxy.reset()
            wait_for(lambda: seen_while_suspended, message="SUSPENDED reported")
            assert seen_while_suspended == [False]
            assert not leader.is_leader
            proxy.heal()
            assert leader.wait_for_leadership(timeout=15)
            assert leader.client.client_id[0] == session, "the session did not survive"
            assert leader.epoch == epoch
        finally:
            pool.close()


def test_connection_blip_keeps_leadership(pool: Pool) -> None:
    """A dropped TCP connection (same session) suspends and then restores the same leadership."""
    leader = pool.election()
    follower = pool.election()
    assert leader.wait_for_leadership(timeout=10)
    epoch = leader.epoch
    drop_connection(leader.client)
    assert leader.wait_for_leadership(timeout=10)
    assert leader.epoch == epoch
    assert not follower.is_leader


def test_lost_session_demotes_and_rejoins_at_the_back(pool: Pool) -> None:
    """An expired session makes the leader a follower that joins again behind the new leader."""
    first = pool.election()
    second = pool.election()
    assert first.wait_for_leadership(timeout=10)
    old_epoch = first.epoch
    expire_session(first.client, pool.hosts)
    assert second.wait_for_leadership(timeout=10)
    wait_for(lambda: first.epoch is not None and first.epoch > second.epoch, message="rejoined at the back")
    assert old_epoch < second.epoch
    assert not first.is_leader
    assert len(pool.leaders()) == 1


def test_step_down_from_outside(pool: Pool, zk_client: KazooClient) -> None:
    """Deleting the leader's candidate from another client demotes it; it rejoins at the back."""
    first = pool.election()
    second = pool.election()
    assert first.wait_for_leadership(timeout=10)
    zk_client.delete(first.candidate)
    assert second.wait_for_leadership(timeout=10)
    wait_for(lambda: first.epoch is not None and first.epoch > second.epoch, message="rejoined at the back")
    assert not first.is_leader


def test_step_down_method(pool: Pool) -> None:
    """step_down() passes leadership on and keeps the replica in the election."""
    first = pool.election()
    second = pool.election()
    assert first.wait_for_leadership(timeout=10)
    first.step_down()
    assert second.wait_for_leadership(timeout=10)
    wait_for(lambda: first.epoch is not None and first.epoch > second.epoch)
    second.close()
    assert first.wait_for_leadership(timeout=10)


def test_orphan_candidate_of_this_session_is_adopted(pool: Pool, zk_client: KazooClient) -> None:
    """A candidate created on the server whose reply was lost is found and used, not duplicated."""
    client = pool.client()
    election = pool.election(client, start=False)
    zk_client.ensure_path(pool.path)
    orphan = client.create(f"{pool.path}/candidate-{election._guid}-", b"{}", ephemeral=True, sequence=True)
    election.start()
    assert election.wait_for_leadership(timeout=10)
    assert election.candidate == orphan
    assert zk_client.get_children(pool.path) == [orphan.rsplit("/", 1)[1]]


def test_unreachable_zookeeper_is_a_follower_until_it_answers(zk_server_private: ZooKeeperServer, zk_root: str) -> None:
    """With ZooKeeper down the election does not fail: it waits, and leads once ZooKeeper is back."""
    zk_server_private.stop()
    client = KazooClient(
        zk_server_private.hosts, timeout=4, connection_retry=KazooRetry(max_tries=-1, delay=0.05, max_delay=0.5)
    )
    client.start_async()
    election = LeaderElection(client, f"{zk_root}/election")
    try:
        election.start()
        assert not election.wait_for_leadership(timeout=0.5)
        zk_server_private.start()
        assert election.wait_for_leadership(timeout=20)
    finally:
        election.close()
        client.stop()
        client.close()


def test_strangers_in_the_election_path_are_ignored(pool: Pool, zk_client: KazooClient) -> None:
    """A znode that is not a candidate does not break the order or the leader."""
    zk_client.ensure_path(f"{pool.path}/not-a-candidate")
    zk_client.create(f"{pool.path}/candidate-garbage", b"\xff")
    election = pool.election()
    assert election.wait_for_leadership(timeout=10)
    with pytest.raises(ValueError):
        candidate_sequence("not-a-candidate")

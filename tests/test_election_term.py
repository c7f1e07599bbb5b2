"""LeaderElection's term of leadership against a real ZooKeeper: a step-down
survives a lost reply, a decision begun before step_down()/recheck() never
counts, the fence is one value, and the predecessor is watched with a get."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest
from kazoo.client import KazooClient
from kazoo.retry import KazooRetry

from tests.support.helpers import wait_for
from tests.support.proxy import TcpProxy
from tests.support.servers import ZooKeeperServer
from zkbeat.coordination.election import LeaderElection, candidate_sequence


class GatedClient(KazooClient):
    """A real client whose election worker can be held at one chosen call.

    ``hold("list")`` holds the worker as it lists the candidates,
    ``hold("delete")`` as it deletes a znode, and ``hold("watch", path)`` just
    before it sets a watch on ``path``.
    Only the election's worker thread is held, never kazoo's own threads.
    """

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.point: tuple[str, str | None] | None = None
        self.arrived = threading.Semaphore(0)
        self.release = threading.Semaphore(0)

    def hold(self, point: str, path: str | None = None) -> None:
        self.point = (point, path)

    def let_go(self) -> None:
        self.point = None
        self.release.release()

    def _gate(self, point: str, path: str) -> None:
        wanted = self.point
        if wanted is None or not threading.current_thread().name.endswith("-election"):
            return
        if wanted[0] == point and wanted[1] in (None, path):
            self.arrived.release()
            self.release.acquire()

    def get_children_async(self, path, watch=None, include_data=False):
        self._gate("list", path)
        return super().get_children_async(path, watch=watch, include_data=include_data)

    def delete_async(self, path, version=-1):
        self._gate("delete", path)
        return super().delete_async(path, version=version)

    def exists_async(self, path, watch=None):
        if watch is not None:
            self._gate("watch", path)
        return super().exists_async(path, watch=watch)

    def get_async(self, path, watch=None):
        if watch is not None:
            self._gate("watch", path)
        return super().get_async(path, watch=watch)


class Elections:
    """Clients and elections made by one test, all closed afterwards."""

    def __init__(self, hosts: str, path: str) -> None:
        self.hosts = hosts
        self.path = path
        self.clients: list[KazooClient] = []
        self.elections: list[LeaderElection] = []

    def client(self, hosts: str | None = None, **kwargs) -> GatedClient:
        kwargs.setdefault("timeout", 4)
        kwargs.setdefault("connection_retry", KazooRetry(max_tries=-1, delay=0.05, max_delay=0.5))
        client = GatedClient(hosts or self.hosts, **kwargs)
        client.start(timeout=15)
        self.clients.append(client)
        return client

    def election(self, client: KazooClient | None = None) -> LeaderElection:
        election = LeaderElection(client or self.client(), self.path, {"identity": f"e{len(self.elections)}"})
        self.elections.append(election)
        election.start()
        wait_for(lambda: election.candidate is not None, message="candidate created")
        return election

    def close(self) -> None:
        for election in self.elections:
            election.close()
        for client in self.clients:
            client.point = None
            client.release.release()
            client.stop()
            client.close()


@pytest.fixture
def elections(zk_server: ZooKeeperServer, zk_root: str) -> Iterator[Elections]:
    made = Elections(zk_server.hosts, f"{zk_root}/election")
    yield made
    made.close()


def _watches_of(server: ZooKeeperServer, session_id: int, prefix: str) -> set[str]:
    """The paths under ``prefix`` the server holds a watch on for ``session_id`` (4lw ``wchc``)."""
    found: set[str] = set()
    current = None
    for line in server.four_letter("wchc").splitlines():
        if line.startswith("0x"):
            current = int(line, 16)
        elif line.strip().startswith(prefix) and current == session_id:
            found.add(line.strip())
    return found


def test_step_down_survives_a_delete_whose_reply_is_lost(
    elections: Elections, zk_server: ZooKeeperServer, zk_client: KazooClient
) -> None:
    """A step-down whose delete dies with the connection is done on reconnect, not forgotten."""
    with TcpProxy(zk_server.port) as proxy:
        client = elections.client(proxy.hosts, timeout=10)
        election = elections.election(client)
        assert election.wait_for_leadership(timeout=10)
        old, session = election.candidate, client.client_id[0]
        proxy.blackhole()
        election.step_down()
        # The delete is on the wire, into the black hole: its reply can never come.
        wait_for(lambda: any(type(r).__name__ == "Delete" for r, _, _ in list(client._pending)))
        proxy.heal()  # resets the connection that lost bytes: the delete fails with ConnectionLoss
        wait_for(lambda: zk_client.exists(old) is None, message="the step-down's delete was retried")
        assert client.client_id[0] == session, "the test needs the same session after the blip"
        assert election.wait_for_leadership(timeout=10)
        assert election.candidate != old


@pytest.mark.parametrize("call", ["step_down", "recheck"])
def test_a_decision_begun_before_the_call_never_counts(elections: Elections, call: str) -> None:
    """A re-check already in flight when step_down()/recheck() is called cannot make the replica leader again."""
    client = elections.client()
    election = elections.election(client)
    assert election.wait_for_leadership(timeout=10)
    client.hold("list")
    election.recheck()
    assert client.arrived.acquire(timeout=10), "the worker never listed the candidates"
    getattr(election, call)()
    # Hold the pass the call asks for at its first step: the step-down's
    # delete, or the re-check's listing.
    client.hold("delete" if call == "step_down" else "list")
    client.release.release()  # the pass begun before the call finishes
    assert client.arrived.acquire(timeout=10), "the worker never came back for the call"
    # The worker is held in the pass the call asked for: nothing it decided earlier may count.
    assert not election.is_leader
    assert not election.wait_for_leadership(timeout=0)
    client.let_go()
    assert election.wait_for_leadership(timeout=10)


def test_the_fence_is_one_immutable_value(elections: Elections) -> None:
    """election.fence is one (epoch, candidate) value, swapped whole when the candidate changes."""
    election = elections.election()
    assert election.wait_for_leadership(timeout=10)
    fence = election.fence
    epoch, candidate = fence
    assert (epoch, candidate) == (election.epoch, election.candidate)
    assert epoch == candidate_sequence(candidate.rsplit("/", 1)[1])
    assert election.leadership == fence
    with pytest.raises(AttributeError):
        fence.epoch = 0  # type: ignore[misc]
    election.step_down()
    wait_for(lambda: election.fence is not None and election.fence != fence, message="a new candidate")
    assert fence == (epoch, candidate), "the old value did not change under its holder"
    assert election.wait_for_leadership(timeout=10)
    assert election.leadership == election.fence and election.fence.epoch > epoch


def test_a_predecessor_gone_before_the_watch_leaves_no_watch(elections: Elections, zk_server: ZooKeeperServer) -> None:
    """A follower whose predecessor vanishes just before it sets its watch holds no watch on the vanished node."""
    first, second = elections.election(), elections.election()
    client = elections.client()
    third = elections.election(client)
    assert first.wait_for_leadership(timeout=10)
    gone = second.candidate
    session = client.client_id[0]
    wait_for(lambda: _watches_of(zk_server, session, elections.path) == {gone})
    client.hold("watch", gone)
    third.recheck()
    assert client.arrived.acquire(timeout=10), "the worker never came to watch its predecessor"
    second.close()
    client.let_go()
    wait_for(
        lambda: _watches_of(zk_server, session, elections.path) == {first.candidate},
        message=lambda: f"watches: {_watches_of(zk_server, session, elections.path)}",
    )

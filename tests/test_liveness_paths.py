"""What a liveness verdict may rest on: the path to the beacon, a peer that comes back, and the log it leaves.

In-process, with real sockets and a real ZooKeeper: a beacon, a candidate
znode announcing it (directly, or through a TCP proxy in front of it), and a
watcher following that candidate as a follower's would.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator

import pytest
from kazoo.client import KazooClient

from tests.support.helpers import wait_for
from tests.support.proxy import TcpProxy
from tests.support.servers import RedisServer, ZooKeeperServer, free_port
from zkbeat import Scheduler
from zkbeat.coordination.candidates import CandidateNode, CandidateReader
from zkbeat.coordination.liveness import Beacon, Watcher, local_address

GONE_LINE = "is gone: its liveness connection ended"


class Owner:
    """A live session holding one candidate znode that announces a beacon (or a proxy in front of it)."""

    def __init__(self, zk_server: ZooKeeperServer, path: str) -> None:
        self.path = path
        self.client = KazooClient(zk_server.hosts)
        self.client.start(timeout=15)
        self.client.ensure_path(path)

    def candidate(self, beacon: Beacon, port: int | None = None, protocol: int | None = None) -> str:
        """A new candidate announcing ``beacon``, at ``port`` instead of the beacon's own if given.

        ``protocol=1``: announced as an older release's beacon does (no ``protocol`` key).
        """
        data = beacon.announcement.as_data()
        if port is not None:
            data["liveness"]["port"] = port
        if protocol == 1:
            del data["liveness"]["protocol"]
        raw = json.dumps({"identity": "victim", **data}).encode()
        return self.client.create(f"{self.path}/candidate-{'a' * 32}-", raw, ephemeral=True, sequence=True)

    def close(self) -> None:
        self.client.stop()
        self.client.close()


@pytest.fixture
def owner(zk_server: ZooKeeperServer, zk_root: str) -> Iterator[Owner]:
    made = Owner(zk_server, f"{zk_root}/v1/election")
    yield made
    made.close()


@pytest.fixture
def watcher(zk_client: KazooClient) -> Iterator[Watcher]:
    deposals: list[str] = []
    made = Watcher(zk_client, on_gone=lambda candidate, why: deposals.append(candidate.path)).start()
    made.deposals = deposals  # type: ignore[attr-defined]
    yield made
    made.close()


def read(zk_client: KazooClient, owner: Owner, node: str) -> CandidateNode:
    line = CandidateReader(zk_client, owner.path).read()
    return next(c for c in line.candidates if c.path == node)


def liveness_lines(caplog: pytest.LogCaptureFixture, node: str) -> list[logging.LogRecord]:
    """What the watcher logged about candidate ``node`` (its identity and sequence, or its path at DEBUG)."""
    names = (f"victim (candidate {int(node[-10:])})", node)
    records = [r for r in caplog.records if r.name == "zkbeat.coordination.liveness"]
    return [r for r in records if any(name in r.getMessage() for name in names)]


def proxied(caplog: pytest.LogCaptureFixture, node: str) -> bool:
    """Whether the watcher said, at INFO, that its connection to ``node``'s beacon goes through a proxy."""
    return any("proxy" in r.getMessage() and r.levelno == logging.INFO for r in liveness_lines(caplog, node))


def test_a_restarting_proxy_in_front_of_a_live_beacon_deposes_nobody(
    owner: Owner, watcher: Watcher, zk_client: KazooClient, caplog: pytest.LogCaptureFixture
) -> None:
    """A proxy between follower and beacon restarts (its connections end, dials are refused): the candidate stays."""
    caplog.set_level(logging.DEBUG, logger="zkbeat.coordination.liveness")
    beacon = Beacon("127.0.0.1").start()
    proxy = TcpProxy(beacon.port).start()
    try:
        node = owner.candidate(beacon, port=proxy.port)
        watcher.follow(read(zk_client, owner, node))
        # The handshake went through the proxy (the watcher logs what it makes of the path, at INFO).
        wait_for(lambda: proxied(caplog, node), timeout=10, message=lambda: caplog.text)
        proxy.close()  # a sidecar, docker-proxy or port-forward restarting: connections end, dials refused
        # A wrong verdict comes within milliseconds (the re-dial is refused at once).
        wait_for(lambda: zk_client.exists(node) is None, timeout=3, raise_on_timeout=False)
        proxy = TcpProxy(beacon.port, port=proxy.port).start()
        assert zk_client.exists(node) is not None, "a live process was deposed by a proxy restart"
        assert watcher.deleted == [] and watcher.deposals == []
        assert GONE_LINE not in caplog.text
        assert proxied(caplog, node)
    finally:
        proxy.close()
        beacon.close()


def test_a_direct_refusal_still_deposes_at_once_and_is_counted(
    owner: Owner, watcher: Watcher, zk_client: KazooClient, caplog: pytest.LogCaptureFixture
) -> None:
    """On a direct path a refused re-dial after a verified connection is a death: deleted, counted, one WARNING."""
    caplog.set_level(logging.DEBUG, logger="zkbeat.coordination.liveness")
    beacon = Beacon("127.0.0.1").start()
    node = owner.candidate(beacon)
    watcher.follow(read(zk_client, owner, node))
    wait_for(lambda: f"watching the liveness of {node} " in caplog.text, timeout=10, message=caplog.text)
    beacon.close()  # what kill -9 does to the socket
    wait_for(lambda: watcher.deposals == [node], timeout=10, message=caplog.text)
    assert zk_client.exists(node) is None
    warnings = [r for r in liveness_lines(caplog, node) if r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and GONE_LINE in warnings[0].getMessage(), [r.getMessage() for r in warnings]


def test_an_older_beacon_is_taken_as_direct_even_behind_a_proxy(
    owner: Owner, watcher: Watcher, zk_client: KazooClient, caplog: pytest.LogCaptureFixture
) -> None:
    """A beacon announced without ``protocol`` (liveness protocol 1, an older release) is dialled with the bare
    token and never asked where it sees the connection from: its path counts as direct, so a proxy restart in
    front of it deposes it, as guarantees.md says (a protocol-2 beacon behind the same proxy is left alone)."""
    caplog.set_level(logging.DEBUG, logger="zkbeat.coordination.liveness")
    beacon = Beacon("127.0.0.1").start()
    proxy = TcpProxy(beacon.port).start()
    try:
        node = owner.candidate(beacon, port=proxy.port, protocol=1)
        assert read(zk_client, owner, node).data["liveness"].get("protocol") is None
        watcher.follow(read(zk_client, owner, node))
        wait_for(lambda: f"watching the liveness of {node} " in caplog.text, timeout=10, message=caplog.text)
        assert not any("relays it" in r.getMessage() for r in liveness_lines(caplog, node)), caplog.text
        proxy.close()
        wait_for(lambda: watcher.deposals == [node], timeout=10, message=caplog.text)
        assert zk_client.exists(node) is None
    finally:
        proxy.close()
        beacon.close()


def test_a_peer_deposed_once_and_back_is_left_to_its_session(
    owner: Owner, watcher: Watcher, zk_client: KazooClient, caplog: pytest.LogCaptureFixture
) -> None:
    """A process deposed through its socket that comes back with the same announcement is never deposed so again."""
    caplog.set_level(logging.DEBUG, logger="zkbeat.coordination.liveness")
    beacon = Beacon("127.0.0.1").start()
    first = owner.candidate(beacon)
    watcher.follow(read(zk_client, owner, first))
    wait_for(lambda: f"watching the liveness of {first} " in caplog.text, timeout=10, message=caplog.text)
    beacon.close()
    wait_for(lambda: watcher.deposals == [first], timeout=10, message=caplog.text)
    # It lived all along: its socket answers again (same port, same token) and it rejoins.
    back = Beacon("127.0.0.1", beacon.port, beacon.token).start()
    try:
        second = owner.candidate(back)
        watcher.follow(read(zk_client, owner, second))
        wait_for(lambda: liveness_lines(caplog, second), timeout=10, message=caplog.text)
        back.close()
        wait_for(lambda: zk_client.exists(second) is None, timeout=3, raise_on_timeout=False)
        assert zk_client.exists(second) is not None, "deposed twice through its socket"
        assert watcher.deposals == [first]
        assert any("session" in r.getMessage() for r in liveness_lines(caplog, second))
    finally:
        back.close()


def test_a_predecessor_that_leaves_gracefully_is_no_warning(
    owner: Owner, watcher: Watcher, zk_client: KazooClient, caplog: pytest.LogCaptureFixture
) -> None:
    """SIGTERM's order (candidate deleted, then the socket closed) logs no WARNING, and says the predecessor left."""
    caplog.set_level(logging.DEBUG, logger="zkbeat.coordination.liveness")
    beacon = Beacon("127.0.0.1").start()
    node = owner.candidate(beacon)
    # The election has not told the watcher yet: it still follows the candidate that left.
    watcher.follow(read(zk_client, owner, node))
    wait_for(lambda: f"watching the liveness of {node} " in caplog.text, timeout=10, message=caplog.text)
    owner.client.delete(node)
    beacon.close()
    wait_for(lambda: any("left" in r.getMessage() for r in liveness_lines(caplog, node)), timeout=10,
             message=caplog.text)  # fmt: skip
    # Give a second verdict the time a re-dial takes (it would come within milliseconds).
    wait_for(lambda: any(r.levelno >= logging.WARNING for r in liveness_lines(caplog, node)), timeout=1,
             raise_on_timeout=False)  # fmt: skip
    assert [r.getMessage() for r in liveness_lines(caplog, node) if r.levelno >= logging.INFO] == []
    assert watcher.deposals == []


def test_port_less_hosts_give_the_route_to_zookeeper() -> None:
    """Hosts without ports (kazoo defaults 2181), IPv6 literals and a chroot are parsed, not taken for a port."""
    assert local_address("127.0.0.1") == "127.0.0.1"
    assert local_address("localhost,no-such-host.invalid") == "127.0.0.1"
    assert local_address("127.0.0.1/apps/beat") == "127.0.0.1"
    assert local_address("no-such-host.invalid,127.0.0.1:2182/apps") == "127.0.0.1"
    assert local_address("[::1]:2181") == "::1"
    assert local_address("[::1]") == "::1"
    assert local_address("no-such-host.invalid") is None


def test_falling_back_to_loopback_warns_unless_zookeeper_is_there(caplog: pytest.LogCaptureFixture) -> None:
    """No route to a remote ZooKeeper: loopback, with a WARNING naming the settings; a local one: no warning."""
    from zkbeat.coordination.liveness import default_host

    with caplog.at_level(logging.INFO, logger="zkbeat.coordination.liveness"):
        assert default_host("127.0.0.1:2181,localhost") == "127.0.0.1"
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    with caplog.at_level(logging.INFO, logger="zkbeat.coordination.liveness"):
        assert default_host("zk1.invalid,zk2.invalid/apps") == "127.0.0.1"
    (warning,) = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert "zkbeat_liveness_address" in warning.getMessage() and "zkbeat_hosts" in warning.getMessage()


def test_the_announced_address_is_the_bound_one() -> None:
    """A beacon told to listen on a name announces the address it is bound to, which every replica can dial."""
    beacon = Beacon("localhost").start()
    try:
        assert beacon.announcement.host == "127.0.0.1"
    finally:
        beacon.close()


def test_each_deposal_is_counted_in_the_metrics(
    owner: Owner, zk_server: ZooKeeperServer, redis_server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    """A replica that deletes its predecessor through the socket counts it in zkbeat_liveness_deposals_total."""
    from tests.test_metrics import get, make_app, metric

    caplog.set_level(logging.DEBUG, logger="zkbeat.coordination.liveness")
    beacon = Beacon("127.0.0.1").start()
    node = owner.candidate(beacon)  # ahead of the replica in line
    port = free_port()
    scheduler = Scheduler(make_app(zk_server.hosts, redis_server.url, owner.path.rsplit("/v1/", 1)[0], port))
    try:
        wait_for(lambda: f"watching the liveness of {node} " in caplog.text, timeout=15, message=caplog.text)
        assert metric(get(port, "/metrics")[1], "zkbeat_liveness_deposals_total") == 0
        beacon.close()
        assert scheduler.election.wait_for_leadership(timeout=15)
        # Counted on the watcher's thread after the delete, which the election (its own thread) may act on first.
        wait_for(lambda: metric(get(port, "/metrics")[1], "zkbeat_liveness_deposals_total") >= 1, timeout=15,
                 message=caplog.text)  # fmt: skip
        assert metric(get(port, "/metrics")[1], "zkbeat_liveness_deposals_total") == 1
    finally:
        scheduler.close()
        beacon.close()


def relayed_lines(caplog: pytest.LogCaptureFixture, node: str) -> list[str]:
    """The INFO lines saying the connection to ``node``'s beacon is relayed (guarantees.md: logged once)."""
    return [r.getMessage() for r in liveness_lines(caplog, node) if "relays it" in r.getMessage()]


def test_a_relayed_predecessor_is_logged_once_across_passes_reconnects_and_a_return(
    owner: Owner, make_scheduler, zk_server: ZooKeeperServer, caplog: pytest.LogCaptureFixture
) -> None:
    """A replica's predecessor seen through a proxy is said once at INFO (guarantees.md, how-it-works.md): not
    again on its passes, on a dropped connection, on a new session, nor when it is followed again after another
    predecessor (a rejoin puts a newer candidate between, which then leaves)."""
    from tests.support.servers import drop_connection, expire_session

    caplog.set_level(logging.DEBUG, logger="zkbeat.coordination.liveness")
    beacons = [Beacon("127.0.0.1").start(), Beacon("127.0.0.1").start()]
    proxies = [TcpProxy(beacon.port).start() for beacon in beacons]
    try:
        first = owner.candidate(beacons[0], port=proxies[0].port)  # ahead of the replica in line
        scheduler = make_scheduler({}, identity="follower", zkbeat_root=owner.path.rsplit("/v1/", 1)[0])
        wait_for(lambda: relayed_lines(caplog, first), timeout=15, message=lambda: caplog.text)
        for _ in range(5):
            scheduler.tick()
        drop_connection(scheduler.zk_client)
        wait_for(lambda: scheduler.election.predecessor is not None, timeout=15)
        # A newer candidate joins behind the replica; a new session puts the replica behind it, and it leaves.
        between = owner.candidate(beacons[1], port=proxies[1].port)
        expire_session(scheduler.zk_client, zk_server.hosts)
        wait_for(lambda: relayed_lines(caplog, between), timeout=15, message=lambda: caplog.text)
        owner.client.delete(between)
        wait_for(lambda: scheduler.election.predecessor is not None and scheduler.election.predecessor.path == first,
                 timeout=15, message=lambda: caplog.text)  # fmt: skip
        # A second line would come within milliseconds of following it again (one dial through the proxy).
        wait_for(lambda: len(relayed_lines(caplog, first)) > 1, timeout=2, raise_on_timeout=False)
        assert len(relayed_lines(caplog, first)) == 1, relayed_lines(caplog, first)
        assert len(relayed_lines(caplog, between)) == 1, relayed_lines(caplog, between)
        assert all(r.levelno == logging.INFO for r in caplog.records if "relays it" in r.getMessage())
    finally:
        for made in (*proxies, *beacons):
            made.close()

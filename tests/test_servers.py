"""The test infrastructure itself: real servers start, and the session powers work."""

from __future__ import annotations

import time

import redis
from kazoo.client import KazooClient, KazooState

from tests.support.helpers import wait_for
from tests.support.proxy import TcpProxy
from tests.support.servers import (
    RedisServer,
    ZooKeeperEnsemble,
    ZooKeeperServer,
    drop_connection,
    expire_session,
)


def record_states(client: KazooClient) -> list[KazooState]:
    """Return a list that collects every state change ``client`` reports."""
    states: list[KazooState] = []
    client.add_listener(states.append)
    return states


def test_standalone_server_answers(zk_server: ZooKeeperServer, zk_client: KazooClient, zk_root: str) -> None:
    """The shared server answers four-letter words and serves a client under zk_root."""
    assert zk_server.four_letter("ruok") == "imok"
    assert zk_server.mode == "standalone"
    zk_client.create(f"{zk_root}/node", b"hello", makepath=True)
    assert zk_client.get(f"{zk_root}/node")[0] == b"hello"


def test_restart_keeps_session(zk_server_private: ZooKeeperServer) -> None:
    """A session (and its ephemeral node) survives a server restart: ZooKeeper restores it at start-up."""
    # The client goes through a proxy that refuses it until the restarted server serves:
    # ZooKeeper answers nothing to a client that connects while it loads its data (closing
    # that connection fails with a NullPointerException in its log), so the client would
    # wait out its whole connect timeout (the session's length) and come back too late.
    with TcpProxy(zk_server_private.port) as proxy:
        # Retry the connection every <= 0.5 s so reconnecting never waits out a long backoff.
        client = KazooClient(proxy.hosts, timeout=10, connection_retry={"max_tries": -1, "max_delay": 0.5})
        client.start(timeout=15)
        try:
            session_id = client.client_id[0]
            client.create("/ephemeral", ephemeral=True)
            states = record_states(client)

            proxy.reset()
            began = time.monotonic()
            zk_server_private.restart()
            downtime = time.monotonic() - began
            proxy.heal()
            # ~1 s normally.  ZooKeeper re-arms restored sessions at startup, so survival does
            # not hinge on this; the bound only catches a restart that is no longer a blip.
            assert downtime < 10, f"restart took {downtime:.2f}s"

            wait_for(
                lambda: client.connected and states[-1:] == [KazooState.CONNECTED],
                message=lambda: f"client did not reconnect: {states}",
            )
            assert KazooState.LOST not in states
            assert client.client_id[0] == session_id
            assert client.exists("/ephemeral") is not None
        finally:
            client.stop()
            client.close()


def test_expire_session(zk_server: ZooKeeperServer, zk_client: KazooClient, zk_root: str) -> None:
    """expire_session makes the client see LOST, lose ephemerals and get a new session."""
    old_session = zk_client.client_id[0]
    zk_client.create(f"{zk_root}/eph", ephemeral=True, makepath=True)
    states = record_states(zk_client)

    expire_session(zk_client, zk_server.hosts)

    assert KazooState.LOST in states
    wait_for(
        lambda: zk_client.connected and zk_client.client_id[0] != old_session,
        message="client did not reconnect with a new session",
    )
    assert zk_client.exists(f"{zk_root}/eph") is None


def test_drop_connection(zk_client: KazooClient) -> None:
    """drop_connection gives SUSPENDED then CONNECTED on the same session."""
    session_id = zk_client.client_id[0]
    states = record_states(zk_client)

    drop_connection(zk_client)

    assert states == [KazooState.SUSPENDED, KazooState.CONNECTED]
    assert zk_client.client_id[0] == session_id
    assert zk_client.exists("/") is not None


def test_ensemble_survives_losing_its_leader(zk_ensemble: ZooKeeperEnsemble) -> None:
    """The ensemble has one leader, and a client keeps working after it is killed."""
    modes = sorted(m.mode for m in zk_ensemble.members)
    assert modes == ["follower", "follower", "leader"]

    client = KazooClient(zk_ensemble.hosts, timeout=4)
    client.start(timeout=15)
    try:
        client.create("/before", b"1")
        old_leader = zk_ensemble.leader()
        old_leader.kill()

        new_leader = zk_ensemble.leader(timeout=15)
        assert new_leader is not old_leader
        client.retry(client.create, "/after", b"2")
        assert client.retry(client.get, "/before")[0] == b"1"
    finally:
        client.stop()
        client.close()
        zk_ensemble.start()  # heal the module-scoped ensemble
    assert all(m.running for m in zk_ensemble.members)


def test_redis_restart(redis_server: RedisServer) -> None:
    """The shared Redis answers; a private one comes back on the same port after restart."""
    assert redis.Redis.from_url(redis_server.url).ping()
    with RedisServer() as server:
        client = redis.Redis.from_url(server.url)
        client.set("k", "v")
        server.restart()
        assert server.running
        assert client.ping()
        assert client.get("k") is None  # no persistence: a restart is a clean slate
        client.close()


def test_zookeeper_heap_is_asked_of_the_jvm() -> None:
    """``heap_mb`` reaches the running JVM as its only maximum heap; the default stays the tests' 256 MB."""
    unstarted = ZooKeeperServer()
    unstarted.close()
    assert unstarted.heap_mb == 256
    with ZooKeeperServer(heap_mb=768) as server:
        with open(f"/proc/{server.pid}/cmdline", "rb") as cmdline:
            arguments = cmdline.read().split(b"\0")
        assert [a for a in arguments if a.startswith(b"-Xmx")] == [b"-Xmx768m"]
        client = KazooClient(server.hosts)
        client.start(timeout=15)
        try:
            client.create("/served", b"yes")
            assert client.get("/served")[0] == b"yes"
        finally:
            client.stop()
            client.close()

"""The liveness socket and the watch on it, in-process: real sockets, real ZooKeeper."""

from __future__ import annotations

import json
import logging
import socket
import threading
from collections.abc import Iterator

import pytest
from kazoo.client import KazooClient

from tests.support.helpers import wait_for
from tests.support.servers import ZooKeeperServer
from zkbeat.coordination.candidates import CandidateReader
from zkbeat.coordination.liveness import (
    ALIVE,
    GONE,
    MAX_CONNECTIONS,
    SILENT,
    TOKEN_LENGTH,
    Announcement,
    Beacon,
    Watcher,
    dial,
    local_address,
)
from zkbeat.leading.watchdog import Watchdog


@pytest.fixture
def beacon() -> Iterator[Beacon]:
    b = Beacon("127.0.0.1").start()
    yield b
    b.close()


def _closed_by_peer(sock: socket.socket) -> bool:
    sock.settimeout(5)
    try:
        return sock.recv(64) == b""
    except ConnectionResetError:
        return True


def test_the_right_token_is_answered_with_the_token(beacon: Beacon) -> None:
    """A dial with the announced token is answered with that token and the connection stays open."""
    outcome, sock, _ = dial(beacon.announcement)
    assert outcome == ALIVE and sock is not None
    wait_for(lambda: beacon.connections == 1)
    sock.close()


def test_a_wrong_token_or_garbage_is_closed_unanswered(beacon: Beacon) -> None:
    """A stranger sending a wrong token or garbage bytes is closed without being sent anything."""
    for payload in (b"0" * TOKEN_LENGTH, b"\x00\xff garbage \r\n" * 10, b"GET / HTTP/1.1\r\n\r\n"):
        with socket.create_connection(("127.0.0.1", beacon.port), timeout=5) as sock:
            sock.sendall(payload)
            assert _closed_by_peer(sock)
    wrong = Announcement(beacon.host, beacon.port, "f" * TOKEN_LENGTH)
    assert dial(wrong)[0] == GONE


def test_a_silent_stranger_is_closed_after_the_handshake_time(beacon: Beacon) -> None:
    """A connection that never sends the token is closed by the beacon (it cannot hold a slot)."""
    with socket.create_connection(("127.0.0.1", beacon.port), timeout=5) as sock:
        assert _closed_by_peer(sock)


def test_bytes_after_the_token_close_the_connection(beacon: Beacon) -> None:
    """A verified peer that sends anything more is closed: nothing but the token is ever spoken."""
    outcome, sock, _ = dial(beacon.announcement)
    assert outcome == ALIVE and sock is not None
    sock.setblocking(True)
    sock.sendall(b"more")
    assert _closed_by_peer(sock)
    sock.close()


def test_a_flood_of_connections_is_capped_and_the_verified_one_survives(beacon: Beacon) -> None:
    """Thousands of connections: at most MAX_CONNECTIONS are held, the follower's stays, dials after it work."""
    outcome, follower, _ = dial(beacon.announcement)
    assert outcome == ALIVE and follower is not None
    flood = []
    for _ in range(2000):
        sock = socket.socket()
        sock.setblocking(False)
        sock.connect_ex(("127.0.0.1", beacon.port))
        flood.append(sock)
    wait_for(lambda: beacon.connections >= MAX_CONNECTIONS, timeout=10)
    assert beacon.connections <= MAX_CONNECTIONS
    # At the cap a dial is silent (proves nothing), never "gone".
    assert dial(beacon.announcement, timeout=0.5)[0] in (ALIVE, SILENT)
    for sock in flood:
        sock.close()
    # Strangers that never spoke are dropped; the beacon answers again.
    wait_for(lambda: dial(beacon.announcement)[0] == ALIVE, timeout=20)
    follower.setblocking(True)
    follower.settimeout(0.2)
    with pytest.raises(TimeoutError):
        follower.recv(1)  # still open, still silent
    follower.close()


def test_a_closed_beacon_is_refused(beacon: Beacon) -> None:
    """After close() a dial is refused: what a follower takes as the process gone."""
    outcome, sock, _ = dial(beacon.announcement)
    assert outcome == ALIVE and sock is not None
    beacon.close()
    sock.setblocking(True)
    assert _closed_by_peer(sock)
    assert dial(beacon.announcement)[0] == GONE


def test_local_address_is_the_route_to_zookeeper() -> None:
    """The default address is the one this host uses towards ZooKeeper (loopback for a local server)."""
    assert local_address("127.0.0.1:2181,other:2181/chroot") == "127.0.0.1"
    assert local_address("no-such-host.invalid:2181") is None


def _candidate(zk_server: ZooKeeperServer, path: str, beacon: Beacon) -> tuple[KazooClient, str]:
    owner = KazooClient(zk_server.hosts)
    owner.start(timeout=15)
    owner.ensure_path(path)
    data = json.dumps({"identity": "victim", **beacon.announcement.as_data()}).encode()
    node = owner.create(f"{path}/candidate-{'a' * 32}-", data, ephemeral=True, sequence=True)
    return owner, node


def test_a_watcher_deletes_the_candidate_of_a_closed_beacon(
    zk_server: ZooKeeperServer, zk_client: KazooClient, zk_root: str, caplog: pytest.LogCaptureFixture
) -> None:
    """When the predecessor's beacon closes and a re-dial is refused, the watcher deletes that exact candidate."""
    caplog.set_level(logging.DEBUG, logger="zkbeat.coordination.liveness")
    path = f"{zk_root}/v1/election"
    victim = Beacon("127.0.0.1").start()
    owner, node = _candidate(zk_server, path, victim)
    watcher = Watcher(zk_client).start()
    try:
        (candidate,) = CandidateReader(zk_client, path).read().candidates
        watcher.follow(candidate)
        # Verified, not only accepted: before that a refused dial proves nothing.
        wait_for(lambda: f"watching the liveness of {node} " in caplog.text, timeout=10)
        victim.close()
        wait_for(lambda: zk_client.exists(node) is None, timeout=10)
        wait_for(lambda: watcher.deleted == [node], timeout=10, message=lambda: f"deleted: {watcher.deleted}")
        assert owner.connected, "the owner's session lives on: only its candidate went"
    finally:
        watcher.close()
        owner.stop()
        owner.close()


def test_a_watcher_never_deletes_a_silent_or_unreachable_candidate(
    zk_server: ZooKeeperServer, zk_client: KazooClient, zk_root: str
) -> None:
    """A candidate whose beacon is never reachable (refused from the start) is left to its session."""
    path = f"{zk_root}/v1/election"
    victim = Beacon("127.0.0.1")  # bound, never started: connections queue, nothing answers
    owner, node = _candidate(zk_server, path, victim)
    victim.close()  # and now refused: but never verified, so a refusal proves nothing
    watcher = Watcher(zk_client).start()
    try:
        (candidate,) = CandidateReader(zk_client, path).read().candidates
        watcher.follow(candidate)
        wait_for(lambda: watcher._unreachable_logged, timeout=10)
        assert zk_client.exists(node) is not None
        assert watcher.deleted == []
    finally:
        watcher.close()
        owner.stop()
        owner.close()


def test_the_watchdog_steps_down_once_per_stalled_pass_and_resumes_when_the_loop_turns() -> None:
    """A pass past the timeout steps down once (held), logs the stuck stack, and the next turn resumes."""
    now = [0.0]
    calls: list[str] = []
    dog = Watchdog(10.0, lambda: calls.append("down"), lambda: calls.append("resume"), clock=lambda: now[0])
    dog.turned()
    dog.entered()
    now[0] = 9.0
    assert not dog.check()
    now[0] = 11.0
    assert dog.check()
    assert not dog.check(), "once per pass"
    dog.left()
    dog.turned()
    assert calls == ["down", "resume"]
    # Time outside a pass (a follower waiting, beat sleeping) never counts.
    now[0] = 100.0
    assert not dog.check()


def test_a_long_pass_that_reports_progress_is_timed_stage_by_stage() -> None:
    """progressed() restarts the stall clock of the caller's own pass only; a stage past the timeout still fires."""
    now = [0.0]
    calls: list[str] = []
    dog = Watchdog(10.0, lambda: calls.append("down"), lambda: calls.append("resume"), clock=lambda: now[0])
    dog.progressed()  # outside a pass: nothing to restart, and no pass begins
    now[0] = 50.0
    assert not dog.check()
    dog.entered()
    now[0] = 58.0
    dog.progressed()  # a stage (a takeover's read) finished 8 s in
    now[0] = 66.0
    assert not dog.check(), "16 s into the pass, 8 s into its stage"
    other = threading.Thread(target=dog.progressed)
    other.start()
    other.join()
    now[0] = 68.5
    assert dog.check(), "another thread's progress is not this pass's"
    assert calls == ["down"]


def test_the_watchdog_logs_the_stuck_threads_stack(caplog: pytest.LogCaptureFixture) -> None:
    """The step-down log names the stall and shows where the stuck thread is."""
    now = [0.0]
    release = threading.Event()
    entered = threading.Event()
    dog = Watchdog(10.0, lambda: None, lambda: None, clock=lambda: now[0])

    def stuck_in_a_publish() -> None:
        dog.entered()
        entered.set()
        release.wait(10)

    thread = threading.Thread(target=stuck_in_a_publish)
    thread.start()
    entered.wait(5)
    now[0] = 20.0
    with caplog.at_level("ERROR", logger="zkbeat.leading.watchdog"):
        assert dog.check()
    release.set()
    thread.join()
    assert "stuck_in_a_publish" in caplog.text and "zkbeat_stall_timeout" in caplog.text


def test_the_watchdog_steps_down_before_it_writes_its_error() -> None:
    """The step-down is asked for before the ERROR with the stack is written, so a log that blocks (a full pipe
    on stderr) cannot keep a hung leader leading; the election's step-down line may therefore come first, as
    docs/operating.md's table says."""
    now = [0.0]
    asked = threading.Event()
    release = threading.Event()

    class Blocking(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            release.wait(10)

    dog = Watchdog(10.0, asked.set, lambda: None, clock=lambda: now[0])
    dog.entered()
    now[0] = 20.0
    handler = Blocking()
    watchdog_logger = logging.getLogger("zkbeat.leading.watchdog")
    watchdog_logger.addHandler(handler)
    checking = threading.Thread(target=dog.check)
    try:
        checking.start()
        assert asked.wait(5), "no step-down while the log blocked"
    finally:
        release.set()
        checking.join(5)
        watchdog_logger.removeHandler(handler)
    assert dog.stalls == 1


@pytest.fixture
def pool(zk_server: ZooKeeperServer, zk_root: str):
    from tests.test_election import Pool

    made = Pool(zk_server.hosts, f"{zk_root}/election")
    yield made
    made.close()


def test_the_election_reports_each_followers_predecessor(pool) -> None:
    """Each follower hears its predecessor (the candidate it waits on); the leader hears None."""
    first = pool.election()
    wait_for(lambda: first.is_leader)
    heard: list = []
    second = pool.election(start=False)
    second.add_predecessor_listener(heard.append)
    second.start()
    wait_for(lambda: heard and heard[-1] is not None)
    assert heard[-1].path == first.candidate
    first.close()
    wait_for(lambda: second.is_leader)
    wait_for(lambda: heard[-1] is None)
    assert second.predecessor is None


def test_a_held_step_down_stays_out_of_line_until_resumed(pool) -> None:
    """step_down(hold=True) deletes the candidate and joins again only after resume(); the other replica leads."""
    first, second = pool.election(), pool.election()
    wait_for(lambda: first.is_leader)
    first.step_down(hold=True)
    wait_for(lambda: second.is_leader)
    wait_for(lambda: first.candidate is None)
    assert first.held and len(second.candidates()) == 1
    first.recheck()  # any other wake-up keeps it out too
    wait_for(lambda: not first._wake.is_set())
    assert first.candidate is None
    first.resume()
    wait_for(lambda: first.candidate is not None)
    assert not first.is_leader and len(second.candidates()) == 2


def test_beats_redis_connection_gets_publish_timeouts_only_where_the_user_set_none() -> None:
    """Beat's own Redis connection gets socket timeouts; the app's settings and the user's own values are kept."""
    from celery import Celery

    from zkbeat.leading.broker import PUBLISH_TIMEOUTS, beat_connection

    app = Celery("t", broker="redis://127.0.0.1:1/0")
    connection = beat_connection(app)
    assert {k: connection.transport_options.get(k) for k in PUBLISH_TIMEOUTS} == PUBLISH_TIMEOUTS
    assert not app.conf.broker_transport_options, "the app's configuration is left as the user wrote it"
    app.conf.broker_transport_options = {"socket_timeout": 2.5}
    connection = beat_connection(app)
    assert connection.transport_options["socket_timeout"] == 2.5
    assert connection.transport_options["socket_connect_timeout"] == PUBLISH_TIMEOUTS["socket_connect_timeout"]
    amqp = Celery("t", broker="amqp://guest@127.0.0.1:1//")
    assert "socket_timeout" not in beat_connection(amqp).transport_options


def test_the_watchdog_thread_fires_on_its_own() -> None:
    """Started, the watchdog's thread steps down a pass left running past its timeout, without being asked."""
    calls: list[str] = []
    dog = Watchdog(0.2, lambda: calls.append("down"), lambda: calls.append("resume")).start()
    try:
        dog.entered()
        wait_for(lambda: calls == ["down"], timeout=10)
        dog.left()
        dog.turned()
        assert calls == ["down", "resume"]
    finally:
        dog.close()

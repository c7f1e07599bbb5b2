"""Crashes seen through the kernel, hangs caught by the watchdog: real beat processes, real signals.

Sessions here are long (30 s) so that a takeover well inside the session can
only be the liveness socket's doing; the log line of the follower that
deleted the dead candidate says so too. Every test ends with the accounting
of tests/accounting.py: nothing twice, nothing lost but ticks in flight in a
process killed with SIGKILL.
"""

from __future__ import annotations

import json
import signal
import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from kazoo.client import KazooClient

from tests.support.accounting import Report, accounting
from tests.support.faults import candidates, wait_until_watched
from tests.support.helpers import wait_for
from tests.support.processes import Cluster, Publish, Replica
from tests.support.proxy import TcpProxy
from tests.support.servers import RedisServer, ZooKeeperServer

pytestmark = pytest.mark.processes

SESSION = 30.0
ENTRIES = {"alpha": 1, "beta": 1}
#: Well inside SESSION: a takeover this soon is the liveness socket's, not the session's.
TAKEOVER = 15.0
GONE_LINE = "is gone: its liveness connection ended"

MakeCluster = Callable[..., Cluster]


@pytest.fixture
def make_cluster(redis_server: RedisServer, zk_root: str, tmp_path: Path) -> Iterator[MakeCluster]:
    made: list[Cluster] = []

    def make(n: int, zk: ZooKeeperServer, schedule: dict[str, float] = ENTRIES, **kwargs) -> Cluster:
        cluster = Cluster(
            n,
            zk_hosts=zk.hosts,
            broker=redis_server.url,
            record_url=redis_server.url,
            root=zk_root,
            schedule=schedule,
            log_dir=tmp_path,
            session_timeout=kwargs.pop("session_timeout", SESSION),
            **kwargs,
        )
        made.append(cluster)
        return cluster

    yield make
    for cluster in made:
        cluster.stop()


def by_pid(cluster: Cluster, pid: int) -> Replica:
    return next(r for r in cluster.replicas if r.process is not None and r.pid == pid)


def publishes_by(cluster: Cluster, pid: int, since: float = 0.0) -> list[Publish]:
    return [p for p in cluster.publishes() if p.pid == pid and p.at > since]


def new_leader(cluster: Cluster, old_pid: int, since: float, timeout: float) -> Publish:
    def found() -> Publish | None:
        return next((p for p in cluster.publishes() if p.pid != old_pid and p.at > since), None)

    return wait_for(found, timeout=timeout, message=lambda: "no other replica published\n" + cluster.logs())


def line_pids(client: KazooClient, root: str) -> list[int]:
    return [data.get("pid") for _, data, _ in candidates(client, root)]


def assert_clean(report: Report, cluster: Cluster) -> None:
    assert report.published, "nothing was published"
    assert report.twice == 0, "a tick was published twice\n" + report.details()
    assert report.lost_unexplained == [] and report.unpublished_claims == [], (
        "a tick was lost\n" + report.details() + "\n" + cluster.logs()
    )


def test_kill_9_of_the_leader_is_seen_at_once_repeatedly(
    make_cluster: MakeCluster, zk_server: ZooKeeperServer, zk_client: KazooClient, zk_root: str
) -> None:
    """kill -9 of the leader thrice (30 s session): the next deletes it and publishes the next tick, once."""
    cluster = make_cluster(3, zk_server).start()
    leader_pid = wait_for(lambda: cluster.publishes(), timeout=30, message=cluster.logs)[0].pid
    kills: list[tuple[int, float]] = []
    for _ in range(3):
        wait_for(lambda: len(line_pids(zk_client, zk_root)) == 3, timeout=30, message=cluster.logs)
        wait_for(lambda pid=leader_pid: len(publishes_by(cluster, pid)) >= 3, timeout=20, message=cluster.logs)
        heir = by_pid(cluster, line_pids(zk_client, zk_root)[1])
        wait_until_watched(zk_client, zk_root, leader_pid, heir.log)
        leader = by_pid(cluster, leader_pid)
        killed_at = time.time()
        leader.signal(signal.SIGKILL)
        leader.wait()
        kills.append((leader_pid, killed_at))
        cluster.add()  # keep three replicas, as a Deployment would
        taken = new_leader(cluster, leader_pid, killed_at, timeout=TAKEOVER)
        assert taken.pid == heir.pid
        wait_for(lambda h=heir: GONE_LINE in h.log(), timeout=10, message=heir.log)
        leader_pid = taken.pid
    wait_for(lambda: len(publishes_by(cluster, leader_pid)) >= 3, timeout=20, message=cluster.logs)
    report = accounting(cluster, zk_client, kills=kills)
    assert_clean(report, cluster)
    assert len(report.leaders) == 4


def test_kill_9_of_a_follower_closes_the_line(
    make_cluster: MakeCluster, zk_server: ZooKeeperServer, zk_client: KazooClient, zk_root: str
) -> None:
    """kill -9 of the follower next in line: the one behind deletes it, and takes over at once from the leader later."""
    cluster = make_cluster(3, zk_server).start()
    wait_for(lambda: cluster.publishes(), timeout=30, message=cluster.logs)
    wait_for(lambda: len(line_pids(zk_client, zk_root)) == 3, timeout=30, message=cluster.logs)
    leader_pid, middle_pid, last_pid = line_pids(zk_client, zk_root)
    last = by_pid(cluster, last_pid)
    wait_until_watched(zk_client, zk_root, middle_pid, last.log)
    by_pid(cluster, middle_pid).signal(signal.SIGKILL)
    wait_for(lambda: line_pids(zk_client, zk_root) == [leader_pid, last_pid], timeout=TAKEOVER, message=last.log)
    # It logs the deletion just after making it: the test may look first.
    wait_for(lambda: GONE_LINE in last.log(), timeout=10, message=last.log)
    wait_for(lambda: len(publishes_by(cluster, leader_pid)) >= 3, timeout=20)
    wait_until_watched(zk_client, zk_root, leader_pid, last.log)  # its new predecessor
    killed_at = time.time()
    by_pid(cluster, leader_pid).signal(signal.SIGKILL)
    taken = new_leader(cluster, leader_pid, killed_at, timeout=TAKEOVER)
    assert taken.pid == last_pid
    wait_for(lambda: last.log().count(GONE_LINE) == 2, timeout=10, message=last.log)
    wait_for(lambda: len(publishes_by(cluster, last_pid)) >= 3, timeout=20)
    report = accounting(cluster, zk_client, kills=[(middle_pid, 0.0), (leader_pid, killed_at)])
    assert_clean(report, cluster)


def test_sigstop_of_the_leader_waits_for_the_session(
    make_cluster: MakeCluster, zk_server: ZooKeeperServer, zk_client: KazooClient
) -> None:
    """SIGSTOP keeps the socket open: takeover only at the session's end; the resumed zombie publishes nothing."""
    session = 6.0
    cluster = make_cluster(2, zk_server, session_timeout=session).start()
    zombie = by_pid(cluster, wait_for(lambda: cluster.publishes(), timeout=30, message=cluster.logs)[0].pid)
    wait_for(lambda: len(publishes_by(cluster, zombie.pid)) >= 3, timeout=20)
    paused_at = time.time()
    zombie.signal(signal.SIGSTOP)
    taken = new_leader(cluster, zombie.pid, paused_at, timeout=session + 20)
    heir = by_pid(cluster, taken.pid)
    # ZooKeeper expires a session no sooner than its timeout after the last
    # ping (sent every third of it): silence alone deleted nothing.
    assert taken.at >= paused_at + session / 2
    assert GONE_LINE not in heir.log()
    zombie.signal(signal.SIGCONT)
    resumed_at = time.time()
    wait_for(lambda: "stopped leading" in zombie.log(), timeout=20, message=zombie.log)
    wait_for(lambda: len(publishes_by(cluster, heir.pid, resumed_at)) >= 4, timeout=20)
    # The stop may land between the two sends of one batch: the zombie may
    # finish that send on SIGCONT (claimed before the pause), and nothing more.
    late = publishes_by(cluster, zombie.pid, paused_at)
    assert len({p.entry for p in late}) == len(late), f"the resumed zombie published again: {late}"
    assert all(p.epoch < taken.epoch for p in late)
    assert zombie.alive
    report = accounting(cluster, zk_client)
    assert report.twice == 0, report.details()


def test_a_leader_whose_socket_closes_while_it_lives_hands_over_once_and_rejoins(
    make_cluster: MakeCluster, zk_server: ZooKeeperServer, zk_client: KazooClient, zk_root: str
) -> None:
    """A leader whose liveness socket closes while it lives: one handover, no duplicate, it rejoins as a follower."""
    cluster = make_cluster(3, zk_server).start()
    wait_for(lambda: cluster.publishes(), timeout=30, message=cluster.logs)
    wait_for(lambda: len(line_pids(zk_client, zk_root)) == 3, timeout=30, message=cluster.logs)
    leader_pid, next_pid, _ = line_pids(zk_client, zk_root)
    old = by_pid(cluster, leader_pid)
    wait_for(lambda: len(publishes_by(cluster, leader_pid)) >= 3, timeout=20)
    wait_until_watched(zk_client, zk_root, leader_pid, by_pid(cluster, next_pid).log)
    closed_at = time.time()
    old.signal(signal.SIGUSR1)  # tests/support/beatapp.py: close the liveness socket, nothing else
    taken = new_leader(cluster, leader_pid, closed_at, timeout=TAKEOVER)
    assert taken.pid == next_pid
    wait_for(lambda: GONE_LINE in by_pid(cluster, next_pid).log(), timeout=10, message=cluster.logs)
    wait_for(lambda: leader_pid in line_pids(zk_client, zk_root)[1:], timeout=20, message=old.log)
    wait_for(lambda: len(publishes_by(cluster, next_pid)) >= 5, timeout=20)
    assert old.alive and not old.is_leader_by_log()
    assert publishes_by(cluster, leader_pid, taken.at) == [], "the old leader published after the new one"
    report = accounting(cluster, zk_client)
    assert_clean(report, cluster)
    assert len(report.leaders) == 2, "one handover"


def test_a_leader_hung_on_a_black_holed_broker_is_replaced(
    make_cluster: MakeCluster,
    zk_server: ZooKeeperServer,
    zk_client: KazooClient,
    zk_root: str,
    redis_server: RedisServer,
) -> None:
    """A leader hung on a black-holed broker steps down; another publishes; healed, it sends only its claims.

    Its log says so as docs/operating.md's table does: the row "the watchdog steps a hung leader down" at INFO
    on zkbeat.events, beside the watchdog's ERROR with the stack."""
    from tests.test_log_lines import LOG_FORMAT, lines, printed, table

    row = table()["the watchdog steps a hung leader down"]
    proxy = TcpProxy(redis_server.port).start()
    conf = {"ZKBEAT_TEST_CONF": json.dumps({"zkbeat_stall_timeout": 8, "worker_log_format": LOG_FORMAT})}
    cluster = make_cluster(0, zk_server, extra_env=conf)
    hung = cluster.add({"ZKBEAT_TEST_BROKER": f"redis://127.0.0.1:{proxy.port}/0"})
    wait_for(lambda: publishes_by(cluster, hung.pid), timeout=30, message=cluster.logs)
    cluster.add()
    cluster.add()
    wait_for(lambda: len(line_pids(zk_client, zk_root)) == 3, timeout=30, message=cluster.logs)
    wait_for(lambda: len(publishes_by(cluster, hung.pid)) >= 6, timeout=20)
    cut_at = time.time()
    proxy.blackhole()
    taken = new_leader(cluster, hung.pid, cut_at, timeout=8 + 30)
    wait_for(lambda: "stepping down so that another replica leads" in hung.log(), timeout=10, message=hung.log)
    [stepped] = wait_for(lambda: printed(hung, row), timeout=10, message=hung.log)
    epoch = publishes_by(cluster, hung.pid)[0].epoch
    assert stepped.logger == "zkbeat.events" and f"(epoch {epoch})" in stepped.message, stepped
    stalled = [line for line in lines(hung) if line.level == "ERROR" and "inside one leader pass" in line.message]
    assert [line.logger for line in stalled] == ["zkbeat.leading.watchdog"], hung.log()
    wait_for(lambda: len(publishes_by(cluster, taken.pid)) >= 4, timeout=20)
    proxy.heal()
    healed_at = time.time()
    wait_for(lambda: "the beat loop turns again" in hung.log(), timeout=90, message=hung.log)
    wait_for(lambda: len(publishes_by(cluster, taken.pid, healed_at)) >= 4, timeout=20)
    late = publishes_by(cluster, hung.pid, cut_at)
    # Only the batch claimed before the cut: at most one tick per entry, all of its old epoch.
    assert len({p.entry for p in late}) == len(late)
    assert all(p.epoch < taken.epoch for p in late)
    assert hung.alive
    report = accounting(cluster, zk_client)
    assert report.twice == 0, report.details()
    if report.lost_unexplained or report.unpublished_claims:
        # A claim never sent, or sent into the black hole without an answer
        # (it may have arrived, so it is not sent again): at most once, logged.
        explained = ("was not published", "may or may not have reached the broker")
        assert any(line in hung.log() for line in explained), report.details()
    proxy.close()


def test_the_leader_survives_hostile_connections_to_its_socket(
    make_cluster: MakeCluster, zk_server: ZooKeeperServer, zk_client: KazooClient, zk_root: str
) -> None:
    """Strangers, garbage and thousands of connections: the leader keeps leading; its follower still sees a crash."""
    cluster = make_cluster(2, zk_server).start()
    wait_for(lambda: cluster.publishes(), timeout=30, message=cluster.logs)
    wait_for(lambda: len(line_pids(zk_client, zk_root)) == 2, timeout=30, message=cluster.logs)
    (_, leader_data, _), (_, follower_data, _) = candidates(zk_client, zk_root)
    leader, follower = by_pid(cluster, leader_data["pid"]), by_pid(cluster, follower_data["pid"])
    target = (leader_data["liveness"]["host"], leader_data["liveness"]["port"])
    flood_at = time.time()
    for round_ in range(3):
        held = []
        for _ in range(1500):
            sock = socket.socket()
            sock.setblocking(False)
            sock.connect_ex(target)
            held.append(sock)
        for i, sock in enumerate(held):
            try:
                sock.send([b"\x00\xff" * 40, b"GET / HTTP/1.0\r\n\r\n", b"0" * 32, b""][i % 4] or b"x")
            except OSError:
                pass
        wait_for(lambda n=round_: len(publishes_by(cluster, leader.pid, flood_at)) >= 2 * (n + 1), timeout=20)
        for sock in held:
            sock.close()
    wait_for(lambda: len(publishes_by(cluster, leader.pid, flood_at)) >= 8, timeout=20)
    assert GONE_LINE not in follower.log()
    assert len({p.epoch for p in cluster.publishes()}) == 1, "leadership moved under the flood"
    killed_at = time.time()
    leader.signal(signal.SIGKILL)
    taken = new_leader(cluster, leader.pid, killed_at, timeout=TAKEOVER)
    assert taken.pid == follower.pid
    wait_for(lambda: GONE_LINE in follower.log(), timeout=10, message=follower.log)
    wait_for(lambda: len(publishes_by(cluster, follower.pid)) >= 3, timeout=20)
    report = accounting(cluster, zk_client, kills=[(leader.pid, killed_at)])
    assert_clean(report, cluster)


def test_a_handover_logs_one_line_at_the_level_it_deserves(
    make_cluster: MakeCluster, zk_server: ZooKeeperServer, zk_client: KazooClient, zk_root: str
) -> None:
    """SIGTERM: the successor logs no liveness WARNING; kill -9: one WARNING, and no 'its session decides' after it."""
    cluster = make_cluster(3, zk_server).start()
    wait_for(lambda: cluster.publishes(), timeout=30, message=cluster.logs)
    wait_for(lambda: len(line_pids(zk_client, zk_root)) == 3, timeout=30, message=cluster.logs)
    leader_pid, next_pid, last_pid = line_pids(zk_client, zk_root)
    heir, last = by_pid(cluster, next_pid), by_pid(cluster, last_pid)
    wait_until_watched(zk_client, zk_root, leader_pid, heir.log)
    stopped_at = time.time()
    by_pid(cluster, leader_pid).signal(signal.SIGTERM)
    new_leader(cluster, leader_pid, stopped_at, timeout=TAKEOVER)
    wait_for(lambda: len(publishes_by(cluster, next_pid)) >= 3, timeout=20, message=cluster.logs)
    liveness_warnings = [line for line in heir.log().splitlines() if "WARNING" in line and "liveness" in line]
    assert liveness_warnings == [], "a graceful stop is no warning"
    wait_until_watched(zk_client, zk_root, next_pid, last.log)
    killed_at = time.time()
    heir.signal(signal.SIGKILL)
    new_leader(cluster, next_pid, killed_at, timeout=TAKEOVER)
    wait_for(lambda: GONE_LINE in last.log(), timeout=10, message=last.log)
    wait_for(lambda: len(publishes_by(cluster, last_pid)) >= 3, timeout=20, message=cluster.logs)
    warnings = [line for line in last.log().splitlines() if "WARNING" in line and "liveness" in line]
    assert len(warnings) == 1 and GONE_LINE in warnings[0], warnings
    assert "its session decides" not in last.log()
    report = accounting(cluster, zk_client, kills=[(next_pid, killed_at)])
    assert_clean(report, cluster)

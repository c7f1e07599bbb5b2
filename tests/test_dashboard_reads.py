"""What ``zkbeat dashboard`` asks of ZooKeeper while browsers read it, counted on a ZooKeeper of the test's own.

docs/operating.md: "Browsers never cause a ZooKeeper read" (one model, kept by
watches, serves every page and JSON request) and "The dashboard only reads: it
takes no part in the election and writes nothing but what its controls ask
for". ZooKeeper's ``cons`` command gives each connection's last client request
number (``lcxid``: pings do not move it) and ``srvr`` the last transaction.
"""

from __future__ import annotations

import http.client
import json
import re
import socket
import threading
import urllib.request
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from kazoo.client import KazooClient

from tests.support.browser import Dashboard
from tests.support.helpers import wait_for
from tests.support.servers import ZooKeeperServer
from tests.test_zookeeper_writes import tree, zxid
from zkbeat.conf import read_settings
from zkbeat.coordination.election import LeaderElection
from zkbeat.ledger import controls
from zkbeat.ledger.store import Claim, EntryState, Ledger
from zkbeat.ops.dashboard.model import ClusterModel
from zkbeat.ops.dashboard.server import DashboardServer

pytestmark = pytest.mark.processes

REQUESTS = 200


@pytest.fixture
def client(zk_server_private: ZooKeeperServer) -> Iterator[KazooClient]:
    client = KazooClient(zk_server_private.hosts)
    client.start(15)
    yield client
    client.stop()
    client.close()


def request_numbers(server: ZooKeeperServer) -> dict[int, int]:
    """Session id -> the number of its last request (lcxid), for every connection that has made one."""
    found = {}
    for line in server.four_letter("cons").splitlines():
        sid, lcxid = re.search(r"sid=(0x[0-9a-f]+)", line), re.search(r"lcxid=(0x[0-9a-f]+)", line)
        if sid and lcxid:
            found[int(sid.group(1), 16)] = int(lcxid.group(1), 16)
    return found


def test_browsers_cause_no_zookeeper_read_and_the_dashboard_writes_nothing(
    zk_server_private: ZooKeeperServer, client: KazooClient, zk_root: str, tmp_path: Path
) -> None:
    """A root with a leader and 20 ledger entries, and a dashboard on it: 200 page and JSON requests move its
    ZooKeeper request counter by far less than one per request, and ZooKeeper processes no transaction from its
    start to its end: no znode under the root changes, no candidate of its own joins the election."""
    ledger = Ledger(client, zk_root)
    ledger.ensure()
    ran = datetime.now(timezone.utc) - timedelta(seconds=30)
    names = [f"entry-{i:02d}" for i in range(20)]
    assert ledger.claim([Claim(name, EntryState(last_run_at=ran)) for name in names], None).error is None
    election = LeaderElection(client, f"{zk_root}/v1/election", {"identity": "leader"})
    election.start()
    try:
        assert election.wait_for_leadership(timeout=15)
        wait_for(lambda: b"leader" in client.get(f"{zk_root}/v1/election")[0], timeout=15, message="announced")
        ours = {client.client_id[0]}
        before_tree, before_zxid = tree(client, zk_root), zxid(zk_server_private)
        env = {"ZKBEAT_HOSTS": zk_server_private.hosts, "ZKBEAT_TEST_ROOT": zk_root,
               "ZKBEAT_TEST_BROKER": "redis://127.0.0.1:1/0"}  # fmt: skip
        dashboard = Dashboard(env, tmp_path)
        try:
            state = dashboard.wait_ready()
            assert {e["name"] for e in state["entries"]} >= set(names)

            def its_session() -> int | None:
                others = [sid for sid in request_numbers(zk_server_private) if sid not in ours]
                return others[0] if len(others) == 1 else None

            sid = wait_for(its_session, timeout=15, message=lambda: zk_server_private.four_letter("cons"))
            asked = request_numbers(zk_server_private)[sid]
            for n in range(REQUESTS):
                path = "/api/state" if n % 2 else "/"
                with urllib.request.urlopen(f"{dashboard.url}{path}", timeout=30) as answer:
                    assert answer.status == 200
                    answer.read()
            asked_after = request_numbers(zk_server_private)[sid]
            after_zxid = zxid(zk_server_private)
        finally:
            dashboard.stop()
        after_tree = tree(client, zk_root)
    finally:
        election.close()
    print(f"{REQUESTS} requests to the dashboard: {asked_after - asked} ZooKeeper requests of its own")
    assert asked_after - asked < REQUESTS // 10, "browsers' requests caused ZooKeeper requests"
    # The dashboard's own session (created and closed) is the only transaction: nothing else wrote.
    assert after_zxid - before_zxid <= 2, f"{after_zxid - before_zxid} ZooKeeper transactions while it ran"
    assert after_tree == before_tree, "the dashboard changed znodes under the root"


#: (method, path, extra headers) of requests a browser or another site may send; each gets an answer of its own.
ASKED = [
    ("GET", "/", {}),
    ("GET", "/api/state", {}),
    ("GET", "/static/app.js", {}),
    ("GET", "/nowhere", {}),
    ("GET", "/api/state", {"Host": "evil.example"}),
    ("POST", "/api/pause", {"Content-Type": "application/json"}),
    ("HEAD", "/", {}),
    ("PUT", "/api/pause", {}),
    ("DELETE", "/", {}),
    ("OPTIONS", "/api/state", {}),
]


def test_every_response_forbids_inline_scripts_and_framing_and_sets_no_cookie(
    zk_server: ZooKeeperServer, zk_root: str
) -> None:
    """operating.md: "every response forbids inline scripts and framing (Content-Security-Policy)" and "No cookie
    is ever set": pages, JSON, refusals, unknown paths, and methods the dashboard does not serve (HEAD, PUT,
    DELETE, OPTIONS), as well as a request whose headers it cannot read. Before, the methods it does not serve and the
    unreadable request got http.server's own error page, without those headers."""
    client = KazooClient(zk_server.hosts)
    client.start(timeout=15)
    model = ClusterModel(client, read_settings({"zkbeat_hosts": zk_server.hosts, "zkbeat_root": zk_root}, None))
    server = DashboardServer(("127.0.0.1", 0), model, secret="s3cret s3cret s3cret")
    serving = threading.Thread(target=server.serve_forever, daemon=True)
    serving.start()
    port = server.server_address[1]
    answered: dict[str, tuple[int, dict[str, str]]] = {}
    try:
        for method, path, headers in ASKED:
            connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
            connection.request(method, path, b"{}" if method == "POST" else None, headers)
            answer = connection.getresponse()
            answer.read()
            answered[f"{method} {path} {headers}"] = (answer.status, {k.lower(): v for k, v in answer.getheaders()})
            connection.close()
        with socket.create_connection(("127.0.0.1", port), timeout=30) as raw:
            raw.sendall(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Long: " + b"x" * 70_000 + b"\r\n\r\n")  # 431
            head = raw.makefile("rb").read().split(b"\r\n\r\n", 1)[0].decode("latin-1").split("\r\n")
        status = int(head[0].split()[1])
        fields = (line.split(":", 1) for line in head[1:])
        answered["unreadable headers"] = (status, {k.lower(): v.strip() for k, v in fields})
    finally:
        server.stop()
        serving.join(timeout=10)
        client.stop()
        client.close()
    unguarded = {
        asked: status
        for asked, (status, headers) in answered.items()
        if "script-src 'self'" not in headers.get("content-security-policy", "")
        or "frame-ancestors 'none'" not in headers.get("content-security-policy", "")
        or headers.get("x-frame-options") != "DENY"
    }
    assert unguarded == {}, f"answers without the security headers: {unguarded}"
    assert [asked for asked, (_, headers) in answered.items() if "set-cookie" in headers] == []
    assert {asked: status for asked, (status, _) in answered.items() if status < 400} == {
        "GET / {}": 200,
        "GET /api/state {}": 200,
        "GET /static/app.js {}": 200,
    }


def test_the_dashboard_says_when_its_zookeeper_connection_is_not_connected_and_recovers(
    zk_server_private: ZooKeeperServer, client: KazooClient, zk_root: str, tmp_path: Path
) -> None:
    """operating.md: "The page says when the dashboard's own ZooKeeper connection is not CONNECTED" (the page's
    badge reads `connection` of /api/state). ZooKeeper stopped: the dashboard keeps answering and says
    its connection is not CONNECTED; ZooKeeper back: CONNECTED again, and a pause made then reaches it."""
    Ledger(client, zk_root).ensure()
    election = LeaderElection(client, f"{zk_root}/v1/election", {"identity": "leader"})
    election.start()
    assert election.wait_for_leadership(timeout=15)
    wait_for(lambda: b"leader" in client.get(f"{zk_root}/v1/election")[0], timeout=15, message="announced")
    env = {"ZKBEAT_HOSTS": zk_server_private.hosts, "ZKBEAT_TEST_ROOT": zk_root,
           "ZKBEAT_TEST_BROKER": "redis://127.0.0.1:1/0", "ZKBEAT_TEST_SCHEDULE": '{"tick": 60}'}  # fmt: skip
    dashboard = Dashboard(env, tmp_path)
    try:
        assert dashboard.wait_ready()["connection"] == "CONNECTED"
        zk_server_private.stop()
        gone = wait_for(lambda: (s := dashboard.state())["connection"] != "CONNECTED" and s, timeout=60,
                        message=dashboard.log)  # fmt: skip
        print("while ZooKeeper is stopped the dashboard says:", gone["connection"])
        zk_server_private.start()
        wait_for(lambda: dashboard.state()["connection"] == "CONNECTED", timeout=60, message=dashboard.log)
        after = KazooClient(zk_server_private.hosts)  # the test's own session may have ended with the outage
        after.start(15)
        try:
            controls.pause(after, zk_root, "tick", "tester", "after the outage", scheduled=True, force=True)
        finally:
            after.stop()
            after.close()

        def paused() -> bool:
            found = [e for e in dashboard.state()["entries"] if e["name"] == "tick"]
            return bool(found) and (found[0]["paused"] or {}).get("note") == "after the outage"

        wait_for(paused, timeout=60, message=dashboard.log)
    finally:
        dashboard.stop()
        try:
            election.close()
        except Exception:  # noqa: BLE001 - its session may have ended with the outage
            pass


def test_port_0_takes_a_free_port_on_the_loopback_address_and_says_which(
    zk_server: ZooKeeperServer, zk_root: str, tmp_path: Path
) -> None:
    """operating.md: the dashboard "binds 127.0.0.1 unless --bind says otherwise; --port 0 takes any free port",
    and its first line says where it serves (read-only without a secret)."""
    env = {"ZKBEAT_HOSTS": zk_server.hosts, "ZKBEAT_TEST_ROOT": zk_root, "ZKBEAT_TEST_BROKER": "redis://127.0.0.1:1/0"}
    dashboard = Dashboard(env, tmp_path, args=("--port", "0"))
    try:
        said = wait_for(lambda: re.search(r"http://127\.0\.0\.1:(\d+)/ \(read-only", dashboard.log()), timeout=60,
                        message=dashboard.log)  # fmt: skip
        port = int(said.group(1))
        assert port != 0
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/state", timeout=30) as answer:
            assert answer.status == 200 and json.loads(answer.read())["root"] == zk_root
    finally:
        dashboard.stop()

"""JSON a stranger may write, anything but the object zkbeat reads there, against a real ZooKeeper.

The election node (a leader's announcement and departure note), a run-now
request, the dashboard's election reads: each is writable by anyone zkbeat's
ACL lets in (a tool, a hand with zkCli). Whatever is there (no data, not
UTF-8, not JSON, JSON nested past Python's recursion limit, which json raises
as RecursionError, a list, a number, null) is logged and survived: the
election still announces and steps down, the leader still publishes run-now
requests, `zkbeat status` still reports and the dashboard still follows. The
dashboard's controls read a POST's body the same way: such a body is a 400.
"""

from __future__ import annotations

import http.client
import http.server
import json
import logging
import re
import threading
from collections.abc import Callable, Iterator
from datetime import datetime, timezone
from typing import Any

import pytest
from kazoo.client import KazooClient

from tests.support.helpers import every, lead, wait_for
from tests.support.servers import ZooKeeperServer
from tests.support.undecodable import UNDECODABLE, plant
from tests.test_shards import lead_every_shard
from zkbeat.conf import read_settings
from zkbeat.coordination.election import LeaderElection, request_step_down
from zkbeat.coordination.shards import election_path
from zkbeat.ledger import controls
from zkbeat.ledger.store import EntryState, Ledger, encode_state
from zkbeat.ops.cli import Target, _check_local
from zkbeat.ops.dashboard.model import ClusterModel
from zkbeat.ops.dashboard.server import DashboardServer
from zkbeat.ops.status import read_status

BAD = pytest.mark.parametrize("bad", list(UNDECODABLE.values()), ids=list(UNDECODABLE))


@pytest.fixture
def made() -> Iterator[list[LeaderElection]]:
    elections: list[LeaderElection] = []
    yield elections
    for election in elections:
        election.close()


def _announced(client: KazooClient, path: str, election: LeaderElection) -> bool:
    candidate = election.candidate
    raw, _ = client.get(path)
    try:
        return candidate is not None and json.loads(raw or b"{}").get("leader") == candidate.rsplit("/", 1)[1]
    except (ValueError, RecursionError, AttributeError):
        return False


@BAD
def test_the_election_announces_over_and_steps_down_through_an_undecodable_election_node(
    bad: bytes | None, zk_client: KazooClient, zk_root: str, made: list[LeaderElection], caplog
) -> None:
    """A leader reads the election node once before it announces (who led before, their note): it takes over with
    no predecessor named and announces over it, and `zkbeat step-down` notes its request over it. Before, JSON
    nested past the recursion limit raised RecursionError out of the election's worker, so nobody announced."""
    path = election_path(zk_root)
    plant(zk_client, path, bad)
    election = LeaderElection(zk_client, path, {"identity": "leader"})
    made.append(election)
    with caplog.at_level(logging.WARNING, logger="zkbeat"):
        election.start()
        assert election.wait_for_leadership(timeout=15)
        wait_for(lambda: _announced(zk_client, path, election), timeout=15, message="never announced")
    handover = election.handover(election.leadership)
    assert handover is None or handover.previous is None
    if bad is not None:  # no data at all is a fresh election node's: nothing to say
        assert f"{path} held data zkbeat cannot read" in caplog.text, caplog.text

    plant(zk_client, path, bad)
    first = election.candidate
    request_step_down(zk_client, first, "tester")
    wait_for(lambda: election.candidate not in (None, first) and election.is_leader, timeout=15)
    wait_for(lambda: _announced(zk_client, path, election), timeout=15, message="never announced again")


@BAD
def test_status_and_the_dashboard_read_an_undecodable_election_node_and_run_now_request(
    bad: bytes | None,
    make_scheduler: Callable[..., Any],
    zk_server: ZooKeeperServer,
    zk_client: KazooClient,
    zk_root: str,
) -> None:
    """Sharded (two elections), a stranger overwrote each election node and left a run-now request: `zkbeat
    status` reports (the request pending, for no entry it can name) and the dashboard's model follows on, showing
    the leaders and a request zkbeat made after them. Before, no data raised AttributeError and the nesting
    RecursionError out of both."""
    settings = {"zkbeat_shards": 2, "beat_max_loop_interval": 0.2}
    leader = make_scheduler({"a": every(0.2)}, identity="leader", **settings)
    lead_every_shard(leader)
    client = KazooClient(zk_server.hosts)
    client.start(timeout=15)
    model_settings = read_settings({"zkbeat_hosts": zk_server.hosts, "zkbeat_root": zk_root, **settings}, None)
    model = ClusterModel(client, model_settings).start()
    try:
        wait_for(
            lambda: leader.tick() is not None and any(e["name"] == "a" for e in model.snapshot()["entries"]),
            timeout=30,
        )
        wait_for(lambda: all(s["leader"] for s in model.snapshot()["shards"]), timeout=15)
        for shard in range(2):
            plant(zk_client, election_path(zk_root, shard, 2), bad)
        requests = f"{zk_root}/v1/triggers"
        plant(zk_client, f"{requests}/request-0000000000", bad)

        status = read_status(zk_client, zk_root, zk_server.hosts, shards=2)
        assert [p["request"] for p in status.pending] == ["request-0000000000"]
        assert status.pending[0]["entry"] is None
        assert all(shard.candidates for shard in status.shards)
        outcome = controls.request_outcome(zk_client, zk_root, f"{requests}/request-0000000000", "a")
        assert outcome == {"state": "pending", "held": None}

        zk_client.create(f"{requests}/request-", json.dumps({"entry": "a", "by": "op"}).encode(), sequence=True)
        wait_for(
            lambda: any(e["name"] == "a" and e["pending"] for e in model.snapshot()["entries"]),
            timeout=15,
            message=lambda: repr(model.snapshot()["error"]),
        )
        state = model.snapshot()
        assert state["error"] is None and len(state["shards"]) == 2
        assert all(s["candidates"] for s in state["shards"]), state["shards"]
    finally:
        model.stop()
        client.stop()
        client.close()


@BAD
def test_the_leader_refuses_an_undecodable_run_now_request_and_runs_the_next(
    bad: bytes | None, make_scheduler: Callable[..., Any], zk_client: KazooClient, zk_root: str, caplog
) -> None:
    """The leader's inbox removes a request it cannot read, with a receipt and an ERROR saying why, and publishes
    the request made after it. Before, no data raised AttributeError and the nesting RecursionError out of
    tick(), every pass."""
    leader = make_scheduler({"a": every(60)}, identity="leader")
    lead(leader)
    wait_for(lambda: leader.tick() is not None, timeout=15)
    requests, done, _ = controls._paths(zk_root)
    plant(zk_client, f"{requests}/request-0000000000", bad)
    with caplog.at_level(logging.ERROR, logger="zkbeat"):
        wait_for(
            lambda: leader.tick() is not None and zk_client.exists(f"{requests}/request-0000000000") is None,
            timeout=15,
        )
    assert f"removing the trigger request {requests}/request-0000000000" in caplog.text, caplog.text
    receipt = json.loads(zk_client.get(f"{done}/request-0000000000")[0])
    assert "cannot read" in receipt["refused"], receipt
    request = controls.request_trigger(zk_client, zk_root, "a", "tester", scheduled=True)
    name = request.rsplit("/", 1)[1]
    wait_for(lambda: leader.tick() is not None and zk_client.exists(f"{done}/{name}") is not None, timeout=15)
    assert "task_id" in json.loads(zk_client.get(f"{done}/{name}")[0])


@pytest.mark.parametrize(
    "body", [raw for raw in UNDECODABLE.values() if raw], ids=[name for name, raw in UNDECODABLE.items() if raw]
)
def test_a_control_s_body_the_dashboard_cannot_read_is_a_400_and_the_next_is_served(
    body: bytes, zk_server: ZooKeeperServer, zk_root: str
) -> None:
    """A POST whose JSON body is no object (not UTF-8, not JSON, nested past the recursion limit, a list, a
    number, null) is answered 400 saying why, and the dashboard answers the next request. Before, the nesting
    raised RecursionError in the request's thread: the connection closed with no answer."""
    client = KazooClient(zk_server.hosts)
    client.start(timeout=15)
    model = ClusterModel(client, read_settings({"zkbeat_hosts": zk_server.hosts, "zkbeat_root": zk_root}, None))
    server = DashboardServer(("127.0.0.1", 0), model, secret="s3cret")
    serving = threading.Thread(target=server.serve_forever, daemon=True)
    serving.start()
    try:
        for sent, status, said in ((body, 400, "cannot read the request body"), (b"{}", 403, "secret")):
            connection = http.client.HTTPConnection("127.0.0.1", server.server_address[1], timeout=30)
            connection.request("POST", "/api/run", sent, {"Content-Type": "application/json"})
            answer = connection.getresponse()
            assert answer.status == status, answer.status
            assert said in json.loads(answer.read())["error"]
            connection.close()
    finally:
        server.stop()
        serving.join(timeout=10)
        client.stop()
        client.close()


@pytest.mark.parametrize(
    "body", [raw for raw in UNDECODABLE.values() if raw], ids=[name for name, raw in UNDECODABLE.items() if raw]
)
def test_health_local_reads_any_answer_of_the_metrics_port(body: bytes, capsys) -> None:
    """`zkbeat health --local` asks /healthz on this machine's metrics port: a 503 whose body is no JSON object
    (whatever else answers there) fails the check with its status, not a traceback. Before, the nesting raised
    RecursionError and a list, a number or null AttributeError."""

    class Answer(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            self.send_response(503)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - http.server's signature
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Answer)
    serving = threading.Thread(target=server.serve_forever, daemon=True)
    serving.start()
    try:
        settings = read_settings({"zkbeat_metrics_port": server.server_address[1]}, None)
        with pytest.raises(SystemExit) as ended:
            _check_local(Target(settings, timeout=10))
        assert ended.value.code == 1
        assert "not connected to ZooKeeper (503)" in capsys.readouterr().err
    finally:
        server.shutdown()
        server.server_close()


def test_a_ledger_entry_with_a_record_nested_near_the_recursion_limit_is_read_and_said(
    make_scheduler: Callable[..., Any], zk_client: KazooClient, zk_root: str, caplog
) -> None:
    """Ledger entries whose pause, 'early' or 'recent' record is a list nested 880 to 1000 deep (json.loads reads
    those below its recursion limit less the stack it runs on, and refuses the rest): each is read as its
    record's rule says (a pause record zkbeat cannot read still pauses, the others read as none) or, past the
    limit, as no state, and each is named in a WARNING; the entry beside them is read, and a leader takes over
    and ticks. Before, the WARNING about a record nested just below the limit could not format it (its repr
    overflowed, deeper in the stack): a handler that raises on that (as pytest's does) raised RecursionError out
    of Ledger.load, and the standard one printed a traceback instead of the line."""
    ledger = Ledger(zk_client, zk_root)
    now = datetime.now(timezone.utc)
    good = EntryState(last_run_at=now, total_run_count=1, epoch=1, updated_at=now, slot=now)
    zk_client.create(ledger.entry_path("good"), encode_state(good), makepath=True)
    fields = ("paused", "early", "recent")
    depths = range(880, 1001, 2)
    for field in fields:
        for depth in depths:
            data = json.loads(encode_state(good))
            data[field] = "@"
            raw = json.dumps(data).replace('"@"', "[" * depth + "]" * depth).encode()
            zk_client.create(ledger.entry_path(f"{field}-{depth}"), raw)
    with caplog.at_level(logging.WARNING, logger="zkbeat"):
        records = ledger.load()
    assert records["good"].state == good
    said = "\n".join(r.getMessage() for r in caplog.records)
    read = 0
    for field in fields:
        for depth in depths:
            state = records[f"{field}-{depth}"].state
            if state is None:  # nested past what json.loads reads here
                assert (
                    f"{ledger.entry_path(f'{field}-{depth}')} holds data zkbeat cannot read (JSON nested too deep)"
                    in said
                )
                continue
            read += 1
            assert (state.last_run_at, state.early, state.recent) == (now, (), ())
            assert (state.paused is not None) == (field == "paused"), state
    assert read, "no entry was nested below the recursion limit: the test tested nothing"
    for what in ("a pause record", "an 'early' record", "a 'recent' runs record"):
        assert re.search(rf"holds {re.escape(what)} zkbeat cannot read \(\[+\.\.\.\]+\)", said), said[-2000:]

    leader = make_scheduler({"a": every(0.2)}, identity="leader")
    lead(leader)
    wait_for(lambda: leader.tick() is not None and zk_client.exists(ledger.entry_path("a")), timeout=15)

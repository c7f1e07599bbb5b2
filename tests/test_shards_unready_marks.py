"""What `zkbeat status` and the dashboard make of the unready listing's children, whoever wrote them.

``<root>/v1/unready`` is writable by anyone zkbeat's ACL lets in: a tool, an
older or newer release, a hand with zkCli. Its children are read by the
status command and the dashboard (the replicas' fair share only lists their
names). A child named like a replica id but holding anything at all (no
data, as zkCli's ``create`` leaves, JSON nested deeper than Python's
recursion limit, a time at the end of the calendar, wrong types) must not
stop the report nor freeze the dashboard on what it read before; with
``zkbeat_shards = 1`` no zkbeat writes there, and the report is as it was.
Real ZooKeeper and Redis of tests/support.
"""

from __future__ import annotations

import json

from kazoo.client import KazooClient
from kazoo.protocol.serialization import Create
from kazoo.security import OPEN_ACL_UNSAFE

from tests.support.helpers import every, wait_for
from tests.test_shards import announced, lead_every_shard, zkbeat
from tests.test_shards_review import Loop
from zkbeat.conf import read_settings
from zkbeat.coordination.shards import MAX_WHY, unready_path
from zkbeat.ops.dashboard.model import ClusterModel


def create_without_data(client: KazooClient, path: str) -> None:
    """A znode whose data is null, not empty (as zkCli's ``create <path>`` or a Java client's null makes it)."""
    result = client.handler.async_result()
    client._call(Create(path, None, OPEN_ACL_UNSAFE, 0), result)
    result.get(timeout=15)
    assert client.get(path)[0] is None


#: Child name (shaped like a replica id) -> what it holds (None: no data at all).
ODD_MARKS: dict[str, bytes | None] = {
    "a" * 32: None,
    "b" * 32: b"[" * 100_000 + b"]" * 100_000,  # valid JSON, nested past the recursion limit
    "c" * 32: json.dumps({"why": "far", "since": 253402300799.9}).encode(),  # the last second of year 9999
    "d" * 32: b"[1, 2]",
    "e" * 32: json.dumps({"why": 5, "since": "yesterday", "identity": ["x"], "host": {}, "pid": "12"}).encode(),
    "f" * 32: b"\xff\xfe not utf-8",
}


def leave_odd_marks(client: KazooClient, root: str) -> None:
    listing = unready_path(root)
    client.ensure_path(listing)
    for name, data in ODD_MARKS.items():
        if data is None:
            create_without_data(client, f"{listing}/{name}")
        else:
            client.create(f"{listing}/{name}", data)


def test_status_and_the_dashboard_report_whatever_the_unready_listing_holds(
    make_scheduler, zk_server, zk_client: KazooClient, zk_root: str
) -> None:
    """Sharded: every odd child is listed as a mark of an unknown reason (or its own, where it is a string), and
    the rest of the report is there: the command exits 0 (before, no data raised AttributeError, the nesting
    RecursionError, the year 9999 OverflowError), and the dashboard's model publishes the shards' leaders and
    the marks (before, its every read failed after the lines: the page kept what it had, re-read every second)."""
    settings = {"zkbeat_shards": 2, "beat_max_loop_interval": 0.2}
    leader = make_scheduler({"a": every(1)}, identity="leader", **settings)
    lead_every_shard(leader)
    wait_for(lambda: announced(leader, 2), timeout=30)
    leave_odd_marks(zk_client, zk_root)

    shown = zkbeat(leader, "status")
    assert shown.returncode == 0, shown.stderr
    said = [line for line in shown.stdout.splitlines() if line.startswith("not ready to lead")]
    assert sorted(line.split()[5] for line in said) == sorted(ODD_MARKS), shown.stdout
    assert any(line.startswith(f"not ready to lead: replica {'c' * 32} ") and ": far, " in line for line in said)

    found = zkbeat(leader, "status", "--json")
    assert found.returncode == 0, found.stderr
    marks = {mark["replica"]: mark for mark in json.loads(found.stdout)["unready"]}
    assert sorted(marks) == sorted(ODD_MARKS), marks
    assert marks["c" * 32]["why"] == "far"
    assert all(marks[name]["why"] == "unknown" for name in ODD_MARKS if name != "c" * 32), marks
    assert all(mark["in_line"] is False for mark in marks.values()), marks

    client = KazooClient(zk_server.hosts)
    client.start(timeout=15)
    model = ClusterModel(
        client, read_settings({"zkbeat_hosts": zk_server.hosts, "zkbeat_root": zk_root, **settings}, None)
    )
    model.start()
    try:
        wait_for(
            lambda: len(model.snapshot().get("unready") or []) == len(ODD_MARKS),
            timeout=30,
            message=lambda: repr(model.snapshot().get("unready")),
        )
        state = model.snapshot()
        assert all(shard["leader"] is not None for shard in state["shards"]), state["shards"]
    finally:
        model.stop()
        client.stop()
        client.close()


def test_with_one_shard_status_reads_no_unready_listing(make_scheduler, zk_client: KazooClient, zk_root: str) -> None:
    """``zkbeat_shards = 1``: no replica marks itself, so whatever is under ``<root>/v1/unready`` (here the odd
    children above) is someone else's: `zkbeat status` reports the cluster as before this listing existed (it
    read it, failed on no data, and would have named every child "not ready to lead")."""
    leader = make_scheduler({"a": every(1)}, identity="leader", beat_max_loop_interval=0.2)
    assert leader.election.wait_for_leadership(15)
    leave_odd_marks(zk_client, zk_root)
    shown = zkbeat(leader, "status")
    assert shown.returncode == 0, shown.stderr
    assert "not ready to lead" not in shown.stdout, shown.stdout
    found = zkbeat(leader, "status", "--json")
    assert found.returncode == 0, found.stderr
    assert json.loads(found.stdout)["unready"] == [], found.stdout


def test_a_mark_s_reason_is_written_cut_to_its_cap_however_long_it_is(
    make_scheduler, zk_client: KazooClient, zk_root: str
) -> None:
    """A reason of 2 MB (an exception's text, the repr of a big row) is written cut to MAX_WHY characters, ending in
    an ellipsis: the mark is there for every replica, and the replica's connection stays up. Before, the 2 MB
    create was past ZooKeeper's jute.maxbuffer: the server dropped the connection at each pass, and no mark was
    ever written."""
    settings = {"zkbeat_shards": 2, "beat_max_loop_interval": 0.2}
    leader = make_scheduler({"a": every(1)}, identity="leader", **settings)
    lead_every_shard(leader)  # leads both shards, never ticking: nothing unmarks the replica below
    replica = make_scheduler({"a": every(1)}, identity="r", **settings)
    replica.schedule_readable = lambda: False
    states: list[str] = []
    replica.zk_client.add_listener(states.append)
    huge = "cannot read the schedule: " + "x" * 2_000_000
    replica._fair_share.mark_unready(huge)
    mark = f"{unready_path(zk_root)}/{replica._replica}"
    with Loop(replica):
        wait_for(lambda: zk_client.exists(mark), timeout=30, message=lambda: f"no unready mark; states {states}")
        why = json.loads(zk_client.get(mark)[0])["why"]
        assert "SUSPENDED" not in states, states
    assert why == huge[: MAX_WHY - 1] + "…", why[:80]


def test_status_and_the_dashboard_show_a_stranger_s_long_reason_cut_to_the_cap(
    make_scheduler, zk_server, zk_client: KazooClient, zk_root: str
) -> None:
    """A mark another writer left (an older release, a tool) with a reason of 900 kB, under ZooKeeper's limit:
    `zkbeat status`, its --json and the dashboard's model each show it cut to MAX_WHY characters. Before, the
    whole 900 kB went into each."""
    settings = {"zkbeat_shards": 2, "beat_max_loop_interval": 0.2}
    leader = make_scheduler({"a": every(1)}, identity="leader", **settings)
    lead_every_shard(leader)
    wait_for(lambda: announced(leader, 2), timeout=30)
    long = "row " + "y" * 900_000
    zk_client.create(f"{unready_path(zk_root)}/{'a' * 32}", json.dumps({"why": long}).encode(), makepath=True)
    cut = long[: MAX_WHY - 1] + "…"

    shown = zkbeat(leader, "status")
    assert shown.returncode == 0, shown.stderr
    said = [line for line in shown.stdout.splitlines() if line.startswith("not ready to lead")]
    assert len(said) == 1 and f": {cut}, since " in said[0], said[0][:400]
    found = zkbeat(leader, "status", "--json")
    assert found.returncode == 0, found.stderr
    assert [mark["why"] for mark in json.loads(found.stdout)["unready"]] == [cut]

    client = KazooClient(zk_server.hosts)
    client.start(timeout=15)
    model = ClusterModel(
        client, read_settings({"zkbeat_hosts": zk_server.hosts, "zkbeat_root": zk_root, **settings}, None)
    )
    model.start()
    try:
        wait_for(lambda: model.snapshot().get("unready"), timeout=30)
        assert [mark["why"] for mark in model.snapshot()["unready"]] == [cut]
    finally:
        model.stop()
        client.stop()
        client.close()

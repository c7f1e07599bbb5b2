"""ZooKeeper writes per publish, counted on a ZooKeeper of the test's own.

docs/sharding.md and docs/operating.md promise one ledger write per publish,
whatever the number of shards: the fenced claim that records a run (its
recent runs included) is the only write, no other znode is written while a
leader publishes, and a claim of several entries is one transaction. This
counts it: each entry's znode version against the publishes of that entry,
every other znode under the root unchanged, and ZooKeeper's transaction
counter (``srvr``'s Zxid) against the publishes.
"""

from __future__ import annotations

from collections import Counter

import pytest
from kazoo.client import KazooClient

from tests.support.helpers import Published, every, names_in_every_shard, wait_for
from tests.support.servers import ZooKeeperServer
from zkbeat.ledger.store import Ledger


def zxid(server: ZooKeeperServer) -> int:
    """The last transaction ZooKeeper processed (each write request, or multi, is one)."""
    for line in server.four_letter("srvr").splitlines():
        if line.startswith("Zxid: "):
            return int(line.removeprefix("Zxid: ").strip(), 16)
    raise AssertionError("srvr gave no Zxid")


def tree(client: KazooClient, path: str) -> dict[str, tuple[int, int]]:
    """Every znode under ``path``: (when its data last changed, how often its children changed)."""
    stat = client.exists(path)
    found = {path: (stat.mzxid, stat.cversion)}
    for child in client.get_children(path):
        found.update(tree(client, f"{path}/{child}"))
    return found


@pytest.mark.parametrize("shards", [1, 2])
def test_each_publish_is_one_ledger_write_and_nothing_else_is_written(
    shards: int, make_scheduler, zk_server_private: ZooKeeperServer, zk_root: str, published: Published
) -> None:
    """A leader of every shard publishes 6 entries every 0.3 s (with one shard, a follower beside it): over the
    counted passes each entry's znode is written exactly once per publish of it, no other znode under the root
    changes, and ZooKeeper processed at most one transaction per publish (entries due together share one)."""
    names = names_in_every_shard(zk_root, shards, per_shard=6 // shards)
    entries = {name: every(0.3) for name in names}
    conf = {"hosts": zk_server_private.hosts, "zkbeat_shards": shards, "beat_max_loop_interval": 0.2}
    leader = make_scheduler(entries, identity="leader", **conf)
    for shard in getattr(leader, "_shards", None) or [leader]:
        assert shard.election.wait_for_leadership(15)
    if shards == 1:  # (with more, the fair share would hand the follower a shard, and it is never ticked)
        make_scheduler(entries, identity="follower", **conf).setup_schedule()  # in line, never ticked: it follows
    client = KazooClient(zk_server_private.hosts)
    client.start(15)
    try:
        if shards == 1:
            wait_for(lambda: len(client.get_children(f"{zk_root}/v1/election")) == 2, timeout=15)
        # Warm up: the term began, its clock and announcement are written, every entry ran twice.
        wait_for(lambda: leader.tick() is not None and all(published.count(n) >= 2 for n in names), timeout=30)
        ledger = Ledger(client, zk_root)
        before_tree = tree(client, zk_root)
        before_zxid = zxid(zk_server_private)
        before_counts = Counter(published.entries())
        before_versions = {n: client.exists(ledger.entry_path(n)).version for n in names}

        wait_for(lambda: leader.tick() is not None and all(published.count(n) >= before_counts[n] + 5
                                                           for n in names), timeout=30)  # fmt: skip

        after_zxid = zxid(zk_server_private)
        after_tree = tree(client, zk_root)
        counts = Counter(published.entries()) - before_counts
        writes = {n: client.exists(ledger.entry_path(n)).version - before_versions[n] for n in names}
    finally:
        client.stop()
        client.close()
    assert writes == {n: counts[n] for n in names}, "an entry's znode was not written once per publish"
    entry_paths = {ledger.entry_path(n) for n in names}
    changed = sorted(
        path for path, stats in after_tree.items() if path not in entry_paths and before_tree.get(path) != stats
    )
    assert changed == [], f"znodes written while the leader published: {changed}"
    transactions = after_zxid - before_zxid
    print(f"{shards} shard(s): {sum(counts.values())} publishes, {transactions} ZooKeeper transactions")
    assert 0 < transactions <= sum(counts.values())

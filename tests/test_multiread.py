"""multiRead: many znodes in one request, and the ledger's fallback without it."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest
from kazoo.client import KazooClient
from kazoo.exceptions import NoAuthError, NoNodeError, UnimplementedError
from kazoo.security import make_digest_acl

from zkbeat.coordination._multiread import CHUNK, read_many
from zkbeat.ledger import store as ledger_module
from zkbeat.ledger.store import Claim, EntryState, Ledger, decode_answer


def test_read_many_returns_data_and_errors_in_order(zk_client, zk_root):
    """Each path gets its own (data, stat) or NoNodeError, in the order asked, across chunks."""
    zk_client.ensure_path(zk_root)
    paths = [f"{zk_root}/n{i}" for i in range(CHUNK + 5)]
    for i, path in enumerate(paths):
        if i % 3:
            zk_client.create(path, str(i).encode())
    results = read_many(zk_client, paths, timeout=10)
    assert len(results) == len(paths)
    for i, result in enumerate(results):
        if i % 3:
            assert result[0] == str(i).encode() and result[1].version == 0
        else:
            assert isinstance(result, NoNodeError)


def test_read_many_honours_a_chroot(zk_server, zk_client, zk_root):
    """Paths are relative to the client's chroot, as with kazoo's own get."""
    zk_client.create(f"{zk_root}/a", b"x", makepath=True)
    chrooted = KazooClient(zk_server.hosts + zk_root)
    chrooted.start(timeout=15)
    try:
        assert read_many(chrooted, ["/a"], timeout=10)[0][0] == b"x"
    finally:
        chrooted.stop()
        chrooted.close()


def test_ledger_falls_back_to_single_reads_without_multiread(zk_client, zk_root, monkeypatch):
    """A ZooKeeper older than 3.6 (UnimplementedError) still loads the ledger, one get per entry."""
    ledger = Ledger(zk_client, zk_root)
    ledger.ensure()
    fence = zk_client.create(f"{zk_root}/fence", ephemeral=True)
    now = datetime.now(timezone.utc)
    ledger.claim([Claim(f"e{i}", EntryState(now, i)) for i in range(3)], fence)

    def unimplemented(*args, **kwargs):
        raise UnimplementedError()

    monkeypatch.setattr(ledger_module, "read_many", unimplemented)
    records = ledger.load()
    assert {name: record.state.total_run_count for name, record in records.items()} == {"e0": 0, "e1": 1, "e2": 2}
    assert ledger.load(["e1", "missing"]).keys() == {"e1"}


def test_one_decoder_reads_each_answer_of_a_ledger_multiread(zk_client, zk_root):
    """decode_answer: a state, no such entry, data zkbeat cannot decode (no state, and why), NoAuth raised;
    Ledger.load, on the same znodes, takes the one under someone else's ACL for no state."""
    ledger = Ledger(zk_client, zk_root)
    ledger.ensure()
    fence = zk_client.create(f"{zk_root}/fence", ephemeral=True)
    ledger.claim([Claim("good", EntryState(datetime.now(timezone.utc), 4))], fence)
    zk_client.create(ledger.entry_path("garbage"), b"\xff not zkbeat's")
    zk_client.create(ledger.entry_path("denied"), b"{}", acl=[make_digest_acl("stranger", "pw", all=True)])
    names = ["good", "garbage", "missing", "denied"]
    good, garbage, missing, denied = read_many(zk_client, [ledger.entry_path(name) for name in names], timeout=10)
    read = decode_answer(good)
    assert read is not None and read.state is not None and read.state.total_run_count == 4
    assert read.unreadable is None
    read = decode_answer(garbage)
    assert read is not None and read.state is None and isinstance(read.unreadable, ValueError)
    assert read.stat.version == 0
    assert decode_answer(missing) is None
    with pytest.raises(NoAuthError):
        decode_answer(denied)
    records = ledger.load(names)
    assert {name: record.state is not None for name, record in records.items()} == {
        "good": True,
        "garbage": False,
        "denied": False,
    }

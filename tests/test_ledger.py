"""The fenced run ledger against a real ZooKeeper.

Each test works under its own ``zk_root``. The fence is a candidate znode the
test creates itself (ephemeral, like the election's), so the ledger is proven
on its own, without LeaderElection in the loop.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta, timezone

import pytest
from kazoo.client import KazooClient
from kazoo.exceptions import ConnectionClosedError, ConnectionLoss, SessionExpiredError

from tests.support.helpers import wait_for
from tests.support.servers import ZooKeeperServer, expire_session, expire_session_quietly
from tests.support.undecodable import plant
from zkbeat.exceptions import ClaimConflictError, FencedError
from zkbeat.ledger.store import ABSENT, Claim, EntryState, Ledger, LedgerRecord, encode_state

BASE = datetime(2024, 5, 1, 12, 0, tzinfo=timezone.utc)


def state(n: int, epoch: int = 1) -> EntryState:
    """A distinct, fully populated state for run number ``n``."""
    at = BASE + timedelta(minutes=n)
    return EntryState(last_run_at=at, total_run_count=n, epoch=epoch, updated_at=at + timedelta(seconds=1), slot=at)


def candidate_path(root: str, seq: int = 1) -> str:
    return f"{root}/v1/election/candidate-x-{seq:010d}"


@pytest.fixture
def ledger(zk_client: KazooClient, zk_root: str) -> Ledger:
    ledger = Ledger(zk_client, zk_root, timeout=10)
    ledger.ensure()
    return ledger


@pytest.fixture
def fence(zk_client: KazooClient, zk_root: str) -> str:
    """An ephemeral candidate znode owned by zk_client's session."""
    return zk_client.create(candidate_path(zk_root), b"{}", ephemeral=True, makepath=True)


@pytest.fixture
def other_client(zk_server: ZooKeeperServer) -> Iterator[KazooClient]:
    """A second client with its own (short) session, playing the other replica."""
    client = KazooClient(zk_server.hosts, timeout=4)
    client.start(timeout=15)
    try:
        yield client
    finally:
        client.stop()
        client.close()


@pytest.fixture
def count_transactions(zk_client: KazooClient, monkeypatch: pytest.MonkeyPatch) -> Callable[[], int]:
    """Count the transactions zk_client commits from here on."""
    calls = []
    original = zk_client.transaction

    def transaction():
        calls.append(1)
        return original()

    monkeypatch.setattr(zk_client, "transaction", transaction)
    return lambda: len(calls)


def read_back(client: KazooClient, ledger: Ledger, name: str) -> tuple[bytes, int] | None:
    """An entry's raw data and version straight from ZooKeeper, or None if absent."""
    found = client.exists(ledger.entry_path(name))
    if found is None:
        return None
    data, stat = client.get(ledger.entry_path(name))
    return data, stat.version


# --------------------------------------------------------------------------
# Claim and load
# --------------------------------------------------------------------------


def test_claim_creates_a_new_entry(ledger: Ledger, fence: str) -> None:
    """Claiming an entry that has no znode creates it, and load returns that state at version 0."""
    result = ledger.claim([Claim("tick", state(1))], fence)

    assert result.error is None
    assert result.committed == {"tick": 0}
    assert ledger.load() == {"tick": LedgerRecord(state(1), 0)}
    assert ledger.load(["tick"]) == {"tick": LedgerRecord(state(1), 0)}


def test_claim_with_current_version_commits_and_bumps_it(ledger: Ledger, fence: str) -> None:
    """A claim at the version just read overwrites the state and yields the next version."""
    ledger.claim([Claim("tick", state(1))], fence)
    version = ledger.load()["tick"].version

    result = ledger.claim([Claim("tick", state(2), version)], fence)

    assert result.error is None
    assert result.committed == {"tick": 1}
    assert ledger.load() == {"tick": LedgerRecord(state(2), 1)}


def test_load_skips_missing_names_and_empty_ledger(zk_client: KazooClient, zk_root: str, ledger: Ledger) -> None:
    """load() of an empty or never-created ledger returns {}, and load(names) omits absent entries."""
    assert ledger.load() == {}
    assert ledger.load(["nope", "also-nope"]) == {}
    assert Ledger(zk_client, f"{zk_root}/never-created").load() == {}


def test_many_claims_commit_in_one_transaction(
    ledger: Ledger, fence: str, count_transactions: Callable[[], int]
) -> None:
    """Fifty claims go to ZooKeeper as a single transaction and all commit."""
    names = [f"entry-{i:02d}" for i in range(50)]

    result = ledger.claim([Claim(name, state(i)) for i, name in enumerate(names)], fence)

    assert result.error is None
    assert result.committed == {name: 0 for name in names}
    assert count_transactions() == 1
    assert ledger.load() == {name: LedgerRecord(state(i), 0) for i, name in enumerate(names)}


@pytest.mark.parametrize("interference", ["stale version", "created by someone else", "deleted by someone else"])
def test_one_conflict_rolls_back_the_whole_claim(
    zk_client: KazooClient, ledger: Ledger, fence: str, interference: str
) -> None:
    """If one of fifty claims conflicts, none of the fifty is written and the error names that entry."""
    names = [f"entry-{i:02d}" for i in range(50)]
    ledger.claim([Claim(name, state(i)) for i, name in enumerate(names) if name != "entry-37"], fence)
    victim = "entry-37"
    victim_version = 0
    if interference == "stale version":
        ledger.claim([Claim(victim, state(37))], fence)
        zk_client.set(ledger.entry_path(victim), encode_state(state(999)))  # now at version 1
    elif interference == "created by someone else":
        zk_client.create(ledger.entry_path(victim), encode_state(state(999)))
        victim_version = ABSENT  # we believe it does not exist yet
    else:
        victim_version = 0  # we believe it exists at version 0; it does not
    before = {name: read_back(zk_client, ledger, name) for name in names}

    claims = [Claim(name, state(100 + i), victim_version if name == victim else 0) for i, name in enumerate(names)]
    result = ledger.claim(claims, fence)

    assert isinstance(result.error, ClaimConflictError)
    assert result.error.names == [victim]
    assert victim in str(result.error)
    assert result.committed == {}
    assert {name: read_back(zk_client, ledger, name) for name in names} == before


# --------------------------------------------------------------------------
# The fence
# --------------------------------------------------------------------------


def test_claim_without_candidate_is_fenced(zk_client: KazooClient, ledger: Ledger, fence: str) -> None:
    """Once the candidate znode is gone a claim fails with FencedError and writes nothing."""
    ledger.claim([Claim("existing", state(1))], fence)
    zk_client.delete(fence)
    before = ledger.load()

    result = ledger.claim([Claim("existing", state(2), 0), Claim("new", state(3))], fence)

    assert isinstance(result.error, FencedError)
    assert "candidate (epoch 1) is gone" in str(result.error)  # named by its epoch, not its znode
    assert result.committed == {}
    assert ledger.load() == before
    assert read_back(zk_client, ledger, "new") is None


def test_claim_fenced_on_expired_session_candidate(
    zk_server: ZooKeeperServer, zk_client: KazooClient, other_client: KazooClient, zk_root: str, ledger: Ledger
) -> None:
    """A candidate whose owner's session expired on the server fences every claim made on it."""
    zombie_fence = other_client.create(candidate_path(zk_root, 7), b"{}", ephemeral=True, makepath=True)
    session_id, password = other_client.client_id

    expire_session_quietly(session_id, password, zk_server.hosts)
    result = ledger.claim([Claim("tick", state(1))], zombie_fence)

    assert isinstance(result.error, FencedError)
    assert result.committed == {}
    assert ledger.load() == {}


def test_zombie_claim_right_after_expiry_never_commits(
    zk_server: ZooKeeperServer, zk_client: KazooClient, other_client: KazooClient, zk_root: str
) -> None:
    """A replica that claims the moment its session is expired server-side never gets the claim committed."""
    zombie_fence = other_client.create(candidate_path(zk_root, 7), b"{}", ephemeral=True, makepath=True)
    zombie_ledger = Ledger(other_client, zk_root, timeout=10)
    zombie_ledger.ensure()
    session_id, password = other_client.client_id

    expire_session_quietly(session_id, password, zk_server.hosts)
    try:
        result = zombie_ledger.claim([Claim("tick", state(1))], zombie_fence)
    except (SessionExpiredError, ConnectionLoss, ConnectionClosedError):
        pass  # kazoo already knew the session was gone: nothing was sent
    else:
        assert isinstance(result.error, FencedError)
        assert result.committed == {}

    assert zk_client.exists(zombie_fence) is None
    assert Ledger(zk_client, zk_root).load() == {}


def test_zombie_fenced_after_reconnecting_with_a_new_session(
    zk_server: ZooKeeperServer, zk_client: KazooClient, other_client: KazooClient, zk_root: str
) -> None:
    """A replica whose session expired, and that kazoo reconnected with a new one, is fenced on its old candidate."""
    zombie_fence = other_client.create(candidate_path(zk_root, 7), b"{}", ephemeral=True, makepath=True)
    zombie_ledger = Ledger(other_client, zk_root, timeout=10)
    zombie_ledger.ensure()
    zombie_ledger.claim([Claim("tick", state(1))], zombie_fence)
    old_session = other_client.client_id[0]

    expire_session(other_client, zk_server.hosts)
    wait_for(
        lambda: other_client.connected and other_client.client_id and other_client.client_id[0] != old_session,
        message="the expired client never reconnected with a new session",
    )
    result = zombie_ledger.claim([Claim("tick", state(2), 0), Claim("other", state(3))], zombie_fence)

    assert isinstance(result.error, FencedError)
    assert result.committed == {}
    assert Ledger(zk_client, zk_root).load() == {"tick": LedgerRecord(state(1), 0)}


# --------------------------------------------------------------------------
# Size
# --------------------------------------------------------------------------


def test_thousands_of_long_names_are_chunked_and_all_commit(
    ledger: Ledger, fence: str, count_transactions: Callable[[], int]
) -> None:
    """3000 claims with 300-character names commit in several transactions and all load back."""
    names = [f"{i:04d}-" + "n" * 295 for i in range(3000)]
    assert all(len(name) == 300 for name in names)

    result = ledger.claim([Claim(name, state(i)) for i, name in enumerate(names)], fence)

    assert result.error is None
    assert result.committed == {name: 0 for name in names}
    assert count_transactions() > 1
    loaded = ledger.load()
    assert len(loaded) == 3000
    assert loaded == {name: LedgerRecord(state(i), 0) for i, name in enumerate(names)}


# --------------------------------------------------------------------------
# Data zkbeat did not write
# --------------------------------------------------------------------------

GARBAGE = {
    "binary": b"\xff\xfe\x00garbage",
    "empty": b"",
    "not json": b"definitely not json",
    "json list": b"[1, 2, 3]",
    "json string": b'"2024-05-01T12:00:00+00:00"',
    "empty object": b"{}",
    "last_run_at number": json.dumps({"last_run_at": 12345}).encode(),
    "last_run_at not a date": json.dumps({"last_run_at": "yesterday"}).encode(),
    "last_run_at naive": json.dumps({"last_run_at": "2024-05-01T12:00:00"}).encode(),
    "count as string": json.dumps({"last_run_at": "2024-05-01T12:00:00+00:00", "total_run_count": "3"}).encode(),
    "negative count": json.dumps({"last_run_at": "2024-05-01T12:00:00+00:00", "total_run_count": -1}).encode(),
    "epoch bool": json.dumps({"last_run_at": "2024-05-01T12:00:00+00:00", "epoch": True}).encode(),
    "updated_at number": json.dumps({"last_run_at": "2024-05-01T12:00:00+00:00", "updated_at": 7}).encode(),
    "slot list": json.dumps({"last_run_at": "2024-05-01T12:00:00+00:00", "slot": []}).encode(),
    # Valid JSON that Python's json cannot decode (RecursionError, not ValueError): Ledger.load raised it
    # out of every takeover's term, and each leader stepped down every three passes, publishing nothing.
    "nested past the recursion limit": b"[" * 100_000 + b"]" * 100_000,
    # No data at all, not even b"" (zkCli's `set <path>` of nothing, a Java client's null): AttributeError before.
    "null data": None,
    # A time whose zone puts it before year 1 or after 9999 in UTC: OverflowError, not ValueError, before, out
    # of Ledger.load and so out of every takeover's term.
    "last_run_at before year 1 in UTC": json.dumps({"last_run_at": "0001-01-01T00:00:00+01:00"}).encode(),
    "slot after 9999 in UTC": json.dumps(
        {"last_run_at": "2024-05-01T12:00:00+00:00", "slot": "9999-12-31T23:59:59-01:00"}
    ).encode(),
}


@pytest.mark.parametrize("garbage", list(GARBAGE.values()), ids=list(GARBAGE))
def test_unreadable_entry_is_logged_and_loads_as_no_state(
    zk_client: KazooClient, ledger: Ledger, fence: str, caplog: pytest.LogCaptureFixture, garbage: bytes | None
) -> None:
    """A znode holding data zkbeat cannot parse loads as state None (logged with its path) and can be overwritten."""
    ledger.claim([Claim("good-1", state(1)), Claim("good-2", state(2))], fence)
    bad_path = ledger.entry_path("bad")
    zk_client.create(bad_path, b"placeholder")
    plant(zk_client, bad_path, garbage)  # version 1
    caplog.set_level(logging.WARNING, logger="zkbeat.ledger.store")

    loaded = ledger.load()

    assert loaded == {
        "good-1": LedgerRecord(state(1), 0),
        "good-2": LedgerRecord(state(2), 0),
        "bad": LedgerRecord(None, 1),
    }
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING and r.name == "zkbeat.ledger.store"]
    assert [bad_path in r.getMessage() for r in warnings] == [True], [r.getMessage() for r in warnings]
    assert ledger.load(["bad"]) == {"bad": LedgerRecord(None, 1)}

    result = ledger.claim([Claim("bad", state(3), loaded["bad"].version)], fence)

    assert result.error is None
    assert result.committed == {"bad": 2}
    assert ledger.load(["bad"]) == {"bad": LedgerRecord(state(3), 2)}


# --------------------------------------------------------------------------
# Names
# --------------------------------------------------------------------------

ODD_NAMES = [
    "a/b",
    "/leading/and/trailing/",
    "//",
    "unicode é ñ 日本語 🎉",
    "with spaces  and\ttabs",
    ".",
    "..",
    "...",
    "%2E",
    "100%",
    "zookeeper",
    "x" * 1000,
    "é" * 1000,
]


def test_odd_names_round_trip(zk_client: KazooClient, ledger: Ledger, fence: str) -> None:
    """Names with '/', unicode, spaces, '.', '..', '%' and 1000 characters survive claim and load."""
    claims = [Claim(name, state(i)) for i, name in enumerate(ODD_NAMES)]

    result = ledger.claim(claims, fence)

    assert result.error is None
    assert result.committed == {name: 0 for name in ODD_NAMES}
    expected = {name: LedgerRecord(state(i), 0) for i, name in enumerate(ODD_NAMES)}
    assert ledger.load() == expected
    assert ledger.load(ODD_NAMES) == expected
    assert len(zk_client.get_children(ledger.path)) == len(ODD_NAMES)  # one znode per name, no nesting

    again = ledger.claim([Claim(name, state(50 + i), 0) for i, name in enumerate(ODD_NAMES)], fence)
    assert again.error is None
    assert ledger.load() == {name: LedgerRecord(state(50 + i), 1) for i, name in enumerate(ODD_NAMES)}

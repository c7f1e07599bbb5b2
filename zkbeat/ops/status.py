"""Read a zkbeat cluster's state from ZooKeeper: who leads, who waits, what ran.

Read-only, for the ``zkbeat`` command and for scripts; nothing here takes part
in the election.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime, timezone
from typing import Any

from kazoo.client import KazooClient
from kazoo.exceptions import NoAuthError, NoNodeError

from .._decode import json_object
from ..coordination import shards as _shards
from ..coordination.candidates import CandidateReader
from ..coordination.layout import LAYOUT_DIR
from ..ledger.controls import pending_requests
from ..ledger.history import shown
from ..ledger.store import Ledger, LedgerRecord
from ..ticking.ticks import slot_after

__all__ = [
    "Candidate",
    "EntryStatus",
    "ClusterStatus",
    "ShardStatus",
    "NotAZkbeatRoot",
    "read_status",
    "read_election",
    "read_entry",
    "read_shards",
    "read_unready",
    "read_marks",
    "UnreadyMark",
    "place_marks",
]

logger = logging.getLogger(__name__)


class NotAZkbeatRoot(Exception):
    """The root holds no zkbeat layout this release can read."""


@dataclass
class Candidate:
    #: Its place in the election (the candidate's sequence number).
    sequence: int
    znode: str
    #: The epoch it leads under; None unless it leads (it has begun its term).
    epoch: int | None = None
    identity: str | None = None
    host: str | None = None
    pid: int | None = None
    started_at: str | None = None
    version: str | None = None
    #: The zkbeat layout it reads (zkbeat.coordination.layout); 1 for a release that does not say.
    layout: int | None = None
    leader_since: str | None = None
    readable: bool = True
    #: With ``zkbeat_shards`` > 1: its replica id, and why it cannot lead now if it said so (``<root>/v1/unready``).
    replica: str | None = None
    unready: str | None = None


@dataclass
class UnreadyMark:
    """A replica's mark under ``<root>/v1/unready``: it said it cannot lead now (zkbeat.coordination.shards)."""

    replica: str
    why: str
    #: When it marked itself (ISO 8601, UTC); None if the mark does not say.
    since: str | None = None
    #: Who it is, as its mark says, or (a mark of an earlier release) its candidate in a line.
    identity: str | None = None
    host: str | None = None
    pid: int | None = None
    #: Whether it is in any shard's line; out of every line for a while after it stepped aside.
    in_line: bool = False


@dataclass
class EntryStatus:
    name: str
    last_run_at: str | None
    total_run_count: int | None
    epoch: int | None
    slot: str | None
    next_due: str | None = None
    readable: bool = True
    #: {by, at, note} while an operator has the entry paused (zkbeat.ledger.controls).
    paused: dict[str, Any] | None = None
    #: The last trigger request run for the entry.
    manual: str | None = None
    #: Its recent runs, newest first (zkbeat.ledger.history.Run.as_dict).
    recent_runs: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class ShardStatus:
    """One shard's election (``zkbeat_shards`` > 1): its line and who leads it."""

    shard: int
    count: int
    election: str
    candidates: list[Candidate] = field(default_factory=list)
    strangers: list[str] = field(default_factory=list)
    #: Entries of the schedule or the ledger that belong to this shard.
    entries: int = 0

    @property
    def head(self) -> Candidate | None:
        return self.candidates[0] if self.candidates else None

    @property
    def leader_announced(self) -> bool:
        return self.head is not None and self.head.leader_since is not None

    @property
    def leader(self) -> Candidate | None:
        return self.head if self.leader_announced else None

    def as_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["leader"] = asdict(self.leader) if self.leader else None
        data["head"] = asdict(self.head) if self.head else None
        return data


@dataclass
class ClusterStatus:
    root: str
    hosts: str
    #: Real candidates only, in election order (strangers are never ranked).
    candidates: list[Candidate] = field(default_factory=list)
    entries: list[EntryStatus] = field(default_factory=list)
    #: Children of the election that are not candidates: "<znode>: <why>".
    strangers: list[str] = field(default_factory=list)
    #: Run-now requests no leader has taken yet (zkbeat.ledger.controls.pending_requests).
    pending: list[dict[str, Any]] = field(default_factory=list)
    #: With ``zkbeat_shards`` > 1: each shard's election (``candidates`` then lists
    #: each replica once, in shard 0's order, and no one of them is "the" leader).
    shards: list[ShardStatus] = field(default_factory=list)
    #: Every replica marked unready (``<root>/v1/unready``), in a line or not, oldest mark first.
    unready: list[UnreadyMark] = field(default_factory=list)

    @property
    def head(self) -> Candidate | None:
        """The head of the election: the lowest real candidate (it leads, or is about to, or is stuck)."""
        return self.candidates[0] if self.candidates else None

    @property
    def leader(self) -> Candidate | None:
        """The head, once it has said it leads: its term began and ran a whole pass."""
        return self.head if self.leader_announced else None

    @property
    def leader_announced(self) -> bool:
        """Whether the head has said it leads (the election node names it)."""
        return self.head is not None and self.head.leader_since is not None

    @property
    def sharded(self) -> bool:
        return bool(self.shards)

    def as_dict(self) -> dict[str, Any]:
        data = asdict(self)
        if self.sharded:
            data["leader"] = data["head"] = None
            data["shards"] = [shard.as_dict() for shard in self.shards]
            return data
        data["leader"] = asdict(self.leader) if self.leader else None
        data["head"] = asdict(self.head) if self.head else None
        return data


def read_status(
    client: KazooClient, root: str, hosts: str, schedule: dict[str, Any] | None = None, shards: int = 1
) -> ClusterStatus:
    """Candidates in election order and ledger entries, with next due times.

    ``schedule`` maps entry names to Celery ``ScheduleEntry`` objects (from
    the app's ``beat_schedule``); without it next due times are unknown.
    ``shards`` is the app's ``zkbeat_shards``: above 1, each shard's election
    is read (``ClusterStatus.shards``).
    """
    base = _check_root(client, root, hosts)
    status = ClusterStatus(root=root, hosts=hosts)
    if shards == 1:
        status.candidates, status.strangers = read_election(client, f"{base}/election")
        if not status.candidates:
            # Asked without the app's settings (--hosts/--root), or with zkbeat_shards unset:
            # replicas that run with shards are found where they are.
            shards = _shards_in_use(client, base) or 1
    if shards > 1:  # with one shard no replica marks itself: what is there is someone else's
        marks = read_marks(client, root)
        status.shards = read_shards(client, root, shards, marks)
        status.candidates = _replicas(status.shards)
        status.strangers = [stranger for shard in status.shards for stranger in shard.strangers]
        status.unready = _placed(marks, status.candidates)
    status.pending = pending_requests(client, root)
    records = Ledger(client, root).load()
    now = datetime.now(timezone.utc)
    for name in sorted(set(records) | set(schedule or {})):
        record = records.get(name)
        state = record.state if record else None
        entry = EntryStatus(
            name=name,
            last_run_at=state.last_run_at.isoformat() if state else None,
            total_run_count=state.total_run_count if state else None,
            epoch=state.epoch if state else None,
            slot=state.slot.isoformat() if state and state.slot else None,
            readable=record is None or state is not None,
            paused=state.paused.as_dict() if state and state.paused else None,
            manual=state.manual if state else None,
            recent_runs=shown(state.recent) if state else [],
        )
        scheduled = (schedule or {}).get(name)
        if scheduled is not None:
            entry.next_due = _next_due(scheduled, state.last_run_at if state else None, now)
        status.entries.append(entry)
    key = _shards.shard_root(hosts, root)
    for shard in status.shards:
        shard.entries = sum(1 for e in status.entries if _shards.shard_of(key, e.name, shards) == shard.shard)
    return status


def read_entry(client: KazooClient, root: str, hosts: str, name: str) -> LedgerRecord | None:
    """One entry's ledger record (its state None if unreadable, its recent runs with it); None if it has none.

    The one reader of an entry's recent runs (zkbeat.ledger.history) for ``zkbeat
    history`` and ``zkbeat next``; the dashboard's model reads the same
    records with watches and decodes them with the same code.
    """
    _check_root(client, root, hosts)
    return Ledger(client, root).load([name]).get(name)


def _check_root(client: KazooClient, root: str, hosts: str) -> str:
    """``<root>/v1``, or NotAZkbeatRoot saying what is there instead."""
    base = f"{root.rstrip('/')}/{LAYOUT_DIR}"
    if client.exists(base) is None:
        if client.exists(root) is None:
            raise NotAZkbeatRoot(f"{root} does not exist on {hosts}")
        children = client.get_children(root)
        raise NotAZkbeatRoot(
            f"{root} is not a zkbeat root this release can read (no {LAYOUT_DIR}/; children: "
            f"{', '.join(sorted(children)[:10]) or 'none'})"
        )
    return base


def read_election(client: KazooClient, path: str) -> tuple[list[Candidate], list[str]]:
    """The real candidates in election order, and the strangers ("<znode>: <why>")."""
    line = CandidateReader(client, path).read()
    announced = _announcement(client, path)
    found = []
    for node in line.candidates:
        candidate = Candidate(sequence=node.sequence, znode=node.path, readable=node.readable)
        info = node.data
        for key in ("identity", "host", "started_at", "version", "leader_since"):
            value = info.get(key)
            setattr(candidate, key, str(value) if value is not None else None)
        pid = info.get("pid")
        candidate.pid = pid if isinstance(pid, int) and not isinstance(pid, bool) else None
        replica = info.get(_shards.REPLICA_KEY)
        candidate.replica = replica if isinstance(replica, str) else None
        layout = info.get("layout", 1)
        candidate.layout = layout if isinstance(layout, int) and not isinstance(layout, bool) else None
        if announced.get("leader") == node.name and announced.get("leader_since") is not None:
            candidate.leader_since = str(announced["leader_since"])
        if not found and candidate.leader_since is not None:
            # Only the head can lead, and only under the node it heads with: a
            # candidate behind it has never led (a step-down makes a new node).
            candidate.epoch = node.sequence
        found.append(candidate)
    return found, [f"{s.path}: {s.reason}" for s in line.strangers]


def _announcement(client: KazooClient, path: str) -> dict[str, Any]:
    """The election node's data: which candidate leads and since when (see LeaderElection).

    Earlier builds wrote ``leader_since`` into the candidate itself, which
    the loop above still reads.
    """
    try:
        raw, _ = client.get(path)
        return json_object(raw, empty_ok=True)
    except (NoNodeError, ValueError):
        return {}


def _next_due(entry: Any, last_run_at: datetime | None, now: datetime) -> str | None:
    """When the entry is due next, as its leader will call it: the slot after its last run (or now, if overdue).

    The slot itself, not now plus the time left: that sum is a few
    microseconds short, and a crontab due at 18:39:00 would read 18:38:59.
    """
    try:
        if last_run_at is not None:
            entry.last_run_at = last_run_at
        return max(slot_after(entry, entry.last_run_at), now).isoformat()
    except Exception:  # noqa: BLE001 - a schedule we cannot evaluate shows as unknown
        return None


def read_shards(
    client: KazooClient, root: str, shards: int, marks: dict[str, UnreadyMark] | None = None
) -> list[ShardStatus]:
    """Each shard's election: its line, strangers and announced leader (zkbeat.coordination.shards).

    ``marks`` are the unready marks (:func:`read_marks`), read here if not given.
    """
    found = []
    unready = read_marks(client, root) if marks is None else marks
    for shard in range(shards):
        path = _shards.election_path(root.rstrip("/"), shard, shards)
        candidates, strangers = read_election(client, path)
        for candidate in candidates:
            mark = unready.get(candidate.replica or "")
            candidate.unready = mark.why if mark is not None else None
        found.append(ShardStatus(shard, shards, path, candidates, strangers))
    return found


def read_unready(client: KazooClient, root: str, watch: Any = None) -> dict[str, str]:
    """Replica id -> why, for each replica that said it cannot lead now (:func:`read_marks`, reasons only)."""
    return {replica: mark.why for replica, mark in read_marks(client, root, watch).items()}


def read_marks(client: KazooClient, root: str, watch: Any = None) -> dict[str, UnreadyMark]:
    """Replica id -> its mark, for each replica that said it cannot lead now (zkbeat.coordination.shards.unready_path).

    Every mark, in a line or not (``in_line`` is left False: :func:`read_status` places them). A child not
    named like a replica id is a stranger's, left out. What is unreadable or malformed in a mark says
    "unknown" (its reason) or None: the mark itself is what counts. ``watch`` is set on the listing (or on
    its creation, while there is none).
    """
    path = _shards.unready_path(root.rstrip("/"))
    try:
        marked = _shards.list_unready(client, path, watch=watch)
    except NoAuthError:
        return {}
    requests = [(replica, client.get_async(f"{path}/{replica}")) for replica in sorted(marked)]  # one round trip
    found = {}
    for replica, request in requests:
        try:
            raw, _ = request.get()
        except (NoNodeError, NoAuthError):
            continue
        found[replica] = _mark(replica, _mark_data(raw))
    return found


def _mark_data(raw: bytes | None) -> dict[str, Any]:
    """A mark's JSON object, or {} for anything else a stranger may leave there.

    No data at all (None: zkCli's ``create <path>``, a Java client's null),
    not UTF-8, not JSON, JSON nested past the recursion limit, not an object:
    each reads as a mark that says nothing, never as an error of the report.
    """
    try:
        return json_object(raw, empty_ok=True)
    except ValueError:
        return {}


def _mark(replica: str, data: dict[str, Any]) -> UnreadyMark:
    """A mark's JSON ({why, since, identity, host, pid}; earlier releases wrote why and since), read leniently.

    ``why`` is cut to MAX_WHY characters as zkbeat writes it: an older release or a stranger may have left
    one of up to 1 MiB, which would flood the report and the dashboard.
    """
    why, since, pid = data.get("why"), data.get("since"), data.get("pid")
    stamp = None
    if isinstance(since, (int, float)) and not isinstance(since, bool):
        try:
            stamp = datetime.fromtimestamp(since, timezone.utc).isoformat()
        except (OverflowError, OSError, ValueError):
            stamp = None
    identity, host = data.get("identity"), data.get("host")
    return UnreadyMark(
        replica=replica,
        why=_shards.cap_why(why) if isinstance(why, str) else "unknown",  # any writer's: cut to MAX_WHY
        since=stamp,
        identity=identity if isinstance(identity, str) else None,
        host=host if isinstance(host, str) else None,
        pid=pid if isinstance(pid, int) and not isinstance(pid, bool) else None,
    )


def _placed(marks: dict[str, UnreadyMark], candidates: list[Candidate]) -> list[UnreadyMark]:
    """:func:`place_marks` with the replicas of ``candidates`` in line."""
    return place_marks(marks, {c.replica: (c.identity, c.host, c.pid) for c in candidates if c.replica is not None})


def place_marks(
    marks: Mapping[str, UnreadyMark], in_line: Mapping[str, tuple[str | None, str | None, int | None]]
) -> list[UnreadyMark]:
    """The marks, oldest first, each said to be in a line or not (copies: ``marks`` may be someone's cache).

    ``in_line`` maps each replica id in some shard's line to its (identity, host, pid): who a replica is
    when its mark does not say (an earlier release's mark).
    """
    placed = []
    for mark in marks.values():
        who = in_line.get(mark.replica)
        mark = replace(mark, in_line=who is not None)
        if who is not None and mark.identity is None:
            mark.identity, mark.host, mark.pid = who
        placed.append(mark)
    return sorted(placed, key=lambda m: (m.since is None, m.since or "", m.replica))


def _shards_in_use(client: KazooClient, base: str) -> int | None:
    """The shard count whose elections hold candidates (the most, if replicas run with several), or None."""
    try:
        counts = [int(child) for child in client.get_children(f"{base}/shards") if child.isdigit()]
    except NoNodeError:
        return None
    best, most = None, 0
    denied: NoAuthError | None = None
    for count in sorted(counts):
        if count < 2:
            continue
        try:
            found = len(client.get_children(f"{base}/shards/{count}/0/election"))
        except NoNodeError:
            continue
        except NoAuthError as exc:
            denied = exc  # a stranger's, or the cluster's own made with credentials this client lacks
            continue
        if found > most:
            best, most = count, found
    if best is None and denied is not None:
        raise denied  # none readable: the caller says to pass the app's credentials (-A)
    return best


def _replicas(shards: list[ShardStatus]) -> list[Candidate]:
    """Each replica once (by identity and pid), in the order of shard 0's line, then of the others'."""
    seen: dict[tuple[str | None, int | None, str | None], Candidate] = {}
    for shard in shards:
        for candidate in shard.candidates:
            key = (candidate.identity, candidate.pid, candidate.host)
            if key not in seen:
                seen[key] = Candidate(
                    sequence=candidate.sequence,
                    znode=candidate.znode,
                    identity=candidate.identity,
                    host=candidate.host,
                    pid=candidate.pid,
                    started_at=candidate.started_at,
                    version=candidate.version,
                    layout=candidate.layout,
                    readable=candidate.readable,
                    replica=candidate.replica,
                    unready=candidate.unready,
                )
    return list(seen.values())

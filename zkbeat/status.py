"""Read a zkbeat cluster's state from ZooKeeper: who leads, who waits, what ran.

Read-only, for the ``zkbeat`` command and for scripts; nothing here takes part
in the election.
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from typing import Any

from kazoo.client import KazooClient
from kazoo.exceptions import NoNodeError

from .candidates import CandidateReader
from .layout import LAYOUT_DIR
from .ledger import Ledger

__all__ = ["Candidate", "EntryStatus", "ClusterStatus", "NotAZkbeatRoot", "read_status", "read_election"]

logger = logging.getLogger(__name__)


class NotAZkbeatRoot(Exception):
    """The root holds no zkbeat layout this release can read."""


@dataclass
class Candidate:
    epoch: int
    znode: str
    identity: str | None = None
    host: str | None = None
    pid: int | None = None
    started_at: str | None = None
    version: str | None = None
    leader_since: str | None = None
    readable: bool = True


@dataclass
class EntryStatus:
    name: str
    last_run_at: str | None
    total_run_count: int | None
    epoch: int | None
    slot: str | None
    next_due: str | None = None
    readable: bool = True
    #: {by, at, note} while an operator has the entry paused (zkbeat.controls).
    paused: dict[str, Any] | None = None
    #: The last trigger request run for the entry.
    manual: str | None = None


@dataclass
class ClusterStatus:
    root: str
    hosts: str
    #: Real candidates only, in election order (strangers are never ranked).
    candidates: list[Candidate] = field(default_factory=list)
    entries: list[EntryStatus] = field(default_factory=list)
    #: Children of the election that are not candidates: "<znode>: <why>".
    strangers: list[str] = field(default_factory=list)

    @property
    def leader(self) -> Candidate | None:
        """The head of the election: the lowest real candidate (it leads, or is about to)."""
        return self.candidates[0] if self.candidates else None

    @property
    def leader_announced(self) -> bool:
        """Whether the head has said it leads (the election node names it)."""
        return self.leader is not None and self.leader.leader_since is not None

    def as_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["leader"] = asdict(self.leader) if self.leader else None
        return data


def read_status(client: KazooClient, root: str, hosts: str, schedule: dict[str, Any] | None = None) -> ClusterStatus:
    """Candidates in election order and ledger entries, with next due times.

    ``schedule`` maps entry names to Celery ``ScheduleEntry`` objects (from
    the app's ``beat_schedule``); without it next due times are unknown.
    """
    base = f"{root.rstrip('/')}/{LAYOUT_DIR}"
    if client.exists(base) is None:
        if client.exists(root) is None:
            raise NotAZkbeatRoot(f"{root} does not exist on {hosts}")
        children = client.get_children(root)
        raise NotAZkbeatRoot(
            f"{root} is not a zkbeat root this release can read (no {LAYOUT_DIR}/; children: "
            f"{', '.join(sorted(children)[:10]) or 'none'})"
        )
    status = ClusterStatus(root=root, hosts=hosts)
    status.candidates, status.strangers = read_election(client, f"{base}/election")
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
        )
        scheduled = (schedule or {}).get(name)
        if scheduled is not None:
            entry.next_due = _next_due(scheduled, state.last_run_at if state else None, now)
        status.entries.append(entry)
    return status


def read_election(client: KazooClient, path: str) -> tuple[list[Candidate], list[str]]:
    """The real candidates in election order, and the strangers ("<znode>: <why>")."""
    line = CandidateReader(client, path).read()
    announced = _announcement(client, path)
    found = []
    for node in line.candidates:
        candidate = Candidate(epoch=node.sequence, znode=node.path, readable=node.readable)
        info = node.data
        for key in ("identity", "host", "started_at", "version", "leader_since"):
            value = info.get(key)
            setattr(candidate, key, str(value) if value is not None else None)
        pid = info.get("pid")
        candidate.pid = pid if isinstance(pid, int) and not isinstance(pid, bool) else None
        if announced.get("leader") == node.name and announced.get("leader_since") is not None:
            candidate.leader_since = str(announced["leader_since"])
        found.append(candidate)
    return found, [f"{s.path}: {s.reason}" for s in line.strangers]


def _announcement(client: KazooClient, path: str) -> dict[str, Any]:
    """The election node's data: which candidate leads and since when (see LeaderElection).

    Earlier builds wrote ``leader_since`` into the candidate itself, which
    the loop above still reads.
    """
    try:
        raw, _ = client.get(path)
        data = json.loads(raw.decode("utf-8") or "{}")
    except (NoNodeError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _next_due(entry: Any, last_run_at: datetime | None, now: datetime) -> str | None:
    try:
        if last_run_at is not None:
            entry.last_run_at = last_run_at
        remaining = entry.schedule.remaining_estimate(entry.last_run_at)
        return (now + max(remaining, now - now)).isoformat()
    except Exception:  # noqa: BLE001 - a schedule we cannot evaluate shows as unknown
        return None

"""The one reader of an election's candidates: who is in line, in order, and what they say.

Used by the election itself, by the leader's peer checks and by ``zkbeat
status``, so all three agree on who counts. A child of the election path
counts as a candidate only if zkbeat could have made it: named
``candidate-<32 hex guid>-<10 digit sequence>`` and ephemeral. Anything else
is a stranger's znode (written by hand, by a tool, by a buggy client): it is
logged once and never ranked, so it can neither lead nor be waited on. A
persistent lookalike sorting first would otherwise stall the election for
ever, since it never goes away on its own.

Ephemerality is in the znode's stat, which ``get_children`` does not give
per child, so every child is read with pipelined gets (all sent before the
first reply is awaited: one round trip however long the line). The data is
decoded tolerantly: JSON that is not an object is logged once and the
candidate is kept with ``readable=False``; it still ranks, since its owner
is a live session in line.

A child whose ACL denies this client READ is judged by what needs no
permission: its name, and its stat from ``exists``. Named as zkbeat names
candidates and ephemeral, it is a candidate this replica cannot identify:
most likely a replica whose ``zkbeat_auth`` differs (a credential being
turned on or rotated, each replica's candidate granting only the identity
that made it). It keeps its place in line, unreadable, logged once at
ERROR naming ``zkbeat_auth``: were it skipped, the replica behind it would
lead while it leads too. Anything else unreadable (another name, or
persistent) is a stranger, as above, so another ZooKeeper user's unreadable
znode stops nobody. Without ``zkbeat_auth`` anyone may create children of
the election, so a stranger's ephemeral candidate-named node that denies
READ holds its place as long as its session lives; with it, only holders
of the credential may create there (zkbeat.coordination._zookeeper), and a rotation
that gives every replica both credentials (docs/operating.md) leaves no
candidate unreadable at any time.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kazoo.client import KazooClient
from kazoo.exceptions import NoAuthError, NoNodeError
from kazoo.protocol.states import WatchedEvent

from .._decode import json_object

__all__ = ["PREFIX", "CandidateNode", "Stranger", "Line", "CandidateReader", "parse_name"]

logger = logging.getLogger(__name__)

#: What every candidate's name starts with; ZooKeeper appends the sequence.
PREFIX = "candidate-"
_NAME = re.compile(r"^candidate-([0-9a-f]{32})-([0-9]{10})$")


def parse_name(name: str) -> tuple[str, int] | None:
    """(guid, sequence) of a name zkbeat makes, else None."""
    match = _NAME.match(name)
    return (match.group(1), int(match.group(2))) if match else None


@dataclass(frozen=True)
class CandidateNode:
    """One real candidate: an ephemeral znode named as zkbeat names them."""

    name: str
    path: str
    guid: str
    sequence: int
    #: The session that owns the ephemeral node (its stat's ephemeralOwner).
    owner: int
    data: dict[str, Any] = field(default_factory=dict, compare=False)
    readable: bool = True


@dataclass(frozen=True)
class Stranger:
    """A child of the election path that is not a candidate, and why."""

    name: str
    path: str
    reason: str


@dataclass(frozen=True)
class Line:
    """The election's line: real candidates, lowest sequence (the head) first."""

    candidates: tuple[CandidateNode, ...] = ()
    strangers: tuple[Stranger, ...] = ()

    @property
    def head(self) -> CandidateNode | None:
        return self.candidates[0] if self.candidates else None

    def find(self, name: str) -> int | None:
        """The place of candidate ``name`` in line (0 = head), or None."""
        for place, candidate in enumerate(self.candidates):
            if candidate.name == name:
                return place
        return None


class CandidateReader:
    """Reads one election path's line; remembers what it has logged.

    Each stranger and each unreadable candidate is logged once per reader
    (per znode name while it stays), not on every read. Not thread-safe: one
    reader per thread of use.
    """

    def __init__(self, client: KazooClient, path: str, timeout: float = 10.0) -> None:
        self.client = client
        self.path = path.rstrip("/")
        self.timeout = timeout
        self._logged: set[str] = set()

    def read(self, watch: Callable[[WatchedEvent], None] | None = None) -> Line:
        """The line as ZooKeeper has it now; empty if the election path does not exist.

        ``watch`` is set on the children listing (one-shot, as kazoo's).
        Raises ConnectionLoss and the like.
        """
        try:
            children = self.client.get_children(self.path, watch=watch)
        except NoNodeError:
            return Line()
        requests = [(child, self.client.get_async(f"{self.path}/{child}")) for child in children]
        candidates: list[CandidateNode] = []
        strangers: list[Stranger] = []
        unreadable: list[tuple[str, Any]] = []
        for child, request in requests:
            try:
                raw, stat = request.get(timeout=self.timeout)
            except NoNodeError:
                continue  # left between the listing and the read
            except NoAuthError:
                unreadable.append((child, self.client.exists_async(f"{self.path}/{child}")))
                continue
            path = f"{self.path}/{child}"
            parsed = parse_name(child)
            if parsed is None:
                strangers.append(Stranger(child, path, "its name is not one zkbeat makes"))
                continue
            if not stat.ephemeralOwner:
                strangers.append(Stranger(child, path, "it is not ephemeral"))
                continue
            data, readable = _decode(raw)
            if not readable:
                self._once(path, "zkbeat: candidate %s holds data zkbeat cannot read; it keeps its place", path)
            candidates.append(CandidateNode(child, path, parsed[0], parsed[1], stat.ephemeralOwner, data, readable))
        for child, request in unreadable:
            stat = request.get(timeout=self.timeout)
            if stat is None:
                continue  # left between the read and the exists
            path = f"{self.path}/{child}"
            parsed = parse_name(child)
            if parsed is not None and stat.ephemeralOwner:
                # A candidate we cannot identify (another zkbeat_auth): it keeps its place.
                self._once(
                    path,
                    "zkbeat: candidate %s (session 0x%x) may not be read with this replica's credentials (NoAuth): "
                    "a replica whose zkbeat_auth differs from this one's; it keeps its place in line, unidentified, "
                    "and is waited on. Give every replica the same zkbeat_auth (while rotating it, both "
                    "credentials: see docs/operating.md)",
                    path,
                    stat.ephemeralOwner,
                    level=logging.ERROR,
                )
                candidates.append(CandidateNode(child, path, parsed[0], parsed[1], stat.ephemeralOwner, {}, False))
                continue
            owner = f", held by session 0x{stat.ephemeralOwner:x}" if stat.ephemeralOwner else ""
            why = f"zkbeat may not read it (NoAuth: its ACL does not grant this replica's credentials{owner})"
            strangers.append(Stranger(child, path, why))
        for stranger in strangers:
            self._once(
                stranger.path,
                "zkbeat: ignoring %s in the election: %s, so it is never led by nor waited on",
                stranger.path,
                stranger.reason,
            )
        present = {f"{self.path}/{child}" for child in children}
        self._logged &= present
        candidates.sort(key=lambda c: (c.sequence, c.name))
        strangers.sort(key=lambda s: s.name)
        return Line(tuple(candidates), tuple(strangers))

    def _once(self, path: str, message: str, *args: Any, level: int = logging.WARNING) -> None:
        if path not in self._logged:
            self._logged.add(path)
            logger.log(level, message, *args)


def _decode(raw: bytes | None) -> tuple[dict[str, Any], bool]:
    """Candidate data as a dict, and whether it could be read (empty data reads as {})."""
    try:
        return json_object(raw, empty_ok=True), True
    except ValueError:
        return {}, False

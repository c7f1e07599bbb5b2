"""Helpers the fault tests and the chaos driver share: who leads, and where.

They look at ZooKeeper from outside, as an operator would: the election's
candidates (lowest sequence leads; its ephemeral owner is the leader's
session) and the ensemble members' ``cons`` output (which member holds which
session).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import datetime

from kazoo.client import KazooClient
from kazoo.exceptions import NoNodeError

from tests.support.helpers import wait_for
from tests.support.servers import ZooKeeperEnsemble, ZooKeeperServer
from zkbeat.coordination.election import sorted_candidates
from zkbeat.ledger.store import LAYOUT_VERSION, Ledger

__all__ = ["candidates", "leader_session", "member_holding", "ledger_slots", "wait_until_watched"]


def candidates(client: KazooClient, root: str) -> list[tuple[str, dict, int]]:
    """(name, data, ephemeral owner) of each candidate, in election order."""
    path = f"{root}/{LAYOUT_VERSION}/election"
    try:
        children = sorted_candidates(client.get_children(path))
    except NoNodeError:
        return []
    found = []
    for child in children:
        try:
            raw, stat = client.get(f"{path}/{child}")
        except NoNodeError:
            continue
        found.append((child, json.loads(raw or b"{}"), stat.ephemeralOwner))
    return found


def wait_until_watched(
    client: KazooClient, root: str, pid: int, log: Callable[[], str], timeout: float = 30, election: str | None = None
) -> None:
    """Wait until a follower's ``log`` says it watches the liveness of the candidate of process ``pid``.

    Before its first verified connection a refused dial proves nothing (a
    firewall that rejects looks the same), so a kill that comes earlier is
    seen only when the session ends. Replicas of tests/support/beatapp.py log
    the line (at DEBUG). ``election``: the path of another election than the
    root's (a shard's, zkbeat.coordination.shards.election_path).
    """
    path = election or f"{root}/{LAYOUT_VERSION}/election"
    name = next(name for name, data in _line(client, path) if data.get("pid") == pid)
    line = f"watching the liveness of {path}/{name} at "
    wait_for(lambda: line in log(), timeout=timeout, message=lambda: f"no {line!r} in\n{log()}")


def _line(client: KazooClient, path: str) -> list[tuple[str, dict]]:
    """(name, data) of each candidate of the election at ``path``, in election order."""
    found = []
    for child in sorted_candidates(client.get_children(path)):
        try:
            raw, _ = client.get(f"{path}/{child}")
        except NoNodeError:
            continue
        found.append((child, json.loads(raw or b"{}")))
    return found


def leader_session(client: KazooClient, root: str) -> tuple[str, int] | None:
    """(identity, session id) of the candidate that leads, if any."""
    line = candidates(client, root)
    if not line:
        return None
    _, data, owner = line[0]
    return data.get("identity", "?"), owner


def member_holding(ensemble: ZooKeeperEnsemble, session_id: int) -> ZooKeeperServer | None:
    """The ensemble member the client of ``session_id`` is connected to."""
    needle = f"sid=0x{session_id:x}"
    for member in ensemble.members:
        if not member.running:
            continue
        try:
            if needle in member.four_letter("cons"):
                return member
        except OSError:
            continue
    return None


def ledger_slots(client: KazooClient, root: str) -> dict[str, datetime]:
    """Each entry's last claimed slot, as the ledger holds it now."""
    return {
        name: record.state.slot
        for name, record in Ledger(client, root).load().items()
        if record.state is not None and record.state.slot is not None
    }

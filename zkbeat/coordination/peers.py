"""What a leader checks about the other replicas: their layout and their schedule.

Rolling upgrades mix releases. The ZooKeeper layout carries a version
(``<root>/v1/...``) so that no release misreads another's data; this module
is what makes a replica act on it:

* A replica that finds a **newer layout** than its own refuses to lead. Newer
  means a ``<root>/v<N>`` with N above ours (a newer release's ledger or
  election), or a candidate in our own election whose data says
  ``"layout": N`` (a newer release queueing in our line to take over). Two
  layouts each with a leader would publish every tick twice, and this release
  cannot know what a newer ledger records, so it steps aside and says why.
* A candidate whose **schedule** differs from the leader's (its
  ``schedule_hash``) is reported in the leader's log, once per candidate: the
  replicas disagree about what should run, and only the leader's view counts.

The checks read ZooKeeper when the leader takes over and again whenever the
root's children or the election's candidates change (one-shot watches that
only set a flag, re-armed by the next check).
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import threading
from collections.abc import Mapping
from typing import Any

from kazoo.client import KazooClient
from kazoo.exceptions import NoNodeError
from kazoo.protocol.states import WatchedEvent

from .candidates import CandidateReader
from .layout import LAYOUT

__all__ = ["LAYOUT", "PeerCheck", "schedule_hash", "layout_of"]

logger = logging.getLogger(__name__)

_LAYOUT_CHILD = re.compile(r"^v(\d+)$")


def layout_of(child: str) -> int | None:
    """The layout number of a root child named ``v<N>``, else None."""
    match = _LAYOUT_CHILD.match(child)
    return int(match.group(1)) if match else None


def schedule_hash(schedule: Mapping[str, Any]) -> str:
    """A short, stable digest of what a schedule runs and when.

    Built from each entry's name, task, schedule, args, kwargs and options, in
    name order, so replicas with the same ``beat_schedule`` agree on it and a
    changed interval, task or argument changes it.
    """
    parts = []
    for name in sorted(schedule):
        entry = schedule[name]
        parts.append(
            [
                name,
                getattr(entry, "task", None),
                repr(getattr(entry, "schedule", None)),
                getattr(entry, "args", None),
                getattr(entry, "kwargs", None),
                getattr(entry, "options", None),
            ]
        )
    text = json.dumps(parts, sort_keys=True, default=repr)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


class PeerCheck:
    """The leader's view of its peers; call :meth:`check` from the beat loop.

    Not thread-safe: one caller (beat's main thread). The watch callbacks run
    on kazoo's thread and only set a flag.
    """

    def __init__(
        self, client: KazooClient, root: str, election_path: str, own_hash: str | None, timeout: float = 10.0
    ) -> None:
        self.client = client
        self.timeout = timeout
        self.root = root.rstrip("/") or "/"
        self.election_path = election_path
        self.own_hash = own_hash
        self._changed = threading.Event()
        self._changed.set()
        self._refusal: str | None = None
        self._reported: set[str] = set()
        self._reader = CandidateReader(client, election_path, timeout=timeout)

    def check(self, force: bool = False) -> str | None:
        """Why this replica must not lead (a newer layout is here), or None.

        Reads ZooKeeper only when ``force`` is set or a watch saw a change;
        otherwise returns the last answer. Logs each differing schedule once.
        """
        if not force and not self._changed.is_set():
            return self._refusal
        self._changed.clear()
        self._refusal = self._newer_directory() or self._newer_candidate()
        return self._refusal

    def _on_change(self, event: WatchedEvent) -> None:
        self._changed.set()

    def _newer_directory(self) -> str | None:
        try:
            children = self.client.get_children(self.root, watch=self._on_change)
        except NoNodeError:
            return None
        newer = sorted((n, c) for c in children if (n := layout_of(c)) is not None and n > LAYOUT)
        if not newer:
            return None
        paths = ", ".join(f"{self.root.rstrip('/')}/{c}" for _, c in newer)
        return (
            f"{paths} holds a newer zkbeat layout (v{newer[-1][0]}) than this release understands "
            f"(v{LAYOUT}); upgrade this replica, or after a rollback delete {paths}"
        )

    def _newer_candidate(self) -> str | None:
        refusal = None
        for node in self._reader.read(watch=self._on_change).candidates:
            data = node.data
            layout = data.get("layout")
            if refusal is None and isinstance(layout, int) and not isinstance(layout, bool) and layout > LAYOUT:
                refusal = (
                    f"candidate {node.name} ({data.get('identity', '?')}) runs a newer zkbeat layout (v{layout}) "
                    f"than this release (v{LAYOUT}); it leads once the older replicas step aside"
                )
            self._report_schedule(node.name, data)
        return refusal

    def _report_schedule(self, child: str, data: dict[str, Any]) -> None:
        theirs = data.get("schedule_hash")
        if child in self._reported or self.own_hash is None or not isinstance(theirs, str) or theirs == self.own_hash:
            return
        self._reported.add(child)
        logger.warning(
            "zkbeat: replica %s (epoch %s, zkbeat %s) runs a different schedule (hash %s) than this leader's (%s); "
            "only the leader's is published",
            data.get("identity") or "?",
            child.rsplit("-", 1)[-1].lstrip("0") or "0",
            data.get("version", "?"),
            theirs,
            self.own_hash,
        )

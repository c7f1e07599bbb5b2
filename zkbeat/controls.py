"""Operator controls kept in ZooKeeper: pause, resume, and run-now requests.

Layout 2 (zkbeat.layout), in layout 1's tree::

    <root>/v1/entries/<entry>               its ledger state may carry "paused": {by, at, note}
    <root>/v1/triggers/request-<seq>        JSON {entry, by, at}: one run now
    <root>/v1/triggers/done/request-<seq>   JSON {entry, task_id, epoch, published_at}: the receipt
    <root>/v2                               the marker, created before any of these is written

A pause is a compare-and-set write on the entry's ledger znode. The leader
needs no poll to see it: its next claim of the entry is a compare-and-set
too, conflicts, and re-reads. While paused, each tick that comes due is
claimed as a *check* of the znode's version (nothing written, nothing
published), so a resume shows up the same way.

A trigger is a sequential znode the leader watches (one child watch on
``triggers/``, whose callback only sets an Event that also wakes the beat
loop). The leader deletes the request in the same fenced transaction that
records the run, so a run is recorded exactly when its request is consumed,
on whichever leader commits first; then it publishes and writes the receipt
that ``zkbeat trigger`` waits for.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import unicodedata
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from typing import Any

from kazoo.client import KazooClient
from kazoo.exceptions import BadVersionError, KazooException, NodeExistsError, NoNodeError
from kazoo.protocol.states import WatchedEvent

from .exceptions import ZkBeatError
from .layout import LAYOUT_DIR, MARKER_DIR
from .ledger import EntryState, Ledger, Pause, decode_state, encode_state
from .ticks import HEADER_MANUAL

__all__ = [
    "ControlError",
    "UnknownEntryError",
    "TriggerRequest",
    "TriggerInbox",
    "MAX_NOTE",
    "check_note",
    "pause",
    "resume",
    "request_trigger",
    "wait_published",
    "HEADER_MANUAL",
]

logger = logging.getLogger(__name__)

#: Longest pause note kept (characters): it lives in every claim of the entry.
MAX_NOTE = 1000
#: Receipts older than this are removed when the leader writes a new one.
RECEIPT_TTL = 3600.0
_REQUEST_PREFIX = "request-"


class ControlError(ZkBeatError):
    """A control command cannot do what it was asked (the message says why)."""


class UnknownEntryError(ControlError):
    """The entry named has no ledger state under the root (and is not in the app's schedule)."""


def check_note(note: str) -> str:
    """The note as kept; ControlError for one too long or with control characters."""
    if len(note) > MAX_NOTE:
        raise ControlError(f"the note is {len(note)} characters long; at most {MAX_NOTE} are kept")
    bad = sorted({repr(ch) for ch in note if unicodedata.category(ch).startswith("C")})
    if bad:
        raise ControlError(f"the note holds control characters ({', '.join(bad[:5])}); write it on one plain line")
    return note


def _paths(root: str) -> tuple[str, str, str]:
    base = root.rstrip("/")
    return f"{base}/{LAYOUT_DIR}/triggers", f"{base}/{LAYOUT_DIR}/triggers/done", f"{base}/{MARKER_DIR}"


def _mark(client: KazooClient, root: str) -> None:
    """Create ``<root>/v2`` first, so that no layout-1 replica leads over state it would ignore."""
    client.ensure_path(_paths(root)[2])


def _read_entry(client: KazooClient, ledger: Ledger, name: str) -> tuple[EntryState, int]:
    path = ledger.entry_path(name)
    try:
        raw, stat = client.get(path)
    except NoNodeError:
        raise UnknownEntryError(
            f"entry {name!r} has no ledger state under {ledger.path} (a wrong name, or an entry that has never run)"
        ) from None
    try:
        return decode_state(raw), stat.version
    except (ValueError, UnicodeDecodeError) as exc:
        raise ControlError(f"entry {name!r}: its ledger znode {path} holds data zkbeat cannot read ({exc})") from None


def _update(client: KazooClient, root: str, name: str, change: Any) -> tuple[EntryState, bool]:
    """Apply ``change(state) -> state or None`` compare-and-set; (the state, whether it was written)."""
    ledger = Ledger(client, root)
    while True:
        state, version = _read_entry(client, ledger, name)
        new = change(state)
        if new is None:
            return state, False
        _mark(client, root)
        try:
            client.set(ledger.entry_path(name), encode_state(new), version=version)
        except BadVersionError:
            continue  # the leader claimed it in between: apply the change to what it wrote
        except NoNodeError:
            raise UnknownEntryError(f"entry {name!r} was deleted from the ledger meanwhile") from None
        return new, True


def pause(client: KazooClient, root: str, name: str, by: str, note: str = "") -> tuple[EntryState, bool]:
    """Pause ``name`` cluster-wide; (its state, False if it was paused already: that pause is kept)."""
    note = check_note(note)
    stamp = Pause(by=by, at=datetime.now(timezone.utc), note=note)
    return _update(client, root, name, lambda state: None if state.paused else replace(state, paused=stamp))


def resume(client: KazooClient, root: str, name: str) -> tuple[EntryState, bool]:
    """Resume ``name``; (its state as it was, False if it was not paused)."""
    before: list[EntryState] = []

    def change(state: EntryState) -> EntryState | None:
        before[:] = [state]
        return replace(state, paused=None) if state.paused else None

    state, written = _update(client, root, name, change)
    return (before[0] if written else state), written


def request_trigger(client: KazooClient, root: str, name: str, by: str, scheduled: bool = False) -> str:
    """Ask the leader for one run of ``name`` now; the request's znode path.

    ``name`` must have ledger state, or be in the app's schedule (``scheduled``).
    """
    ledger = Ledger(client, root)
    if not scheduled:
        _read_entry(client, ledger, name)
    requests, _, _ = _paths(root)
    _mark(client, root)
    client.ensure_path(requests)
    data = {"entry": name, "by": by, "at": datetime.now(timezone.utc).isoformat()}
    return client.create(f"{requests}/{_REQUEST_PREFIX}", json.dumps(data).encode(), sequence=True)


def wait_published(client: KazooClient, root: str, request: str, timeout: float) -> dict[str, Any] | None:
    """The receipt of ``request`` once the leader published it (None on timeout); the receipt is removed."""
    _, done, _ = _paths(root)
    path = f"{done}/{request.rsplit('/', 1)[-1]}"
    changed = threading.Event()
    deadline = time.monotonic() + timeout
    while True:
        changed.clear()
        if client.exists(path, watch=lambda event: changed.set()) is not None:
            break
        if not changed.wait(max(0.0, deadline - time.monotonic())):
            return None
    try:
        raw, _ = client.get(path)
        client.delete(path)
    except NoNodeError:
        return {}
    try:
        data = json.loads(raw.decode("utf-8"))
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}


@dataclass(frozen=True)
class TriggerRequest:
    """One run-now request as the leader read it."""

    name: str
    path: str
    entry: str
    by: str
    at: datetime
    #: The znode's data, to put it back if the run is withdrawn (broker down).
    raw: bytes


def _parse_request(name: str, path: str, raw: bytes) -> TriggerRequest:
    data = json.loads(raw.decode("utf-8"))
    if not isinstance(data, dict):
        raise ValueError("not a JSON object")
    entry, by, at = data.get("entry"), data.get("by", "?"), data.get("at")
    if not isinstance(entry, str) or not entry:
        raise ValueError(f"no entry name ({entry!r})")
    if not isinstance(by, str) or not isinstance(at, str):
        raise ValueError("'by' and 'at' must be strings")
    moment = datetime.fromisoformat(at)
    if moment.tzinfo is None:
        raise ValueError(f"time without a timezone: {at!r}")
    return TriggerRequest(name=name, path=path, entry=entry, by=by, at=moment.astimezone(timezone.utc), raw=raw)


#: Seconds between looks at the trigger flag while an idle leader waits.
_WAIT_SLICE = 0.05


class TriggerInbox:
    """The leader's view of run-now requests: one child watch, read only when it fired.

    Not thread-safe: one caller (beat's main thread). The watch callback
    (kazoo's thread) only sets :attr:`changed`, which also wakes beat's loop.
    """

    def __init__(self, client: KazooClient, root: str) -> None:
        self.client = client
        self.root = root
        self.path, self.done, _ = _paths(root)
        self.changed = threading.Event()
        self.changed.set()
        #: Requests ZooKeeper would not let this leader consume or remove
        #: (a stranger's ACL or child on them): never taken again, so one
        #: cannot hold back the others or loop.
        self.refused: set[str] = set()

    def _on_change(self, event: WatchedEvent) -> None:
        self.changed.set()

    def again(self) -> None:
        """Read the requests again at the next pass (one could not run in this one)."""
        self.changed.set()

    def wait(self, timeout: float) -> bool:
        """Block up to ``timeout`` seconds for a new request; True if one came.

        Sleeps in short slices and looks at the watch's flag in between,
        instead of a timed ``Event.wait``: a process whose clocks are shifted
        (libfaketime, as the clock-skew tests run replicas) never returns
        from a timed wait, while ``time.sleep`` still works. The flag is
        local (the watch sets it); nothing is asked of ZooKeeper meanwhile.
        """
        deadline = time.monotonic() + timeout
        while not self.changed.is_set():
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            time.sleep(min(left, _WAIT_SLICE))
        return True

    def take(self) -> list[TriggerRequest]:
        """The requests waiting, oldest first, if the watch fired since the last read; else none.

        A request zkbeat cannot read is logged and deleted: it can never run.
        """
        if not self.changed.is_set():
            return []
        self.changed.clear()
        try:
            children = self.client.get_children(self.path, watch=self._on_change)
        except NoNodeError:
            # Nothing asked yet: watch for triggers/ to appear.
            if self.client.exists(self.path, watch=self._on_change) is not None:
                self.changed.set()
            return []
        found = []
        for child in sorted(c for c in children if c != "done"):
            path = f"{self.path}/{child}"
            if path in self.refused:
                continue
            try:
                raw, _ = self.client.get(path)
            except NoNodeError:
                continue
            try:
                if not child.startswith(_REQUEST_PREFIX):
                    raise ValueError("not a zkbeat request name")
                found.append(_parse_request(child, path, raw))
            except (ValueError, UnicodeDecodeError) as exc:
                self.discard(path, f"it holds data zkbeat cannot read ({exc})")
        return found

    def discard(self, path: str, why: str) -> None:
        """Log and delete a request that can never run; one ZooKeeper will not delete is left out."""
        logger.error("zkbeat: removing the trigger request %s: %s", path, why)
        try:
            self.client.delete(path)
        except NoNodeError:
            pass
        except KazooException as exc:
            self.refuse(path, f"it cannot be removed either ({type(exc).__name__})")

    def refuse(self, path: str, why: str) -> None:
        """Leave out a request this leader may not consume (logged once)."""
        if path in self.refused:
            return
        self.refused.add(path)
        logger.error("zkbeat: leaving out the trigger request %s: %s", path, why)

    def receipt(self, request: TriggerRequest, task_id: str, epoch: int, uncertain: bool = False) -> None:
        """Tell ``zkbeat trigger`` the run was published; drop receipts nobody waited for.

        ``uncertain``: the publish got no answer from the broker, so it may
        or may not have arrived (it is not sent again).
        """
        data = {
            "entry": request.entry,
            "task_id": task_id,
            "epoch": epoch,
            "published_at": datetime.now(timezone.utc).isoformat(),
        }
        if uncertain:
            data["uncertain"] = True
        try:
            self.client.create(f"{self.done}/{request.name}", json.dumps(data).encode(), makepath=True)
        except NodeExistsError:
            pass
        cutoff = (time.time() - RECEIPT_TTL) * 1000
        for child in self.client.get_children(self.done):
            path = f"{self.done}/{child}"
            stat = self.client.exists(path)
            if stat is not None and stat.ctime < cutoff:
                try:
                    self.client.delete(path)
                except NoNodeError:
                    pass

"""Operator controls kept in ZooKeeper: pause, resume, and run-now requests.

Layout 2 (zkbeat.coordination.layout), in layout 1's tree::

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

What becomes of a request, and what ``zkbeat trigger`` reports on a timeout:

==========================================  ================================  ==========================
the leader finds                            it                                the command reports
==========================================  ================================  ==========================
the entry in its schedule                   runs it: consumed in the claim,   published as task X (0)
                                            then a receipt {task_id}
the entry missing, while its schedule is    keeps it pending, with a note     pending, and the note (1)
empty or failed to load (a database read)   saying why (``held``)
the entry missing, the request younger      keeps it pending, with a note:    pending, and the note (1)
than UNKNOWN_ENTRY_PATIENCE                 a replica whose schedule has the
                                            entry may lead (mid-rollout)
the entry missing, the request older        refuses it: a receipt             refused, and why (1)
                                            {refused: why}, request deleted
data it cannot parse                        refuses it, as above              refused, and why (1)
a request it may not read (NoAuth)          leaves it alone, logged once      pending (1)
(nothing: no leader, or a layout-1 one)     -                                 pending, who is in line (1)
==========================================  ================================  ==========================

A request that is gone without a receipt was consumed if the entry's ledger
state names it (``manual``): its run was recorded as task X, and either sent
or lost with its leader between the claim and the send (never sent twice);
the command then exits 3, as for a send the broker never answered.
"""

from __future__ import annotations

import json
import logging
import math
import threading
import time
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from typing import Any

from kazoo.client import KazooClient
from kazoo.exceptions import BadVersionError, KazooException, NoAuthError, NodeExistsError, NoNodeError
from kazoo.handlers.threading import KazooTimeoutError
from kazoo.protocol.states import WatchedEvent

from .._decode import json_object
from ..coordination.candidates import CandidateReader
from ..coordination.layout import LAYOUT, LAYOUT_DIR, MARKER_DIR
from ..exceptions import ZkBeatError
from ..ticking.ticks import HEADER_MANUAL, manual_task_id
from .clock import early_slots
from .store import ABSENT, EntryState, Ledger, Pause, decode_state, encode_state, zookeeper_time

__all__ = [
    "ControlError",
    "UnknownEntryError",
    "LayoutError",
    "TriggerRequest",
    "TriggerInbox",
    "MAX_NOTE",
    "check_note",
    "pause",
    "resume",
    "request_trigger",
    "wait_published",
    "request_outcome",
    "pending_requests",
    "check_layout",
    "UNKNOWN_ENTRY_PATIENCE",
    "HEADER_MANUAL",
]

logger = logging.getLogger(__name__)

#: Longest pause note kept (characters): it lives in every claim of the entry.
MAX_NOTE = 1000
#: Receipts older than this are removed by the leader (zkbeat trigger collects its own at once).
RECEIPT_TTL = 3600.0
#: Seconds (of the request's age, by the time it says it was made) a run-now
#: request for an entry the leader's schedule lacks is kept pending before it
#: is refused: long enough for a rollout that adds the entry to reach a leader.
#: While the leader's schedule is empty or failed to load it is never refused.
UNKNOWN_ENTRY_PATIENCE = 600.0
#: Seconds before a leader that may not list ``triggers/`` (NoAuth) tries again.
DENIED_RECHECK = 30.0
#: Receipts kept at most, the newest: older ones nobody collected are removed first.
MAX_RECEIPTS = 1000
#: Receipts one leader's pass removes or looks at, at most: one pipelined round each.
PRUNE_BATCH = 200
_REQUEST_PREFIX = "request-"


class ControlError(ZkBeatError):
    """A control command cannot do what it was asked (the message says why)."""


class UnknownEntryError(ControlError):
    """The entry named has no ledger state under the root (and is not in the app's schedule)."""


class LayoutError(ControlError):
    """No replica in line reads the layout the command would write; it would stop them all."""


def check_name(name: str) -> str:
    """The entry name as given; ControlError for one that cannot name an entry (empty)."""
    if not name or not name.strip():
        raise ControlError(f"the entry name is empty ({name!r}); name an entry of the schedule")
    return name


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


def check_layout(client: KazooClient, root: str, what: str) -> None:
    """LayoutError unless ``<root>/v2`` exists already or a candidate in line reads layout 2.

    Creating the marker makes every layout-1 replica refuse to lead: with
    none of layout 2 in line (the command's machine was upgraded first),
    ``what`` would stop the whole cluster. Once the marker exists, nothing
    more is lost by writing under it.
    """
    base = root.rstrip("/")
    if client.exists(_paths(root)[2]) is not None:
        return
    line = CandidateReader(client, f"{base}/{LAYOUT_DIR}/election").read()
    described = []
    for node in [*line.candidates, *_shard_candidates(client, base)]:
        layout = node.data.get("layout")
        layout = layout if isinstance(layout, int) and not isinstance(layout, bool) else 1
        if layout >= LAYOUT:
            return
        described.append(
            f"{node.data.get('identity', '?')} (zkbeat {node.data.get('version', '?')}, layout {layout})"
            if node.readable
            else f"{node.name} (data zkbeat cannot read)"
        )
    who = ", ".join(described) if described else "no replica is in line"
    raise LayoutError(
        f"{what} needs zkbeat layout {LAYOUT} ({base}/{MARKER_DIR}), which makes replicas of layout 1 refuse to "
        f"lead, and no replica in line under {base} reads it: {who}. Upgrade a replica first, or {what} anyway "
        f"with `zkbeat {what} --force` (the replicas of layout 1 then stop leading until {base}/{MARKER_DIR} is "
        "deleted)"
    )


def _shard_candidates(client: KazooClient, base: str) -> list[Any]:
    """The candidates in the shards' elections (``<root>/v1/shards/<N>/<k>/election``, zkbeat.coordination.shards)."""
    found = []
    shards = f"{base}/{LAYOUT_DIR}/shards"
    try:
        counts = client.get_children(shards)
    except NoNodeError:
        return []
    for count in sorted(counts):
        try:
            indexes = client.get_children(f"{shards}/{count}")
        except NoNodeError:
            continue
        for index in sorted(indexes):
            found.extend(CandidateReader(client, f"{shards}/{count}/{index}/election").read().candidates)
    return found


def _read_entry(client: KazooClient, ledger: Ledger, name: str) -> tuple[EntryState, int]:
    """The entry's state, and its version.

    With the spans of early slots the next claim would carry (zkbeat.ledger.clock),
    so that what a control writes back still says which ones a leader
    whose clock was ahead published early.
    """
    path = ledger.entry_path(name)
    try:
        raw, stat = client.get(path)
    except NoNodeError:
        raise UnknownEntryError(
            f"entry {name!r} has no ledger state under {ledger.path} (a wrong name, or an entry that has never "
            "run: with -A, an entry of the app's beat_schedule can be named before its first run)"
        ) from None
    except NoAuthError:
        raise ControlError(
            f"entry {name!r}: its ledger znode {path} may not be read with these credentials (NoAuth): "
            "someone else's ACL is on it, or zkbeat_auth differs (pass the app with -A)"
        ) from None
    try:
        state = decode_state(raw)
        return replace(state, early=early_slots(state, zookeeper_time(stat.mtime))), stat.version
    except (ValueError, UnicodeDecodeError) as exc:
        raise ControlError(f"entry {name!r}: its ledger znode {path} holds data zkbeat cannot read ({exc})") from None


def _update(
    client: KazooClient, root: str, name: str, change: Any, *, mark: bool = True, fresh: EntryState | None = None
) -> tuple[EntryState, bool]:
    """Apply ``change(state) -> state or None`` compare-and-set; (the state, whether it was written).

    ``fresh`` is the state of an entry that has never run (no ledger znode
    yet, but in the app's schedule): the change is then made to it, and the
    znode created, unless the leader creates it first. ``mark``: create the
    layout marker before writing (a write layout 1 would misread).
    """
    ledger = Ledger(client, root)
    while True:
        try:
            state, version = _read_entry(client, ledger, name)
        except UnknownEntryError:
            if fresh is None:
                raise
            state, version = fresh, ABSENT
        new = change(state)
        if new is None:
            return state, False
        if mark:
            _mark(client, root)
        try:
            if version == ABSENT:
                client.create(ledger.entry_path(name), encode_state(new), makepath=True)
            else:
                client.set(ledger.entry_path(name), encode_state(new), version=version)
        except (BadVersionError, NodeExistsError):
            continue  # the leader claimed it in between: apply the change to what it wrote
        except NoNodeError:
            raise UnknownEntryError(f"entry {name!r} was deleted from the ledger meanwhile") from None
        return new, True


def pause(
    client: KazooClient,
    root: str,
    name: str,
    by: str,
    note: str = "",
    scheduled: bool = False,
    *,
    force: bool = False,
) -> tuple[EntryState, bool]:
    """Pause ``name`` cluster-wide; (its state, False if it was paused already: that pause is kept).

    ``scheduled``: the entry is in the app's schedule, so one that has never
    run (no ledger state yet) can be paused too; its state then starts at
    the pause, so it counts its next run from there once resumed.
    LayoutError, writing nothing, while no replica in line reads layout 2
    (:func:`check_layout`), unless ``force``.
    """
    check_name(name)
    note = check_note(note)
    if not force:
        check_layout(client, root, "pause")
    now = datetime.now(timezone.utc)
    stamp = Pause(by=by, at=now, note=note)
    fresh = EntryState(last_run_at=now, updated_at=now) if scheduled else None
    return _update(
        client, root, name, lambda state: None if state.paused else replace(state, paused=stamp), fresh=fresh
    )


def resume(client: KazooClient, root: str, name: str, scheduled: bool = False) -> tuple[EntryState, bool]:
    """Resume ``name``; (its state as it was, False if it was not paused).

    Writes nothing layout 1 would misread (the state without its pause), so
    it never creates the layout marker: resuming every entry is the first
    step of a rollback to layout 1.
    """
    check_name(name)
    before: list[EntryState] = []

    def change(state: EntryState) -> EntryState | None:
        before[:] = [state]
        return replace(state, paused=None) if state.paused else None

    if scheduled:
        try:
            _read_entry(client, Ledger(client, root), name)
        except UnknownEntryError:
            now = datetime.now(timezone.utc)
            return EntryState(last_run_at=now, updated_at=now), False  # never ran, never paused
    state, written = _update(client, root, name, change, mark=False)
    return (before[0] if written else state), written


def request_trigger(
    client: KazooClient, root: str, name: str, by: str, scheduled: bool = False, *, force: bool = False
) -> str:
    """Ask the leader for one run of ``name`` now; the request's znode path.

    ``name`` must have ledger state, or be in the app's schedule (``scheduled``).
    LayoutError, writing nothing, while no replica in line reads layout 2
    (:func:`check_layout`), unless ``force``.
    """
    check_name(name)
    if not force:
        check_layout(client, root, "trigger")
    ledger = Ledger(client, root)
    if not scheduled:
        _read_entry(client, ledger, name)
    requests, _, _ = _paths(root)
    _mark(client, root)
    client.ensure_path(requests)
    data = {"entry": name, "by": by, "at": datetime.now(timezone.utc).isoformat()}
    return client.create(f"{requests}/{_REQUEST_PREFIX}", json.dumps(data).encode(), sequence=True)


def wait_published(client: KazooClient, root: str, request: str, timeout: float) -> dict[str, Any] | None:
    """The receipt of ``request`` once the leader published or refused it (None on timeout); the receipt is removed.

    A refusal's receipt says ``refused`` (why); a run's, ``task_id``.
    """
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
    receipt = _take_receipt(client, path)
    return {} if receipt is None else receipt


def _decoded(raw: bytes | None) -> dict[str, Any]:
    try:
        return json_object(raw, empty_ok=True)
    except ValueError:
        return {}


def request_outcome(client: KazooClient, root: str, request: str, entry: str) -> dict[str, Any]:
    """What became of ``request`` (for a ``zkbeat trigger`` that timed out), as a JSON-ready dict.

    ``state`` is one of: ``published`` (its receipt is there: ``receipt``),
    ``refused`` (``reason``), ``pending`` (``held``: the leader's note on
    why it waits, if any), ``consumed`` (recorded as run as ``task_id``, no
    receipt: sent, or lost with its leader, never sent twice), ``unreadable``
    (these credentials may not read it) or ``gone`` (removed by someone).
    The receipt, if read, is removed.
    """
    name = request.rsplit("/", 1)[-1]
    requests, done, _ = _paths(root)
    try:
        raw, _ = client.get(f"{requests}/{name}")
    except NoNodeError:
        pass
    except NoAuthError:
        return {"state": "unreadable"}
    else:
        return {"state": "pending", "held": _decoded(raw).get("held")}
    receipt = _take_receipt(client, f"{done}/{name}")
    if receipt is not None:
        if receipt.get("refused"):
            return {"state": "refused", "reason": receipt.get("refused"), "receipt": receipt}
        return {"state": "published", "receipt": receipt}
    try:
        raw, _ = client.get(Ledger(client, root).entry_path(entry))
        state = decode_state(raw)
    except (NoNodeError, NoAuthError, ValueError, UnicodeDecodeError):
        state = None
    if state is not None and state.manual is not None and _sequence(state.manual) >= _sequence(name):
        # Requests of one entry run in the order they were made: a later one
        # recorded means this one was consumed before it.
        return {
            "state": "consumed",
            "task_id": manual_task_id(root, entry, name),
            "epoch": state.epoch if state.manual == name else None,
            "superseded_by": None if state.manual == name else state.manual,
        }
    return {"state": "gone"}


def _sequence(name: str) -> int:
    """The sequence number ZooKeeper gave a request (-1 for a name it did not make)."""
    digits = name[len(_REQUEST_PREFIX) :]
    return int(digits) if name.startswith(_REQUEST_PREFIX) and digits.isdigit() else -1


def pending_requests(client: KazooClient, root: str) -> list[dict[str, Any]]:
    """Run-now requests waiting for a leader, oldest first: {request, entry, by, at, held}."""
    requests, _, _ = _paths(root)
    try:
        children = sorted(c for c in client.get_children(requests) if c.startswith(_REQUEST_PREFIX))
    except NoNodeError:
        return []
    except NoAuthError:
        why = f"zkbeat may not list {requests} (NoAuth: its ACL does not grant these credentials)"
        return [{"request": "?", "entry": None, "by": None, "at": None, "held": why}]
    reads = [(child, client.get_async(f"{requests}/{child}")) for child in children]
    found = []
    for child, read in reads:
        try:
            raw, _ = read.get()
        except NoNodeError:
            continue
        except NoAuthError:
            found.append({"request": child, "entry": None, "by": None, "at": None, "held": "unreadable (NoAuth)"})
            continue
        data = _decoded(raw)
        found.append(
            {
                "request": child,
                "entry": data.get("entry") if isinstance(data.get("entry"), str) else None,
                "by": data.get("by") if isinstance(data.get("by"), str) else None,
                "at": data.get("at") if isinstance(data.get("at"), str) else None,
                "held": data.get("held") if isinstance(data.get("held"), dict) else None,
            }
        )
    return found


def _take_receipt(client: KazooClient, path: str) -> dict[str, Any] | None:
    """The receipt at ``path`` (removed once read), or None if there is none."""
    try:
        raw, _ = client.get(path)
    except NoNodeError:
        return None
    try:
        client.delete(path)
    except NoNodeError:
        pass
    return _decoded(raw)


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
    #: The znode's data version, for the leader's note on why it waits.
    version: int = -1


def _parse_request(name: str, path: str, raw: bytes, version: int = -1) -> TriggerRequest:
    data = json_object(raw)
    entry, by, at = data.get("entry"), data.get("by", "?"), data.get("at")
    if not isinstance(entry, str) or not entry:
        raise ValueError(f"no entry name ({entry!r})")
    if not isinstance(by, str) or not isinstance(at, str):
        raise ValueError("'by' and 'at' must be strings")
    moment = datetime.fromisoformat(at)
    if moment.tzinfo is None:
        raise ValueError(f"time without a timezone: {at!r}")
    return TriggerRequest(
        name=name, path=path, entry=entry, by=by, at=moment.astimezone(timezone.utc), raw=raw, version=version
    )


#: Seconds between looks at the trigger flag while an idle leader waits.
_WAIT_SLICE = 0.05
#: Seconds to wait for one pipelined answer while pruning receipts.
_PRUNE_TIMEOUT = 10.0


class TriggerInbox:
    """The leader's view of run-now requests: one child watch, read only when it fired.

    Not thread-safe: one caller (beat's main thread). The watch callback
    (kazoo's thread) only sets :attr:`changed`, which also wakes beat's loop.
    Requests it keeps waiting (:meth:`hold`) are read again at a time it
    sets itself, without a watch firing.
    """

    def __init__(self, client: KazooClient, root: str, identity: str = "?", epoch: int | None = None) -> None:
        self.client = client
        self.root = root
        self.identity = identity
        self.epoch = epoch
        self.path, self.done, _ = _paths(root)
        self.changed = threading.Event()
        self.changed.set()
        #: Called (kazoo's thread) whenever :attr:`changed` is set: a sharded
        #: replica's one wait for all its shards (zkbeat.leading.wakeup) is woken so.
        self.on_change: Callable[[], None] | None = None
        #: Requests ZooKeeper would not let this leader read, consume or remove
        #: (a stranger's ACL or child on them): never taken again, so one
        #: cannot hold back the others or loop.
        self.refused: set[str] = set()
        #: The note last written on each held request (path -> why).
        self.held: dict[str, str] = {}
        #: Monotonic time of the next read without a watch (held requests, a denied listing).
        self._recheck_at = math.inf
        #: Monotonic time before which the requests are not read, though their watch fires (:meth:`retry_after`).
        self._not_before = 0.0
        self._denied_logged = False
        #: Receipts were written since the last prune (and at the start: an
        #: earlier leader may have left some).
        self.prune_due = True

    def _on_change(self, event: WatchedEvent) -> None:
        self._set_changed()

    def _set_changed(self) -> None:
        self.changed.set()
        on_change = self.on_change
        if on_change is not None:
            on_change()

    def again(self) -> None:
        """Read the requests again at the next pass (one could not run in this one)."""
        self._set_changed()

    def later(self, seconds: float) -> None:
        """Read the requests again at the first pass ``seconds`` from now (a held one may run by then)."""
        self._recheck_at = min(self._recheck_at, time.monotonic() + max(0.0, seconds))

    def retry_after(self, seconds: float) -> None:
        """Read the requests again ``seconds`` from now, not sooner: runs the broker could not take were put back.

        Putting them back fires the watch; read at once, a broker that takes
        connections but fails every send would have them claimed, withdrawn
        and read again as fast as ZooKeeper answers. They wait as a
        withdrawn scheduled tick waits; an idle leader wakes for them then.
        """
        self._not_before = time.monotonic() + max(0.0, seconds)
        self.changed.set()

    def held_for(self) -> float:
        """Seconds before the requests may be read again (:meth:`retry_after`); 0 if they may be now."""
        return max(0.0, self._not_before - time.monotonic())

    def ready(self) -> bool:
        """The watch fired (or :meth:`again`), and no :meth:`retry_after` holds the read back."""
        return self.changed.is_set() and time.monotonic() >= self._not_before

    def wait(self, timeout: float) -> bool:
        """Block up to ``timeout`` seconds for a new request; True if one came (and may be read: :meth:`ready`).

        Sleeps in short slices and looks at the watch's flag in between,
        instead of a timed ``Event.wait``: a process whose clocks are shifted
        (libfaketime, as the clock-skew tests run replicas) never returns
        from a timed wait, while ``time.sleep`` still works. The flag is
        local (the watch sets it); nothing is asked of ZooKeeper meanwhile.
        A sharded replica waits for all its shards in one ``select`` on a
        pipe instead (zkbeat.leading.wakeup), which returns under libfaketime too.
        """
        deadline = time.monotonic() + timeout
        while not self.ready():
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            time.sleep(min(left, _WAIT_SLICE))
        return True

    def take(self) -> list[TriggerRequest]:
        """The requests waiting, oldest first, if the watch fired (or a recheck is due) since the last read.

        A request zkbeat cannot parse is refused (a receipt says why) and
        deleted: it can never run. One it may not read (NoAuth: a stranger's
        ACL) is left alone, logged once; so is a ``triggers/`` it may not
        list, read again every DENIED_RECHECK seconds: the schedule runs on.
        Receipts written since the last pass are pruned first (:meth:`prune`).
        Nothing is read while :meth:`retry_after` holds the read back.
        """
        if self.prune_due:
            self.prune()
        now = time.monotonic()
        if now < self._not_before or (not self.changed.is_set() and now < self._recheck_at):
            return []
        self.changed.clear()
        self._recheck_at = math.inf
        try:
            children = self.client.get_children(self.path, watch=self._on_change)
        except NoNodeError:
            # Nothing asked yet: watch for triggers/ to appear.
            if self.client.exists(self.path, watch=self._on_change) is not None:
                self._set_changed()
            return []
        except NoAuthError:
            if not self._denied_logged:
                self._denied_logged = True
                logger.error(
                    "zkbeat: may not list the run-now requests at %s (NoAuth: its ACL does not grant this replica's "
                    "credentials); scheduled entries go on, run-now requests wait; trying again every %gs",
                    self.path,
                    DENIED_RECHECK,
                )
            self.later(DENIED_RECHECK)
            return []
        self._denied_logged = False
        found = []
        for child in sorted(c for c in children if c != "done"):
            path = f"{self.path}/{child}"
            if path in self.refused:
                continue
            try:
                raw, stat = self.client.get(path)
            except NoNodeError:
                continue
            except NoAuthError:
                self.refuse(path, "zkbeat may not read it (NoAuth: its ACL does not grant this replica's credentials)")
                continue
            try:
                if not child.startswith(_REQUEST_PREFIX):
                    raise ValueError("not a zkbeat request name")
                found.append(_parse_request(child, path, raw, stat.version))
            except ValueError as exc:
                self.discard(path, f"it holds data zkbeat cannot read ({exc})")
        present = {f"{self.path}/{child}" for child in children}
        self.held = {path: why for path, why in self.held.items() if path in present}
        return found

    def discard(self, path: str, why: str, entry: str | None = None) -> None:
        """Refuse a request that can never run: a receipt says why, and the request is deleted.

        Both in one transaction, so a waiting ``zkbeat trigger`` learns why;
        one ZooKeeper will not delete is left out instead.
        """
        logger.error("zkbeat: removing the trigger request %s: %s", path, why)
        name = path.rsplit("/", 1)[-1]
        data = {
            "entry": entry,
            "refused": why,
            "by": self.identity,
            "epoch": self.epoch,
            "refused_at": datetime.now(timezone.utc).isoformat(),
        }
        try:
            self.client.ensure_path(self.done)
            transaction = self.client.transaction()
            transaction.create(f"{self.done}/{name}", json.dumps(data).encode())
            transaction.delete(path)
            outcomes = transaction.commit()
            if not any(isinstance(outcome, Exception) for outcome in outcomes):
                return
            self.client.delete(path)  # a receipt by that name is there already (another leader's)
        except NoNodeError:
            pass
        except KazooException as exc:
            self.refuse(path, f"it cannot be removed either ({type(exc).__name__})")

    def hold(self, request: TriggerRequest, why: str, recheck: float) -> None:
        """Keep ``request`` pending: note on it why (once per reason), and look again in ``recheck`` seconds.

        The note (``held`` in the request's data) is what ``zkbeat status``
        and a timed-out ``zkbeat trigger`` show; writing it is best effort.
        """
        self.later(recheck)
        if self.held.get(request.path) == why:
            return
        first = request.path not in self.held
        self.held[request.path] = why
        log = logger.warning if first else logger.info
        log("zkbeat: keeping the trigger request %s (%s by %s) pending: %s", request.path, request.entry, request.by,
            why)  # fmt: skip
        data = _decoded(request.raw)
        data["held"] = {
            "why": why,
            "by": self.identity,
            "epoch": self.epoch,
            "since": datetime.now(timezone.utc).isoformat(),
        }
        try:
            self.client.set(request.path, json.dumps(data).encode(), version=request.version)
        except KazooException as exc:
            logger.debug("zkbeat: could not note on %s why it waits: %r", request.path, exc)

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
        self.prune_due = True

    def prune(self) -> int:
        """Remove receipts nobody collected; the number removed.

        Those beyond the newest MAX_RECEIPTS go first, then those older than
        RECEIPT_TTL, oldest first, at most PRUNE_BATCH in all: one listing and
        pipelined requests, never one round trip per receipt, so a pass
        stays short however many piled up (the rest go in later passes).
        Receipts are named after their request, whose sequence number orders
        them by age. ZooKeeper errors are logged; pruning is tried again
        after the next receipt.
        """
        self.prune_due = False
        try:
            names = sorted(c for c in self.client.get_children(self.done) if c.startswith(_REQUEST_PREFIX))
            excess = names[: max(0, len(names) - MAX_RECEIPTS)][:PRUNE_BATCH]
            oldest = names[len(excess) : len(excess) + PRUNE_BATCH - len(excess)]
            cutoff = (time.time() - RECEIPT_TTL) * 1000
            looks = [self.client.exists_async(f"{self.done}/{name}") for name in oldest]
            expired = []
            for name, look in zip(oldest, looks):
                stat = look.get(timeout=_PRUNE_TIMEOUT)
                if stat is None or stat.ctime >= cutoff:
                    break  # the rest are younger
                expired.append(name)
            removals = [self.client.delete_async(f"{self.done}/{name}") for name in excess + expired]
            removed = 0
            for removal in removals:
                try:
                    removal.get(timeout=_PRUNE_TIMEOUT)
                    removed += 1
                except NoNodeError:
                    pass
        except NoNodeError:
            return 0
        except (KazooException, KazooTimeoutError) as exc:
            logger.warning("zkbeat: could not remove old trigger receipts under %s: %r", self.done, exc)
            return 0
        if removed >= PRUNE_BATCH:
            self.prune_due = True  # a whole batch went: there may be more, next pass
        return removed

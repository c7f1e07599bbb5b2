"""The run ledger: each entry's last run, kept in ZooKeeper, claimed fenced.

Layout (v1)::

    <root>/v1/entries/<entry name, percent-quoted>
        JSON {last_run_at, total_run_count, epoch, updated_at, slot[, paused][, manual][, early][, recent]}

``paused`` ({by, at, note}) is an operator's pause and ``manual`` the last
trigger request run (zkbeat.ledger.controls); layout 2 added both (zkbeat.coordination.layout).
``early`` ([[first, last], ...]) spans the slots leaders whose clock was
ahead claimed before ZooKeeper's clock reached them (zkbeat.ledger.clock); a
release that does not know it ignores it. ``recent`` ([[slot_ms, late_ms,
replica, epoch, kind], ...], newest first, bounded) is the entry's last runs, written
by the claims that record them (zkbeat.ledger.history); a release that does not
know it ignores it too, and its claim drops it. Any other key a later
release adds is ignored the same way.

A claim writes the new state of one or many due entries in ONE ZooKeeper
transaction that also checks the leader's own candidate znode still exists.
ZooKeeper applies all of it or none of it, so a replica that has lost
leadership (session gone, stepped down) cannot record a run, and so never
publishes one: the transaction is the fence, whatever the replica's local
state believes. Each entry write is compare-and-set on the znode's version,
so a run recorded by someone else is never overwritten blindly.
"""

from __future__ import annotations

import json
import json.encoder
import json.scanner
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, NamedTuple
from urllib.parse import quote, unquote

from kazoo.client import KazooClient
from kazoo.exceptions import (
    BadVersionError,
    NoAuthError,
    NodeExistsError,
    NoNodeError,
    RolledBackError,
    UnimplementedError,
)
from kazoo.protocol.states import ZnodeStat

from .._collector import no_collection
from .._decode import brief, json_object
from ..coordination._multiread import read_many
from ..coordination.layout import LAYOUT_DIR
from ..exceptions import ClaimConflictError, ClaimRefusedError, FencedError
from .history import RECENT_RUNS, Run, decode_runs, encode_runs, encoded_bytes

__all__ = [
    "LAYOUT_VERSION",
    "EntryState",
    "Pause",
    "LedgerRecord",
    "Claim",
    "ClaimInFlight",
    "ClaimResult",
    "Ledger",
    "encode_name",
    "decode_name",
    "encode_state",
    "decode_state",
    "ReadAnswer",
    "decode_answer",
]

logger = logging.getLogger(__name__)

#: The layout directory every path lives under (zkbeat.coordination.layout is the one source).
LAYOUT_VERSION = LAYOUT_DIR
#: Version to pass for an entry that has no znode yet (create, not set).
ABSENT = -1
#: ZooKeeper rejects requests above jute.maxbuffer (1 MiB by default); stay
#: well below it when packing many claims into one transaction.
_MAX_TRANSACTION_BYTES = 512 * 1024
_MAX_TRANSACTION_OPS = 1000
_OP_OVERHEAD = 64


def encode_name(name: str) -> str:
    """Entry name -> one znode path component (any name, including '/')."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"entry name must be a non-empty string, got {name!r}")
    encoded = quote(name, safe="")
    if encoded in (".", ".."):  # reserved path components in ZooKeeper
        encoded = encoded.replace(".", "%2E")
    return encoded


def decode_name(component: str) -> str:
    return unquote(component)


def _iso(value: datetime | None) -> str | None:
    if value is None:
        return None
    if value.tzinfo is None:
        value = value.replace(tzinfo=timezone.utc)
    return value.astimezone(timezone.utc).isoformat()


def _parse_time(value: Any) -> datetime | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise ValueError(f"timestamp is not a string: {value!r}")
    parsed = datetime.fromisoformat(value)
    if parsed.tzinfo is None:
        raise ValueError(f"timestamp without a timezone: {value!r}")
    try:
        return parsed.astimezone(timezone.utc)
    except OverflowError:  # before year 1 or after 9999 in UTC: bad data, not an error out of Ledger.load
        raise ValueError(f"timestamp out of range in UTC: {value!r}") from None


@dataclass(frozen=True)
class EntryState:
    """What the ledger knows about one entry after its last claim."""

    last_run_at: datetime
    total_run_count: int = 0
    epoch: int | None = None
    updated_at: datetime | None = None
    #: The due time of the last tick claimed (published or skipped).
    slot: datetime | None = None
    #: An operator's pause, kept until resumed (zkbeat.ledger.controls).
    paused: Pause | None = None
    #: The last trigger request run for this entry (its znode name).
    manual: str | None = None
    #: Spans (first, last) of slots claimed ahead of ZooKeeper's clock, never
    #: to be published again (zkbeat.ledger.clock); in order, apart.
    early: tuple[tuple[datetime, datetime], ...] = ()
    #: The entry's last runs, newest first, at most zkbeat.ledger.history.RECENT_RUNS.
    recent: tuple[Run, ...] = ()
    #: What the host built the entry from when this run was claimed, in its own words (a django-celery-beat
    #: row: its id and ``date_changed``, zkbeat.contrib.django): whether the run is of the row the host holds
    #: now, told without comparing two hosts' clocks. None: nothing said (a ``beat_schedule`` entry, an earlier
    #: release).
    source: str | None = None


@dataclass(frozen=True)
class Pause:
    """Who paused an entry, when, and why: kept in its ledger state until resumed."""

    by: str
    at: datetime | None
    note: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {"by": self.by, "at": _iso(self.at), "note": self.note}


def encode_state(state: EntryState) -> bytes:
    """A ledger znode's JSON: the state's fields, keys sorted, as ``json.dumps(..., sort_keys=True)`` writes them.

    Every claim encodes the state of each entry it claims: the shape claims
    write (no pause, no early spans) takes a fast path that writes the same
    bytes (tests/test_ledger_encode.py holds the encoder before it as the
    reference); anything else, json.dumps.
    """
    written = _encode_claimed(state)
    return written if written is not None else _encode_any(state)


#: json.dumps's own string encoder (ensure_ascii: every character past ASCII escaped), in C where json has it.
_quote = json.encoder.encode_basestring_ascii


def _time_json(value: Any) -> str | None:
    """JSON of ``_iso(value)`` for None or a plain datetime; None for anything else (the general path decides)."""
    if value is None:
        return "null"
    if type(value) is not datetime:
        return None
    # A datetime's isoformat is ASCII with nothing JSON escapes; one in UTC already is its own astimezone(UTC).
    return f'"{value.isoformat()}"' if value.tzinfo is _UTC else f'"{_iso(value)}"'


def _encode_claimed(state: EntryState) -> bytes | None:
    """encode_state's bytes for the shape claims write, without json.dumps; None for any other shape.

    Only plain types are taken (an int, not a bool; a str; a datetime, not a
    subclass; runs that are Runs of ints and strs), so each value's text is
    the one json.dumps writes for it, and the keys are written in sorted order.
    """
    if state.paused is not None or state.early:
        return None
    count, epoch, manual, recent = state.total_run_count, state.epoch, state.manual, state.recent
    if type(count) is not int or not (epoch is None or type(epoch) is int) or type(recent) is not tuple:
        return None
    source = state.source
    if not (manual is None or type(manual) is str) or not (source is None or type(source) is str):
        return None
    # In the order the general path reads them, each before the next: a time that overflows in UTC
    # raises where it did, and one that is no datetime leaves it to the general path before a later one is read.
    last_run_at = _time_json(state.last_run_at)
    if last_run_at is None:
        return None
    updated_at = _time_json(state.updated_at)
    if updated_at is None:
        return None
    slot = _time_json(state.slot)
    if slot is None:
        return None
    text = f'{{"epoch": {"null" if epoch is None else epoch}, "last_run_at": {last_run_at}'
    if manual is not None:
        text += f', "manual": {_quote(manual)}'
    if recent:
        runs = []
        for run in recent[:RECENT_RUNS]:
            if type(run) is not Run:
                return None
            slot_ms, late_ms, replica, run_epoch, kind = run
            if not (type(slot_ms) is type(late_ms) is type(run_epoch) is int and type(replica) is type(kind) is str):
                return None
            runs.append(f"[{slot_ms}, {late_ms}, {_quote(replica)}, {run_epoch}, {_quote(kind)}]")
        text += f', "recent": [{", ".join(runs)}]'
    text += f', "slot": {slot}'
    if source is not None:
        text += f', "source": {_quote(source)}'
    return f'{text}, "total_run_count": {count}, "updated_at": {updated_at}}}'.encode()


def _encode_any(state: EntryState) -> bytes:
    """Any state, through json.dumps."""
    data: dict[str, Any] = {
        "last_run_at": _iso(state.last_run_at),
        "total_run_count": state.total_run_count,
        "epoch": state.epoch,
        "updated_at": _iso(state.updated_at),
        "slot": _iso(state.slot),
    }
    if state.paused is not None:
        data["paused"] = state.paused.as_dict()
    if state.manual is not None:
        data["manual"] = state.manual
    if state.early:
        data["early"] = [[_iso(first), _iso(last)] for first, last in state.early]
    if state.recent:
        data["recent"] = encode_runs(state.recent)
    if state.source is not None:
        data["source"] = state.source
    return json.dumps(data, sort_keys=True).encode()


def _decode_early(value: Any) -> tuple[tuple[datetime, datetime], ...]:
    """The spans of early slots; a record zkbeat cannot read is logged and left out (the entry still runs)."""
    if value is None:
        return ()
    try:
        spans = []
        for first, last in value:
            first, last = _parse_time(first), _parse_time(last)
            if first is None or last is None or first > last:
                raise ValueError("not a span")
            spans.append((first, last))
        return tuple(sorted(spans))
    except (TypeError, ValueError):
        logger.warning(
            "zkbeat: a ledger entry holds an 'early' record zkbeat cannot read (%s); ignoring it", brief(value)
        )
        return ()


def _decode_pause(value: Any) -> Pause | None:
    """A pause record; one zkbeat cannot read still counts as a pause (fail closed: publish nothing)."""
    if value is None:
        return None
    if isinstance(value, dict):
        by, note = value.get("by"), value.get("note", "")
        try:
            at = _parse_time(value.get("at"))
        except ValueError:
            at = None
        if isinstance(by, str) and isinstance(note, str):
            return Pause(by=by, at=at, note=note)
    logger.warning(
        "zkbeat: a ledger entry holds a pause record zkbeat cannot read (%s); keeping it paused", brief(value)
    )
    return Pause(by="?", at=None, note="unreadable pause record")


def decode_state(raw: bytes | None) -> EntryState:
    """Parse a ledger znode; ValueError for anything zkbeat did not write."""
    state = _decode_written(raw)
    return state if state is not None else _decode_any(raw)


#: json.loads without its checks around the value (a leading BOM or blank, trailing data): the
#: same scanner, with the same settings; data with any of those, or that json_object refuses,
#: takes the general path.
_scan_json = json.scanner.make_scanner(json.JSONDecoder())
_from_iso = datetime.fromisoformat
_UTC = timezone.utc


def _decode_written(raw: bytes | None) -> EntryState | None:
    """The state of a znode as encode_state writes it, or None for anything else.

    A leader taking over decodes every entry's znode: this path costs about
    a third less than the general one. It takes only what the general path (``_decode_any``)
    would read the same way (times in UTC, counts and epochs of the right
    types) and gives up before anything that logs, so that path decides the rest.
    """
    if not raw:
        return None
    try:
        text = raw.decode("utf-8")
        data, end = _scan_json(text, 0)
    except (StopIteration, ValueError, RecursionError):
        return None
    if end != len(text) or type(data) is not dict:
        return None
    get = data.get
    count, epoch = get("total_run_count", 0), get("epoch")
    if type(count) is not int or count < 0 or (epoch is not None and type(epoch) is not int):
        return None
    last_run_at, updated_at, slot = get("last_run_at"), get("updated_at"), get("slot")
    if type(last_run_at) is not str or not (updated_at is None or type(updated_at) is str):
        return None
    if not (slot is None or type(slot) is str):
        return None
    try:
        last_run_at = _from_iso(last_run_at)
        updated_at = None if updated_at is None else _from_iso(updated_at)
        slot = None if slot is None else _from_iso(slot)
    except ValueError:
        return None
    if last_run_at.tzinfo is not _UTC or (updated_at is not None and updated_at.tzinfo is not _UTC):
        return None
    if slot is not None and slot.tzinfo is not _UTC:
        return None
    paused, manual, early, recent, source = get("paused"), get("manual"), get("early"), get("recent"), get("source")
    return EntryState(
        last_run_at=last_run_at,
        total_run_count=count,
        epoch=epoch,
        updated_at=updated_at,
        slot=slot,
        paused=None if paused is None else _decode_pause(paused),
        manual=manual if type(manual) is str else None,
        early=() if early is None else _decode_early(early),
        recent=() if recent is None else decode_runs(recent),
        source=source if type(source) is str else None,
    )


def _decode_any(raw: bytes | None) -> EntryState:
    """Any ledger znode: older layouts, other zones' times, odd fields; ValueError for what zkbeat did not write."""
    # No depth cap: a record nested past MAX_DEPTH reads as its field's rule says (a pause
    # zkbeat cannot read still pauses), as on the fast path, not the whole znode as no state.
    data = json_object(raw, any_depth=True)
    count = data.get("total_run_count", 0)
    epoch = data.get("epoch")
    if not isinstance(count, int) or isinstance(count, bool) or count < 0:
        raise ValueError(f"bad total_run_count {count!r}")
    if epoch is not None and (not isinstance(epoch, int) or isinstance(epoch, bool)):
        raise ValueError(f"bad epoch {epoch!r}")
    last_run_at = _parse_time(data.get("last_run_at"))
    if last_run_at is None:
        raise ValueError("missing last_run_at")
    return EntryState(
        last_run_at=last_run_at,
        total_run_count=count,
        epoch=epoch,
        updated_at=_parse_time(data.get("updated_at")),
        slot=_parse_time(data.get("slot")),
        paused=_decode_pause(data.get("paused")),
        manual=data["manual"] if isinstance(data.get("manual"), str) else None,
        early=_decode_early(data.get("early")),
        recent=decode_runs(data.get("recent")),
        source=data["source"] if isinstance(data.get("source"), str) else None,
    )


class ReadAnswer(NamedTuple):
    """One ledger znode as a read answered it (:func:`decode_answer`)."""

    #: The entry's state; None where the znode holds data zkbeat cannot decode (``unreadable`` says why).
    state: EntryState | None
    stat: ZnodeStat
    #: Why the data could not be decoded, or None: each reader logs it in its own words.
    unreadable: Exception | None = None


def decode_answer(answer: Any) -> ReadAnswer | None:
    """One answer to a read of a ledger znode (a multiRead's, zkbeat.coordination._multiread, or a get's).

    The rules every reader of the ledger follows (Ledger.load, the dashboard):

    * NoNodeError: None, no such entry (deleted since the listing, or never there);
    * any other error is raised, NoAuthError included: a reader that takes
      one znode under someone else's ACL for no state (Ledger.load, the
      dashboard) looks for NoAuthError before it asks;
    * data zkbeat cannot decode (not UTF-8, not zkbeat's JSON): no state,
      with the reason in ``unreadable``.
    """
    if isinstance(answer, NoNodeError):
        return None
    if isinstance(answer, Exception):
        raise answer
    raw, stat = answer
    try:
        return ReadAnswer(decode_state(raw), stat)
    except (ValueError, UnicodeDecodeError) as exc:
        return ReadAnswer(None, stat, exc)


@dataclass(frozen=True)
class LedgerRecord:
    """An entry's znode as read: its state (None if unreadable) and version."""

    state: EntryState | None
    version: int
    #: ZooKeeper's time of the znode's last write (its mtime): what clocks are checked against.
    written: datetime | None = field(default=None, compare=False)


@dataclass(frozen=True)
class Claim:
    """Write ``state`` for ``name`` if its znode is still at ``version``."""

    name: str
    state: EntryState
    version: int = ABSENT
    #: Only check the version, write nothing (a paused entry's tick: a resume
    #: in between makes it conflict, so the leader re-reads).
    check_only: bool = False
    #: A trigger request's path, deleted in the same transaction (consumed).
    consume: str | None = None
    #: A trigger request put back in the same transaction (a withdrawn run): (path, data).
    restore: tuple[str, bytes] | None = None


@dataclass
class ClaimResult:
    """Which claims committed (with their new znode versions) and why the rest did not."""

    committed: dict[str, int]
    error: FencedError | ClaimConflictError | ClaimRefusedError | None = None
    #: ZooKeeper's time of each committed write, where its transaction said
    #: (one that set an existing znode; a transaction of creates does not).
    written: dict[str, datetime] = field(default_factory=dict)


class Ledger:
    """The entries of one zkbeat root. Holds no state of its own between calls."""

    def __init__(self, client: KazooClient, root: str, timeout: float = 10.0) -> None:
        self.client = client
        self.path = f"{root.rstrip('/')}/{LAYOUT_VERSION}/entries"
        self.timeout = timeout
        self._multiread = True

    def entry_path(self, name: str) -> str:
        return f"{self.path}/{encode_name(name)}"

    def ensure(self) -> None:
        """Create entries/ (and its parents) if missing, waiting at most ``timeout``."""
        self.client.ensure_path_async(self.path).get(timeout=self.timeout)

    def sync(self) -> None:
        """Have our ZooKeeper server catch up with the quorum before the next read.

        A read right after a session moved to another server may otherwise be
        served before a commit still in flight from the old connection lands.
        """
        self.client.sync_async(self.path).get(timeout=self.timeout)

    def load(
        self, names: Iterable[str] | None = None, *, keep: Callable[[str], bool] | None = None
    ) -> dict[str, LedgerRecord]:
        """Read entries (all, or ``names``; of all, those ``keep`` is true of) with pipelined reads.

        Every get is sent before the first reply is awaited, so loading 10,000
        entries costs about one round trip plus transfer, not 10,000 of them.
        A znode zkbeat cannot parse, or may not read (someone else's ACL), is
        logged and returned with state None. Python's cyclic garbage collector
        is held off meanwhile (zkbeat._collector).
        """
        with no_collection():
            return self._load(names, keep)

    def _load(self, names: Iterable[str] | None, keep: Callable[[str], bool] | None) -> dict[str, LedgerRecord]:
        if names is None:
            try:
                components = self.client.get_children(self.path)
            except NoNodeError:
                return {}
            pending = [(decode_name(c), f"{self.path}/{c}") for c in components]
            if keep is not None:
                pending = [(name, path) for name, path in pending if keep(name)]
        else:
            pending = [(name, self.entry_path(name)) for name in names]
        records: dict[str, LedgerRecord] = {}
        denied = []
        for (name, path), result in zip(pending, self._read([path for _, path in pending])):
            if isinstance(result, NoAuthError):  # no state, as the ledger reads it: below
                denied.append((name, path, self.client.exists_async(path)))
                continue
            read = decode_answer(result)
            if read is None:
                continue
            if read.unreadable is not None:
                logger.warning(
                    "zkbeat: ledger znode %s holds data zkbeat cannot read (%s); treating it as no state",
                    path,
                    read.unreadable,
                )
            records[name] = LedgerRecord(read.state, read.stat.version, zookeeper_time(read.stat.mtime))
        for name, path, request in denied:
            # Someone else's ACL denies READ: like data zkbeat cannot parse,
            # it is no state (the version, from exists, which needs no
            # permission, keeps a claim a compare-and-set; a claim ZooKeeper
            # refuses leaves that entry out, and the others run).
            found = request.get(timeout=self.timeout)
            if found is None:
                continue
            logger.warning(
                "zkbeat: ledger znode %s may not be read by zkbeat (NoAuth: its ACL does not grant this "
                "replica's credentials); treating it as no state",
                path,
            )
            records[name] = LedgerRecord(None, found.version, zookeeper_time(found.mtime))
        return records

    def _read(self, paths: list[str]) -> list[Any]:
        """(data, stat) or the exception of each read, in one multiRead per thousand paths.

        Falls back to pipelined gets, one request each, on a ZooKeeper older
        than 3.6 (no multiRead); see ``zkbeat.coordination._multiread`` for why it matters.
        """
        if self._multiread and len(paths) > 1:
            try:
                return read_many(self.client, paths, self.timeout)
            except UnimplementedError:
                logger.info("zkbeat: ZooKeeper has no multiRead (older than 3.6); loading the ledger with single reads")
                self._multiread = False
        requests = [self.client.get_async(path) for path in paths]
        results: list[Any] = []
        for request in requests:
            try:
                results.append(request.get(timeout=self.timeout))
            except (NoNodeError, NoAuthError) as exc:
                results.append(exc)
        return results

    def claim(self, claims: list[Claim], fence: str | None) -> ClaimResult:
        """Commit ``claims`` fenced on the candidate znode ``fence``.

        Claims are packed into as few transactions as ZooKeeper's request size
        allows (usually one). Each transaction is all-or-nothing; the first
        that fails stops the rest. ConnectionLoss and timeouts propagate: the
        outcome of that transaction is then unknown to the caller; the
        exception carries what earlier transactions committed for sure
        (``committed``). ``fence=None`` writes with the compare-and-set alone
        (a replica putting back its own unsent claim; see zkbeat.leading.term).
        """
        return self.start_claim(claims, fence).result()

    def start_claim(self, claims: list[Claim], fence: str | None) -> ClaimInFlight:
        """:meth:`claim`, with its first transaction sent now and its answer waited for by ``result()``.

        A leader sends the next part of a pass's claims this way and
        publishes the part before it while ZooKeeper commits (zkbeat.leading.term).
        """
        return ClaimInFlight(self, claims, fence)


class ClaimInFlight:
    """A :meth:`Ledger.claim` whose first transaction is on its way to ZooKeeper.

    ``result()`` waits for it and sends any further transaction only after
    the one before committed, so the first that fails still stops the rest.
    """

    def __init__(self, ledger: Ledger, claims: list[Claim], fence: str | None) -> None:
        self._ledger = ledger
        self._fence = fence
        self.claims = claims
        self._chunks = _chunks(claims, ledger.entry_path)
        self._result = ClaimResult(committed={})
        self._sent = self._send_next()

    def _send_next(self) -> tuple[list[tuple[Claim, str]], list[Claim], Any] | None:
        chunk = next(self._chunks, None)
        if chunk is None:
            return None
        transaction = self._ledger.client.transaction()
        if self._fence is not None:
            transaction.check(self._fence, -1)
        owners = []  # the claim behind each operation after the fence's check
        for claim, path in chunk:
            owners.extend(_add_operations(transaction, claim, path))
        return chunk, owners, transaction.commit_async()

    def result(self) -> ClaimResult:
        """What committed, as :meth:`Ledger.claim` returns it (and raises as it raises)."""
        result, fence = self._result, self._fence
        while self._sent is not None:
            chunk, owners, answer = self._sent
            self._sent = None
            try:
                outcomes = answer.get(timeout=self._ledger.timeout)
            except Exception as exc:
                exc.committed = dict(result.committed)  # type: ignore[attr-defined]
                raise
            if fence is None:
                outcomes = [None, *outcomes]  # as if a check had passed, so indexes line up
            error = _failure(outcomes, owners, fence or "(none)")
            if error is not None:
                result.error = error
                return result
            # One transaction, one time: every write in it carries ZooKeeper's clock of the commit.
            stamps = [outcome.mtime for outcome in outcomes if isinstance(outcome, ZnodeStat)]
            for claim, _ in chunk:
                if claim.check_only:
                    result.committed[claim.name] = claim.version
                else:
                    result.committed[claim.name] = 0 if claim.version == ABSENT else claim.version + 1
                    if stamps:
                        result.written[claim.name] = zookeeper_time(stamps[0])
            self._sent = self._send_next()
        return result


def zookeeper_time(mtime: int) -> datetime:
    """A znode's mtime (ZooKeeper's clock, milliseconds since the epoch) as a UTC datetime."""
    return datetime.fromtimestamp(mtime / 1000.0, timezone.utc)


def _add_operations(transaction: Any, claim: Claim, path: str) -> list[Claim]:
    """Add one claim's operations to ``transaction``; the claim once per operation."""
    if claim.check_only:
        transaction.check(path, claim.version)
    elif claim.version == ABSENT:
        transaction.create(path, encode_state(claim.state))
    else:
        transaction.set_data(path, encode_state(claim.state), claim.version)
    owners = [claim]
    if claim.consume is not None:
        transaction.delete(claim.consume)
        owners.append(claim)
    if claim.restore is not None:
        transaction.create(*claim.restore)
        owners.append(claim)
    return owners


def _chunks(claims: list[Claim], entry_path) -> Iterable[list[tuple[Claim, str]]]:
    chunk: list[tuple[Claim, str]] = []
    size = 0
    for claim in claims:
        path = entry_path(claim.name)
        cost = len(path.encode()) + 200 + _OP_OVERHEAD + 3 * len(claim.state.paused.note if claim.state.paused else "")
        cost += encoded_bytes(claim.state.recent)
        if claim.consume is not None or claim.restore is not None:
            cost += 2 * 1024 + _OP_OVERHEAD
        if chunk and (size + cost > _MAX_TRANSACTION_BYTES or len(chunk) >= _MAX_TRANSACTION_OPS):
            yield chunk
            chunk, size = [], 0
        chunk.append((claim, path))
        size += cost
    if chunk:
        yield chunk


def _failure(
    outcomes: list[Any], claims: list[Claim], fence: str
) -> FencedError | ClaimConflictError | ClaimRefusedError | None:
    """Name why a transaction rolled back, or None if it committed."""
    failed = [
        (index, outcome)
        for index, outcome in enumerate(outcomes)
        if isinstance(outcome, Exception) and not isinstance(outcome, RolledBackError)
    ]
    # Messages people read name the epoch, not the candidate's 32-hex znode name.
    epoch = fence.rsplit("-", 1)[-1].lstrip("0") or "0"
    if not failed:
        if any(isinstance(outcome, Exception) for outcome in outcomes):
            return FencedError(f"the transaction fenced on this replica's candidate (epoch {epoch}) rolled back")
        return None
    index, outcome = failed[0]
    if index == 0:
        return FencedError(
            f"this replica's candidate (epoch {epoch}) is gone ({type(outcome).__name__}): not the leader any more"
        )
    if isinstance(outcome, (BadVersionError, NodeExistsError, NoNodeError)):
        return ClaimConflictError([claims[index - 1].name])
    # Refused outright (NoAuth: someone else's ACL on the entry or on entries/,
    # InvalidACL, ...). Re-reading and claiming again at once, as for a
    # conflict, would only loop as fast as ZooKeeper answers; the caller
    # leaves that entry out for a while and claims the rest.
    return ClaimRefusedError(claims[index - 1].name, outcome)

"""The ledger's decoder reads every znode exactly as the general decoder it replaced did (pure logic).

A leader taking over decodes every entry's znode, so the decoder takes a fast
path for what encode_state writes. Whatever a znode holds, the state (field
by field, repr included: a time's zone, a count's type), the error of data
zkbeat cannot decode (type and message) and the warnings logged must be those
of the decoder before that path: a copy of it is kept below as the reference.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from zkbeat._decode import brief, json_object
from zkbeat.ledger import store
from zkbeat.ledger.history import KINDS, MAX_REPLICA, RECENT_RUNS, Run
from zkbeat.ledger.store import EntryState, Pause, ReadAnswer, decode_answer, decode_state, encode_state

# --- The reference: decode_state and its helpers as they were before the fast path (copied, not imported). ---
# (Their log lines show a value through zkbeat._decode.brief, as the ledger's do now.)

_store_log = logging.getLogger("zkbeat.ledger.store")
_history_log = logging.getLogger("zkbeat.ledger.history")
_LAST_MS = 253402300800000


def _old_parse_time(value: Any) -> datetime | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise ValueError(f"timestamp is not a string: {value!r}")
    parsed = datetime.fromisoformat(value)
    if parsed.tzinfo is None:
        raise ValueError(f"timestamp without a timezone: {value!r}")
    return parsed.astimezone(timezone.utc)


def _ref_parse_time(value: Any) -> datetime | None:
    """The one deliberate change from the old decoder: a time before year 1 or after 9999 in UTC is a bad time.

    The old one raised OverflowError, which no reader caught: out of Ledger.load and every takeover's term.
    """
    try:
        return _old_parse_time(value)
    except OverflowError:
        raise ValueError(f"timestamp out of range in UTC: {value!r}") from None


def _ref_decode_early(value: Any) -> tuple[tuple[datetime, datetime], ...]:
    if value is None:
        return ()
    try:
        spans = []
        for first, last in value:
            first, last = _ref_parse_time(first), _ref_parse_time(last)
            if first is None or last is None or first > last:
                raise ValueError("not a span")
            spans.append((first, last))
        return tuple(sorted(spans))
    except (TypeError, ValueError):
        _store_log.warning(
            "zkbeat: a ledger entry holds an 'early' record zkbeat cannot read (%s); ignoring it", brief(value)
        )
        return ()


def _ref_decode_pause(value: Any) -> Pause | None:
    if value is None:
        return None
    if isinstance(value, dict):
        by, note = value.get("by"), value.get("note", "")
        try:
            at = _ref_parse_time(value.get("at"))
        except ValueError:
            at = None
        if isinstance(by, str) and isinstance(note, str):
            return Pause(by=by, at=at, note=note)
    _store_log.warning(
        "zkbeat: a ledger entry holds a pause record zkbeat cannot read (%s); keeping it paused", brief(value)
    )
    return Pause(by="?", at=None, note="unreadable pause record")


def _ref_well_formed(item: Any) -> bool:
    if type(item) is not list or len(item) != 5:
        return False
    slot_ms, late_ms, replica, epoch, kind = item
    return (
        type(slot_ms) is int
        and type(late_ms) is int
        and 0 <= slot_ms < _LAST_MS
        and 0 <= slot_ms + late_ms < _LAST_MS
        and type(replica) is str
        and len(replica) <= MAX_REPLICA
        and type(epoch) is int
        and kind in KINDS
    )


def _ref_decode_runs(value: Any) -> tuple[Run, ...]:
    if value is None:
        return ()
    if type(value) is list and len(value) <= RECENT_RUNS and all(_ref_well_formed(item) for item in value):
        return tuple(Run(*item) for item in value)
    _history_log.warning(
        "zkbeat: a ledger entry holds a 'recent' runs record zkbeat cannot read (%.200s); "
        "reading it as no recent runs (the entry's state is kept)",
        brief(value),
    )
    return ()


def reference_decode_state(raw: bytes | None) -> EntryState:
    data = json_object(
        raw, any_depth=True
    )  # zkbeat's one reader of JSON found in ZooKeeper, which the fast path leaves as it is
    count = data.get("total_run_count", 0)
    epoch = data.get("epoch")
    if not isinstance(count, int) or isinstance(count, bool) or count < 0:
        raise ValueError(f"bad total_run_count {count!r}")
    if epoch is not None and (not isinstance(epoch, int) or isinstance(epoch, bool)):
        raise ValueError(f"bad epoch {epoch!r}")
    last_run_at = _ref_parse_time(data.get("last_run_at"))
    if last_run_at is None:
        raise ValueError("missing last_run_at")
    return EntryState(
        last_run_at=last_run_at,
        total_run_count=count,
        epoch=epoch,
        updated_at=_ref_parse_time(data.get("updated_at")),
        slot=_ref_parse_time(data.get("slot")),
        paused=_ref_decode_pause(data.get("paused")),
        manual=data["manual"] if isinstance(data.get("manual"), str) else None,
        early=_ref_decode_early(data.get("early")),
        recent=_ref_decode_runs(data.get("recent")),
        source=data["source"] if isinstance(data.get("source"), str) else None,  # added with the field
    )


# --- Comparing outcomes: the value, its repr (types and zones), the error and the warnings. ---


class _Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[tuple[str, int, str]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append((record.name, record.levelno, record.getMessage()))


@contextmanager
def _logged() -> Iterator[list[tuple[str, int, str]]]:
    handler = _Collect()
    logger = logging.getLogger("zkbeat.ledger")
    logger.addHandler(handler)
    try:
        yield handler.lines
    finally:
        logger.removeHandler(handler)


def _outcome(decode: Any, raw: bytes | None) -> tuple[Any, ...]:
    with _logged() as lines:
        try:
            state = decode(raw)
        except Exception as exc:  # noqa: BLE001 - the error is the outcome compared
            return ("error", type(exc), str(exc), tuple(lines))
    return ("state", state, repr(state), tuple(lines))


def assert_decodes_as_before(raw: bytes | None) -> None:
    expected = _outcome(reference_decode_state, raw)
    got = _outcome(decode_state, raw)
    assert got == expected
    if got[0] == "state":
        assert type(got[1]) is EntryState
    # decode_answer: the same state, or no state with the same unreadable reason; never an exception.
    read = decode_answer((raw, "stat"))
    assert type(read) is ReadAnswer and read.stat == "stat"
    if expected[0] == "state":
        assert read.unreadable is None and repr(read.state) == expected[2]
    else:
        assert read.state is None and (type(read.unreadable), str(read.unreadable)) == expected[1:3]


# --- Generated states, as encode_state writes them. ---

_zones = st.just(timezone.utc) | st.builds(
    timezone, st.timedeltas(min_value=timedelta(hours=-23, minutes=-59), max_value=timedelta(hours=23, minutes=59))
)
_times = st.datetimes(min_value=datetime(1971, 1, 1), max_value=datetime(9998, 12, 31)) | st.datetimes(
    min_value=datetime(1971, 1, 1), max_value=datetime(9998, 12, 31), timezones=_zones
)
_runs = st.builds(
    Run,
    slot_ms=st.integers(min_value=0, max_value=_LAST_MS - 1) | st.integers(),
    late_ms=st.integers(min_value=-1000, max_value=10**7) | st.integers(),
    replica=st.text(max_size=MAX_REPLICA) | st.text(min_size=MAX_REPLICA, max_size=MAX_REPLICA + 2),
    epoch=st.integers(),
    kind=st.sampled_from(KINDS) | st.text(max_size=9),
)
_states = st.builds(
    EntryState,
    last_run_at=_times,
    total_run_count=st.integers(min_value=0),
    epoch=st.none() | st.integers(),
    updated_at=st.none() | _times,
    slot=st.none() | _times,
    paused=st.none() | st.builds(Pause, by=st.text(), at=st.none() | _times, note=st.text()),
    manual=st.none() | st.text(),
    early=st.lists(st.tuples(_times, _times), max_size=3).map(tuple),
    recent=st.lists(_runs, max_size=RECENT_RUNS + 1).map(tuple),
    source=st.none() | st.text(),
)

_quiet = settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@_quiet
@given(_states)
def test_what_encode_state_writes_decodes_as_before(state: EntryState) -> None:
    """Any state encode_state writes (zones, pauses, early spans, runs good and bad) decodes as the reference does."""
    raw = encode_state(state)
    assert_decodes_as_before(raw)
    # The common shape takes the fast path (else this test would compare the reference with itself).
    assert store._decode_written(raw) is not None


# --- Odd but valid JSON, and data zkbeat cannot decode. ---

_T = "2026-01-01T12:00:00.123456+00:00"
_odd_times = st.sampled_from(
    [
        _T,
        "2026-01-01T12:00:00+00:00",
        "2026-01-01T12:00:00Z",
        "2026-01-01T12:00:00-00:00",
        "2026-01-01T13:30:00+01:30",
        "2026-01-01 12:00:00+00:00",
        "2026-01-01T12:00:00",
        "2026-01-01",
        "20260101T120000+0000",
        "9999-12-31T23:59:59-01:00",
        "not a time",
        "",
    ]
)
_odd_scalars = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=4)
_odd_values = st.recursive(
    _odd_scalars | _odd_times,
    lambda children: st.lists(children, max_size=6) | st.dictionaries(st.text(max_size=4), children, max_size=3),
    max_leaves=12,
)
_odd_runs = st.lists(
    st.lists(
        st.integers(min_value=-5, max_value=_LAST_MS + 5) | _odd_scalars | st.sampled_from(KINDS),
        min_size=4,
        max_size=6,
    )
    | st.tuples(
        st.integers(min_value=0, max_value=_LAST_MS),
        st.integers(),
        st.text(max_size=66),
        st.integers(),
        st.sampled_from(KINDS),
    ).map(list),
    max_size=RECENT_RUNS + 1,
)
_odd_records = st.fixed_dictionaries(
    {},
    optional={
        "last_run_at": _odd_times | _odd_values,
        "total_run_count": st.integers(min_value=-2) | _odd_values,
        "epoch": st.integers() | _odd_values,
        "updated_at": st.none() | _odd_times | _odd_values,
        "slot": st.none() | _odd_times | _odd_values,
        "paused": st.none()
        | st.fixed_dictionaries({}, optional={"by": st.text(max_size=3) | _odd_values, "at": _odd_times | _odd_values})
        | _odd_values,
        "manual": st.none() | st.text(max_size=5) | _odd_values,
        "source": st.none() | st.text(max_size=5) | _odd_values,
        "early": st.none() | st.lists(st.lists(_odd_times, min_size=1, max_size=3), max_size=3) | _odd_values,
        "recent": st.none() | _odd_runs | _odd_values,
        "shard_owner": _odd_values,
    },
)


def _dumped(data: Any, style: str) -> bytes:
    text = {
        "sorted": json.dumps(data, sort_keys=True),
        "compact": json.dumps(data, separators=(",", ":")),
        "indented": json.dumps(data, indent=2),
        "ascii-off": json.dumps(data, ensure_ascii=False),
    }[style]
    return text.encode("utf-8")


_wrappers = st.sampled_from(["{}", " {}", "{}\n", "\ufeff{}", "{}x", "{}{{}}", "[{}]"])


@_quiet
@given(_odd_records, st.sampled_from(["sorted", "compact", "indented", "ascii-off"]), _wrappers)
def test_odd_records_decode_as_before(data: dict[str, Any], style: str, wrapper: str) -> None:
    """Missing, extra, null and mistyped fields, naive and other zones' times, blanks around: as the reference."""
    body = _dumped(data, style).decode("utf-8")
    assert_decodes_as_before(wrapper.replace("{}", body, 1).encode("utf-8"))


@_quiet
@given(st.binary(max_size=64) | _odd_values.map(lambda value: json.dumps(value).encode()))
def test_foreign_data_decodes_as_before(raw: bytes) -> None:
    """Bytes and JSON zkbeat never wrote: the same error (or, rarely, the same state) as the reference."""
    assert_decodes_as_before(raw)


_ONE_RUN = b'{"last_run_at": "2026-01-01T12:00:00+00:00", "recent": [[%d, %d, "%s", 3, "scheduled"]]}'
_RUNS = b'{"last_run_at": "2026-01-01T12:00:00+00:00", "recent": [%s]}'
_HAND_WRITTEN = [
    None,
    b"",
    b"[" * 100_000 + b"]" * 100_000,
    b'{"last_run_at": "2026-01-01T12:00:00+00:00", "later": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
    b'{"last_run_at": "2026-01-01T12:00:00+00:00", "recent": ' + b'{"a": ' * 50_000 + b"1" + b"}" * 50_000 + b"}",
    b"\xff not zkbeat's",
    b'{"last_run_at": "2026-01-01T12:00:00+00:00"',
    b"null",
    b"[]",
    b'"2026-01-01T12:00:00+00:00"',
    b"NaN",
    b"{}",
    b'{"last_run_at": null}',
    b'{"last_run_at": 12345}',
    b'{"last_run_at": "2026-01-01T12:00:00"}',
    b'{"last_run_at": "2026-01-01T12:00:00+00:00"}',
    b'{"last_run_at": "2026-01-01T13:00:00+01:00", "updated_at": "2026-01-01T12:00:00Z", "slot": null}',
    b'{"last_run_at": "2026-01-01T12:00:00+00:00", "updated_at": 7}',
    b'{"last_run_at": "2026-01-01T12:00:00+00:00", "slot": "2026-01-01T12:00:00"}',
    b'{"last_run_at": "2026-01-01T12:00:00+00:00", "slot": "soon"}',
    b'{"last_run_at": "2026-01-01T12:00:00+00:00", "total_run_count": true}',
    b'{"last_run_at": "2026-01-01T12:00:00+00:00", "total_run_count": 1.0}',
    b'{"last_run_at": "2026-01-01T12:00:00+00:00", "total_run_count": -1}',
    b'{"last_run_at": "2026-01-01T12:00:00+00:00", "total_run_count": Infinity}',
    b'{"last_run_at": "2026-01-01T12:00:00+00:00", "total_run_count": null}',
    b'{"last_run_at": "2026-01-01T12:00:00+00:00", "total_run_count": 99999999999999999999999}',
    b'{"last_run_at": "2026-01-01T12:00:00+00:00", "epoch": false}',
    b'{"last_run_at": "2026-01-01T12:00:00+00:00", "epoch": 1.5}',
    b'{"last_run_at": "2026-01-01T12:00:00+00:00", "epoch": -3}',
    b'{"epoch": 1, "epoch": "x", "last_run_at": "2026-01-01T12:00:00+00:00"}',
    b'{"epoch": "x", "epoch": 1, "last_run_at": "2026-01-01T12:00:00+00:00"}',
    b'{"last_run_at": "2026-01-01T12:00:00+00:00", "paused": {"by": "ops"}}',
    b'{"last_run_at": "2026-01-01T12:00:00+00:00", "paused": {"by": "ops", "at": "bad", "note": "n"}}',
    b'{"last_run_at": "2026-01-01T12:00:00+00:00", "paused": {"by": 1}}',
    b'{"last_run_at": "2026-01-01T12:00:00+00:00", "paused": "yes"}',
    b'{"last_run_at": "2026-01-01T12:00:00+00:00", "paused": false}',
    b'{"last_run_at": "2026-01-01T12:00:00+00:00", "manual": 5}',
    b'{"last_run_at": "2026-01-01T12:00:00+00:00", "manual": "req-0000000001"}',
    b'{"last_run_at": "2026-01-01T12:00:00+00:00", "source": 5}',
    b'{"last_run_at": "2026-01-01T12:00:00+00:00", "source": "12@2026-01-01T11:59:00.123456+00:00"}',
    b'{"last_run_at": "2026-01-01T12:00:00+00:00", "early": []}',
    b'{"last_run_at": "2026-01-01T12:00:00+00:00", "early": "x"}',
    b'{"last_run_at": "2026-01-01T12:00:00+00:00", "early": {"ab": 1}}',
    b'{"last_run_at": "2026-01-01T12:00:00+00:00", "early": [["2026-01-01T12:01:00+00:00", "2026-01-01T12:00:00Z"]]}',
    b'{"last_run_at": "2026-01-01T12:00:00+00:00", "early": [["2026-01-01T12:05:00+00:00",'
    b' "2026-01-01T12:06:00+00:00"], ["2026-01-01T12:00:00+01:00", "2026-01-01T12:00:00+00:00"]]}',
    b'{"last_run_at": "2026-01-01T12:00:00+00:00", "recent": []}',
    b'{"last_run_at": "2026-01-01T12:00:00+00:00", "recent": {}}',
    b'{"last_run_at": "2026-01-01T12:00:00+00:00", "recent": [[1, 2, "r", 3, "manual"]]}',
    b'{"last_run_at": "2026-01-01T12:00:00+00:00", "recent": [[1, 2, "r", true, "manual"]]}',
    b'{"last_run_at": "2026-01-01T12:00:00+00:00", "recent": [[1, -2, "r", 3, "manual"]]}',
    b'{"last_run_at": "2026-01-01T12:00:00+00:00", "recent": [[1, 2, "r", 3, "manual", 4]]}',
    b'{"last_run_at": "2026-01-01T12:00:00+00:00", "recent": ["12345"]}',
    b'{"last_run_at": "2026-01-01T12:00:00+00:00", "recent": [[253402300799999, 1, "r", 3, "scheduled"]]}',
    b'{"last_run_at": "2026-01-01T12:00:00+00:00", "recent": [[1.0, 2, "r", 3, "catch-up"]]}',
    b'{"last_run_at": "2026-01-01T12:00:00+00:00", "recent": [[1, 2, ["r"], 3, "catch-up"]]}',
    b'{"last_run_at": "2026-01-01T12:00:00+00:00", "recent": [[1, 2, "r", 3, ["manual"]]]}',
    b'{"last_run_at": "2026-01-01T12:00:00+00:00", "recent": [[1, 2, "r", 3, "manual"]], "later": {"x": [1]}}',
    *(
        _ONE_RUN % (slot, late, replica)
        for slot, late, replica in [
            (_LAST_MS - 1, 0, b"r"),
            (_LAST_MS, 0, b"r"),
            (_LAST_MS - 2, 1, b"r"),
            (_LAST_MS - 2, 2, b"r"),
            (0, 0, b"r"),
            (5, -5, b"r"),
            (5, -6, b"r"),
            (-1, 1, b"r"),
            (1, 2, b"x" * MAX_REPLICA),
            (1, 2, b"x" * (MAX_REPLICA + 1)),
            (1, 2, b"\\u00e9" * MAX_REPLICA),
        ]
    ),
    _RUNS % b", ".join([b'[1, 2, "r", 3, "manual"]'] * RECENT_RUNS),
    _RUNS % b", ".join([b'[1, 2, "r", 3, "manual"]'] * (RECENT_RUNS + 1)),
    b' {"last_run_at": "2026-01-01T12:00:00+00:00"} ',
    b'\xef\xbb\xbf{"last_run_at": "2026-01-01T12:00:00+00:00"}',
    b'{"last_run_at": "2026-01-01T12:00:00+00:00"} x',
    b'{"last_run_at": "2026-01-01T12:00:00+00:00"}{}',
    b'{"last_run_at": "2026-01-01T12:00:00+00:00", }',
    b'{"last_run_at": "2026-01-01T12:00:00+00:00\xed\xa0\x80"}',
    b'{"last_run_at": "2026-01-01T12:00:00+00:00", "manual": "\\ud800"}',
    b'{"last_run_at": "0001-01-01T00:00:00+00:00"}',
    b'{"last_run_at": "0001-01-01T00:00:00+01:00"}',
    b'{"last_run_at": "9999-12-31T23:59:59-01:00"}',
]


@pytest.mark.parametrize("raw", _HAND_WRITTEN, ids=range(len(_HAND_WRITTEN)))
def test_hand_written_znodes_decode_as_before(raw: bytes | None) -> None:
    """Older layouts, naive and other zones' times, bad fields, not UTF-8, not zkbeat's JSON: as the reference."""
    assert_decodes_as_before(raw)


@example(state=EntryState(last_run_at=datetime(2026, 1, 1, tzinfo=timezone.utc)))
@_quiet
@given(_states)
def test_a_decoded_state_is_a_plain_entry_state(state: EntryState) -> None:
    """The fast path builds the same EntryState as the reference: equal, the same fields in the same order, Runs."""
    decoded = decode_state(encode_state(state))
    reference = reference_decode_state(encode_state(state))
    assert decoded == reference and decoded.__dict__ == reference.__dict__
    assert list(decoded.__dict__) == list(reference.__dict__)
    assert all(type(run) is Run for run in decoded.recent)


_OUT_OF_RANGE = ["0001-01-01T00:00:00+01:00", "9999-12-31T23:59:59-01:00"]


@pytest.mark.parametrize("time", _OUT_OF_RANGE)
def test_a_time_out_of_range_in_utc_is_a_bad_time_not_an_overflow(time: str) -> None:
    """Before year 1 or after 9999 once in UTC: unreadable, a pause kept without its time, early spans ignored.

    The old decoder raised OverflowError (not a ValueError) for each: out of
    decode_answer and Ledger.load, so a leader could not take over its shard.
    """
    with pytest.raises(OverflowError):
        _old_parse_time(time)
    ok = "2026-01-01T12:00:00+00:00"
    for field in ("last_run_at", "updated_at", "slot"):
        raw = json.dumps({"last_run_at": ok, field: time}).encode()
        read = decode_answer((raw, "stat"))
        assert read is not None and read.state is None and isinstance(read.unreadable, ValueError)
    paused = decode_state(json.dumps({"last_run_at": ok, "paused": {"by": "ops", "at": time}}).encode())
    assert paused.paused == Pause(by="ops", at=None)
    early = decode_state(json.dumps({"last_run_at": ok, "early": [[time, time]]}).encode())
    assert early.early == () and early.last_run_at == datetime(2026, 1, 1, 12, tzinfo=timezone.utc)


def test_the_reference_still_matches_the_shape_of_the_state() -> None:
    """Guard for the copy above: the fields it builds are EntryState's (a new field would need the reference too)."""
    assert [f for f in EntryState.__dataclass_fields__] == [
        "last_run_at",
        "total_run_count",
        "epoch",
        "updated_at",
        "slot",
        "paused",
        "manual",
        "early",
        "recent",
        "source",
    ]


def test_logged_collects_the_ledger_warnings() -> None:
    """The warning capture sees what the decoders log (else equal logs would prove nothing)."""
    with _logged() as lines:
        decode_state(b'{"last_run_at": "2026-01-01T12:00:00+00:00", "recent": "x"}')
    assert len(lines) == 1 and lines[0][1] == logging.WARNING


@pytest.mark.parametrize("zone", ["+00:00", "+02:00"], ids=["fast-path", "general-path"])
@pytest.mark.parametrize("depth", [65, 100, 500])
def test_a_pause_record_nested_past_max_depth_still_pauses_whichever_path_reads_it(zone: str, depth: int) -> None:
    """A pause record zkbeat cannot read keeps its entry paused (fail closed), however deep it nests.

    The fast path reads such a record as a pause; a znode it leaves to the
    general decoder (a time in another zone) must read the same, not be
    refused whole as "nested too deep" and read as no state: an entry read
    as no state is claimed and published by the next leader.
    """
    raw = json.dumps({"last_run_at": f"2026-01-01T12:00:00{zone}", "paused": "@"})
    raw = raw.replace('"@"', "[" * depth + "]" * depth).encode()
    with _logged() as lines:
        state = decode_state(raw)
    assert state.paused == Pause(by="?", at=None, note="unreadable pause record")
    assert state.last_run_at == datetime(2026, 1, 1, 12, tzinfo=timezone(timedelta(hours=int(zone[1:3])))), state
    assert any(
        "holds a pause record zkbeat cannot read ([[[[" in line[2] and "keeping it paused" in line[2] for line in lines
    )

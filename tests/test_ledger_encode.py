"""The ledger's encoder writes every state byte for byte as the json.dumps encoder it replaced did (pure logic).

Every claim encodes the state of each entry it claims, so the shape claims
write takes a fast path past json.dumps. Whatever the state holds, the
bytes written (or the error raised) must be those of the encoder before
that path: a copy of it is kept below as the reference. A fast path that
forgets an escape, a zone, the cut of the recent runs or a type is caught.
"""

from __future__ import annotations

import enum
import json
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, example, find, given, settings
from hypothesis import strategies as st

from zkbeat.ledger import store
from zkbeat.ledger.history import KINDS, MAX_REPLICA, RECENT_RUNS, Run
from zkbeat.ledger.store import EntryState, Pause, decode_state, encode_state

# --- The reference: encode_state and its helpers as they were before the fast path (copied, not imported). ---


def _ref_iso(value: datetime | None) -> str | None:
    if value is None:
        return None
    if value.tzinfo is None:
        value = value.replace(tzinfo=timezone.utc)
    return value.astimezone(timezone.utc).isoformat()


def _ref_pause(pause: Pause) -> dict[str, Any]:
    return {"by": pause.by, "at": _ref_iso(pause.at), "note": pause.note}


def _ref_runs(recent: Any) -> list[list[Any]]:
    return [list(run) for run in recent[:RECENT_RUNS]]


def reference_encode_state(state: EntryState) -> bytes:
    data: dict[str, Any] = {
        "last_run_at": _ref_iso(state.last_run_at),
        "total_run_count": state.total_run_count,
        "epoch": state.epoch,
        "updated_at": _ref_iso(state.updated_at),
        "slot": _ref_iso(state.slot),
    }
    if state.paused is not None:
        data["paused"] = _ref_pause(state.paused)
    if state.manual is not None:
        data["manual"] = state.manual
    if state.early:
        data["early"] = [[_ref_iso(first), _ref_iso(last)] for first, last in state.early]
    if state.recent:
        data["recent"] = _ref_runs(state.recent)
    if state.source is not None:  # added with the field, as the general path writes it
        data["source"] = state.source
    return json.dumps(data, sort_keys=True).encode()


def _outcome(encode: Any, state: EntryState) -> tuple[Any, ...]:
    try:
        return ("bytes", encode(state))
    except Exception as exc:  # noqa: BLE001 - the error is the outcome compared
        return ("error", type(exc), str(exc))


def _same_as_before(state: EntryState) -> bool:
    return _outcome(encode_state, state) == _outcome(reference_encode_state, state)


def assert_encodes_as_before(state: EntryState) -> None:
    got, expected = _outcome(encode_state, state), _outcome(reference_encode_state, state)
    assert got == expected
    if got[0] == "bytes":
        assert type(got[1]) is bytes


# --- Generated states: what claims write, and everything else a state may hold. ---

_LAST_MS = 253402300800000


class _Count(enum.IntEnum):
    """An int whose text is not its number (format() gives its name): json.dumps writes the number."""

    SEVEN = 7

    def __format__(self, spec: str) -> str:
        return "SEVEN"


class _Stamp(datetime):
    """A datetime subclass with its own text: json.dumps writes what its isoformat says, escaped."""

    def isoformat(self, sep: str = "T", timespec: str = "auto") -> str:
        return 'stamp "' + super().isoformat(sep, timespec) + '" é'


_offsets = st.timedeltas(min_value=timedelta(hours=-23, minutes=-59), max_value=timedelta(hours=23, minutes=59))
_zones = st.just(timezone.utc) | st.builds(timezone, _offsets) | st.timezones()
_plain_times = st.datetimes(min_value=datetime(1971, 1, 1), max_value=datetime(9998, 12, 31))
#: Naive and aware, in any zone, with and without microseconds.
_claim_times = (
    _plain_times
    | st.datetimes(min_value=datetime(1971, 1, 1), max_value=datetime(9998, 12, 31), timezones=_zones)
    | _plain_times.map(lambda t: t.replace(microsecond=0, tzinfo=timezone.utc))
)
#: And near the ends, where turning a time to UTC overflows.
_times = _claim_times | st.datetimes(timezones=_zones)
#: Any character, surrogates and controls included (JSON escapes them), and the ones JSON must escape.
_odd_text = st.text(st.characters(exclude_categories=()), max_size=8) | st.sampled_from(
    ['"', "\\", "\n", "\x00", "\u2028", "é", "\U0001f600", "\ud800", "a\"b'c", ""]
)
_ints = st.integers(min_value=0, max_value=10**6) | st.integers() | st.integers(min_value=2**63, max_value=10**40)
_runs = st.builds(
    Run,
    slot_ms=st.integers(min_value=0, max_value=_LAST_MS - 1) | _ints,
    late_ms=st.integers(min_value=-1000, max_value=10**7) | _ints,
    replica=st.text(max_size=MAX_REPLICA) | _odd_text,
    epoch=_ints,
    kind=st.sampled_from(KINDS) | _odd_text,
)
#: Runs as a claim writes them (Run.of), and runs whose fields are not the types a claim writes.
_odd_runs = _runs | st.builds(
    Run,
    slot_ms=st.booleans() | st.floats() | st.just(_Count.SEVEN) | _ints,
    late_ms=st.booleans() | st.none() | _ints,
    replica=st.integers() | st.none() | _odd_text,
    epoch=st.booleans() | st.just(_Count.SEVEN) | _ints,
    kind=st.integers() | _odd_text,
)
_recent = st.lists(_runs, max_size=RECENT_RUNS + 2).map(tuple)
_odd_recent = (
    st.lists(_odd_runs, max_size=RECENT_RUNS + 2).map(tuple)
    | st.lists(_runs, max_size=3)  # a list, not a tuple
    | st.lists(st.tuples(_ints, _ints, _odd_text, _ints, st.sampled_from(KINDS)), max_size=3).map(tuple)
)
#: The shape every claim writes: no pause, no early spans; a run-now's name or none.
_claimed = st.builds(
    EntryState,
    last_run_at=_claim_times,
    total_run_count=_ints.filter(lambda n: n >= 0),
    epoch=st.none() | _ints,
    updated_at=st.none() | _claim_times,
    slot=st.none() | _claim_times,
    manual=st.none() | _odd_text,
    recent=_recent,
    source=st.none() | _odd_text,
)
_states = _claimed | st.builds(
    EntryState,
    last_run_at=st.none() | _times | st.just(_Stamp(2026, 1, 1, 12, tzinfo=timezone.utc)),
    total_run_count=_ints | st.booleans() | st.just(_Count.SEVEN) | st.floats(),
    epoch=st.none() | _ints | st.booleans() | st.just(_Count.SEVEN),
    updated_at=st.none() | _times | st.just(_Stamp(2026, 1, 1)),
    slot=st.none() | _times,
    paused=st.none() | st.builds(Pause, by=_odd_text, at=st.none() | _times, note=_odd_text),
    manual=st.none() | _odd_text | st.integers(),
    source=st.none() | _odd_text | st.integers(),
    early=st.lists(st.tuples(_times, _times), max_size=3).map(tuple),
    recent=_recent | _odd_recent,
)

_quiet = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@example(EntryState(last_run_at=datetime(2026, 1, 1, tzinfo=timezone.utc)))
@example(EntryState(last_run_at=datetime(9999, 12, 31, 23, 30, tzinfo=timezone(-timedelta(hours=1)))))
@example(EntryState(last_run_at=datetime(2026, 1, 1), total_run_count=10**4400))
@_quiet
@given(_states)
def test_encode_state_writes_what_the_encoder_before_it_wrote(state: EntryState) -> None:
    """Any state (zones, naive times, pauses, early spans, odd runs, odd types, overflows): the same bytes or error."""
    assert_encodes_as_before(state)


@_quiet
@given(_claimed)
def test_what_claims_write_takes_the_fast_path_and_reads_back(state: EntryState) -> None:
    """The shape claims write takes the fast path (else the test above compares the reference with itself)."""
    written = store._encode_claimed(state)
    assert written is not None and written == reference_encode_state(state)
    assert decode_state(written).last_run_at == _ref_utc(state.last_run_at)


def _ref_utc(value: datetime) -> datetime:
    return (value if value.tzinfo is not None else value.replace(tzinfo=timezone.utc)).astimezone(timezone.utc)


_HAND_WRITTEN = [
    EntryState(last_run_at=datetime(2026, 1, 1, 12, 0, 0, 123456, tzinfo=timezone.utc), total_run_count=3, epoch=2),
    EntryState(
        last_run_at=datetime(2026, 1, 1, 12), slot=datetime(2026, 1, 1, 13, tzinfo=timezone(timedelta(hours=1)))
    ),
    EntryState(last_run_at=datetime(2026, 1, 1), total_run_count=True),
    EntryState(last_run_at=datetime(2026, 1, 1), epoch=_Count.SEVEN),
    EntryState(last_run_at=datetime(2026, 1, 1), manual=""),
    EntryState(last_run_at=datetime(2026, 1, 1), manual='req-\u2028"\\\ud800'),
    EntryState(last_run_at=datetime(2026, 1, 1), recent=(Run(1, 2, "r", 3, "manual"),) * (RECENT_RUNS + 1)),
    EntryState(last_run_at=datetime(2026, 1, 1), recent=(Run(1, 2, 'ré\n"', 3, "manual"),)),
    EntryState(last_run_at=datetime(2026, 1, 1), recent=(Run(True, 2, "r", 3, "manual"),)),
    EntryState(last_run_at=datetime(2026, 1, 1), recent=(Run(1, 2.5, "r", 3, "manual"),)),
    EntryState(last_run_at=datetime(2026, 1, 1), recent=(Run(1, float("nan"), "r", 3, "manual"),)),
    EntryState(last_run_at=datetime(2026, 1, 1), recent=(Run(1, 2, 3, 4, "manual"),)),
    EntryState(last_run_at=datetime(2026, 1, 1), recent=((1, 2, "r", 3, "manual"),)),
    EntryState(last_run_at=datetime(2026, 1, 1), recent=[Run(1, 2, "r", 3, "manual")]),  # type: ignore[arg-type]
    EntryState(last_run_at=datetime(2026, 1, 1), recent=(Run(1, 2, "r", 3, object()),)),  # type: ignore[arg-type]
    EntryState(last_run_at=datetime(2026, 1, 1), recent=("12345",)),  # type: ignore[arg-type]
    EntryState(last_run_at=_Stamp(2026, 1, 1, tzinfo=timezone.utc)),
    EntryState(last_run_at="2026-01-01T00:00:00+00:00"),  # type: ignore[arg-type]
    EntryState(last_run_at=None),  # type: ignore[arg-type]
    EntryState(last_run_at=datetime(1, 1, 1, tzinfo=timezone(timedelta(hours=1)))),
    EntryState(last_run_at=datetime(2026, 1, 1), paused=Pause(by="ops", at=None, note="maintenance ☃")),
    EntryState(last_run_at=datetime(2026, 1, 1), early=((datetime(2026, 1, 1), datetime(2026, 1, 2)),)),
]


@pytest.mark.parametrize("state", _HAND_WRITTEN, ids=range(len(_HAND_WRITTEN)))
def test_hand_written_states_encode_as_before(state: EntryState) -> None:
    """Bools, an IntEnum, a datetime subclass, strings for times, odd runs, escapes, overflow: as the reference."""
    assert_encodes_as_before(state)


# --- A fast path broken on purpose is caught by the comparison above. ---


def _no_escapes(text: str) -> str:
    return f'"{text}"'


def _no_zones(value: Any) -> str | None:
    return "null" if value is None else f'"{value.isoformat()}"'


_BREAKS = {
    "strings written unescaped": ("_quote", _no_escapes),
    "times not turned to UTC": ("_time_json", _no_zones),
    "recent runs not cut": ("RECENT_RUNS", RECENT_RUNS + 1),
}


@pytest.mark.parametrize("name", list(_BREAKS))
def test_a_broken_fast_path_is_caught(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each break of the fast path gives a generated state the comparison tells apart from the reference."""
    attribute, broken = _BREAKS[name]
    monkeypatch.setattr(store, attribute, broken)
    unshrunk = settings(_quiet, database=None, derandomize=True, phases=[Phase.explicit, Phase.generate])
    found = find(_states, lambda state: not _same_as_before(state), settings=unshrunk)
    assert store._encode_claimed(found) is not None, "found on the fast path"


_FAR = datetime(1, 1, 1, tzinfo=timezone(timedelta(hours=1)))  # overflows once in UTC


@pytest.mark.parametrize(
    "state",
    [
        EntryState(last_run_at="2026-01-01", updated_at=_FAR),  # type: ignore[arg-type]
        EntryState(last_run_at=datetime(2026, 1, 1).date(), slot=_FAR),  # type: ignore[arg-type]
        EntryState(last_run_at=datetime(2026, 1, 1, tzinfo=timezone.utc), updated_at=1, slot=_FAR),  # type: ignore[arg-type]
    ],
    ids=["str-then-overflow", "date-then-overflow", "int-then-overflow"],
)
def test_a_time_that_is_no_datetime_raises_as_before_even_with_an_overflowing_one_after_it(state: EntryState) -> None:
    """The general path reads last_run_at, updated_at and slot in turn: the first bad one decides the error."""
    assert_encodes_as_before(state)

"""zkbeat._decode.json_object: everything that is not a JSON object is ValueError, whatever json raises for it."""

from __future__ import annotations

import json

import pytest

from tests.support.undecodable import UNDECODABLE
from zkbeat._decode import MAX_DEPTH, brief, json_object


@pytest.mark.parametrize("raw", list(UNDECODABLE.values()), ids=list(UNDECODABLE))
def test_anything_but_a_json_object_is_a_value_error(raw: bytes | None) -> None:
    with pytest.raises(ValueError) as raised:
        json_object(raw)
    assert type(raised.value) is ValueError and raised.value.__cause__ is None
    assert len(str(raised.value)) < 200, "a short reason: it goes into log lines"


def test_nesting_past_the_recursion_limit_says_so() -> None:
    with pytest.raises(ValueError, match="nested too deep"):
        json_object(b"[" * 100_000 + b"]" * 100_000)


@pytest.mark.parametrize("raw", [None, b""])
def test_no_data_reads_as_an_empty_object_only_when_asked(raw: bytes | None) -> None:
    assert json_object(raw, empty_ok=True) == {}
    with pytest.raises(ValueError, match="no data"):
        json_object(raw)


def test_a_json_object_is_returned() -> None:
    assert json_object(b'{"a": [1, {"b": null}]}') == {"a": [1, {"b": None}]}
    # Nesting below the limit (zkbeat's own data is a few levels deep) is read.
    nested = json_object(b'{"a": ' + b"[" * 50 + b"]" * 50 + b"}")["a"]
    for _ in range(49):
        nested = nested[0]
    assert nested == []


def _nested(depth: int, opener: bytes = b"[") -> bytes:
    """An object whose deepest value is ``depth`` containers down (the object itself is the first)."""
    if opener == b"[":
        return b'{"a": ' + b"[" * (depth - 1) + b"]" * (depth - 1) + b"}"
    return b'{"a": ' + b'{"k": ' * (depth - 1) + b"0" + b"}" * (depth - 1) + b"}"


@pytest.mark.parametrize("opener", [b"[", b"{"])
def test_nesting_past_max_depth_is_refused_however_far_below_the_recursion_limit(opener: bytes) -> None:
    """JSON nested MAX_DEPTH containers deep is read; one deeper (and 900 deep, which json.loads reads, but which a
    repr, a log line or a json.dumps deeper in the stack cannot turn back into text) is "nested too deep"."""
    assert json_object(_nested(MAX_DEPTH, opener))
    for depth in (MAX_DEPTH + 1, 900):
        with pytest.raises(ValueError, match="nested too deep"):
            json_object(_nested(depth, opener))


def test_many_brackets_side_by_side_are_not_depth() -> None:
    """Thousands of containers at one level (a long list of runs) are read: only nesting counts."""
    raw = b'{"recent": [' + b", ".join([b'[1, {"b": []}]'] * 5000) + b"]}"
    assert len(json_object(raw)["recent"]) == 5000


def test_brief_stays_a_few_hundred_characters_for_any_value_a_znode_can_hold() -> None:
    """brief() is what the ledger logs of a record it cannot read: a list of lists of strings (180 kB of JSON, well
    under ZooKeeper's 1 MiB) gives a line of a few hundred characters, not one of 140,000."""
    value = [[["x" * 100] * 12] * 12] * 12
    assert len(json.dumps(value)) < 1024 * 1024
    shown = brief(value)
    assert len(shown) <= 400, len(shown)  # "a few hundred characters", as the docstring and CHANGELOG say
    assert shown.startswith("[[['xxxx") and shown.endswith("…")
    assert brief({"by": "op", "note": "n"}) == "{'by': 'op', 'note': 'n'}"  # a small value is shown whole

"""zkbeat._decode.json_object: everything that is not a JSON object is ValueError, whatever json raises for it."""

from __future__ import annotations

import pytest

from tests.support.undecodable import UNDECODABLE
from zkbeat._decode import json_object


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

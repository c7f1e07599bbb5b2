"""Reading JSON that anyone may have written: ZooKeeper's znodes, a request's body.

zkbeat's rule for data it finds in ZooKeeper is that bad data is logged and
survived, never an error that stops a loop, a report or the dashboard. What
``json.loads`` raises is not one exception: bytes that are not UTF-8 raise
UnicodeDecodeError, text that is not JSON ValueError, valid JSON nested past
Python's recursion limit RecursionError, and JSON of the wrong shape (a list,
a number, null where an object belongs) nothing, until its reader calls
``.get`` on it. :func:`json_object` turns every one of them into ValueError.
"""

from __future__ import annotations

import json
from typing import Any

__all__ = ["json_object"]


def json_object(raw: bytes | None, *, empty_ok: bool = False) -> dict[str, Any]:
    """The JSON object ``raw`` holds; ValueError, with a short reason, for anything else.

    ``empty_ok``: no data at all (None, as zkCli's ``create <path>`` leaves
    it, or b"") reads as ``{}`` instead of an error.
    """
    if not raw:
        if empty_ok:
            return {}
        raise ValueError("no data")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ValueError("not UTF-8") from None
    try:
        data = json.loads(text)
    except RecursionError:  # valid JSON, nested deeper than Python's recursion limit
        raise ValueError("JSON nested too deep") from None
    except ValueError as exc:
        raise ValueError(f"not JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ValueError(f"not a JSON object but {type(data).__name__ if data is not None else 'null'}")
    return data

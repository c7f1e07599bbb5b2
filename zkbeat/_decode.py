"""Reading JSON that anyone may have written: ZooKeeper's znodes, a request's body.

zkbeat's rule for data it finds in ZooKeeper is that bad data is logged and
survived, never an error that stops a loop, a report or the dashboard. What
``json.loads`` raises is not one exception: bytes that are not UTF-8 raise
UnicodeDecodeError, text that is not JSON ValueError, valid JSON nested past
Python's recursion limit RecursionError, and JSON of the wrong shape (a list,
a number, null where an object belongs) nothing, until its reader calls
``.get`` on it. :func:`json_object` turns every one of them into ValueError.

It also refuses JSON nested deeper than :data:`MAX_DEPTH`. json.loads reads
nesting up to its recursion limit less the caller's stack (900 deep, say),
but such a value cannot be turned back into text deeper in the stack: the
repr in a log line (logging formats it some ten frames down) or a
json.dumps raises RecursionError there. zkbeat writes nothing nested more
than a few levels, so the cap is far from its own data; and it costs a
znode one pass over its bytes unless it holds more than MAX_DEPTH brackets.
"""

from __future__ import annotations

import json
from typing import Any

__all__ = ["json_object", "too_deep", "MAX_DEPTH"]

#: Containers deepest a JSON value may nest (an object holding a list is 2); zkbeat's own data nests 3 or so.
MAX_DEPTH = 64


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
    if too_deep(raw, data):
        raise ValueError("JSON nested too deep")
    if not isinstance(data, dict):
        raise ValueError(f"not a JSON object but {type(data).__name__ if data is not None else 'null'}")
    return data


def too_deep(raw: bytes, value: Any) -> bool:
    """Whether ``value``, decoded from ``raw``, nests more than MAX_DEPTH containers.

    Looked into only if ``raw`` holds more than MAX_DEPTH opening brackets
    (each level needs one; one in a string only counts for more): a
    ledger's znodes hold a dozen, and cost one pass over their bytes each.
    """
    if len(raw) - len(raw.translate(None, b"[{")) <= MAX_DEPTH:  # one pass; two counts cost half again
        return False
    stack = [(value, 1)]  # a loop, not recursion: the point is not to need the stack
    while stack:
        node, depth = stack.pop()
        if depth > MAX_DEPTH:
            return True
        for child in node.values() if type(node) is dict else node if type(node) is list else ():
            if type(child) is dict or type(child) is list:
                stack.append((child, depth + 1))
    return False

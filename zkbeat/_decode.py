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
than a few levels, so the cap is far from its own data; and it costs one
pass over the bytes, and a walk only of data holding more than MAX_DEPTH
brackets. The ledger's decoders (zkbeat.ledger.store) read a ledger
entry at any depth (the fast one with its own scanner, the general one
with ``any_depth``): what they cannot read is logged with :func:`brief`,
which never goes deeper than a few levels, and no deep value is kept.
"""

from __future__ import annotations

import json
import reprlib
from typing import Any

__all__ = ["json_object", "brief", "cut", "MAX_DEPTH", "BRIEF_MAX"]

#: Containers deepest a JSON value may nest (an object holding a list is 2); zkbeat's own data nests 3 or so.
MAX_DEPTH = 64


def json_object(raw: bytes | None, *, empty_ok: bool = False, any_depth: bool = False) -> dict[str, Any]:
    """The JSON object ``raw`` holds; ValueError, with a short reason, for anything else.

    ``empty_ok``: no data at all (None, as zkCli's ``create <path>`` leaves
    it, or b"") reads as ``{}`` instead of an error. ``any_depth``: no
    MAX_DEPTH cap (still ValueError past the recursion limit), for a reader
    that keeps no deep value and logs one only through :func:`brief` (the
    ledger's general decode: a pause record it cannot read must still pause).
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
    if not any_depth and _too_deep(raw, data):
        raise ValueError("JSON nested too deep")
    if not isinstance(data, dict):
        raise ValueError(f"not a JSON object but {type(data).__name__ if data is not None else 'null'}")
    return data


def _too_deep(raw: bytes, value: Any) -> bool:
    """Whether ``value``, decoded from ``raw``, nests more than MAX_DEPTH containers.

    Looked into only if ``raw`` holds more than MAX_DEPTH opening brackets
    (each level needs one; one in a string only counts for more): what
    zkbeat writes holds a dozen or so.
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


#: Characters of :func:`brief`'s text at most (longer: cut, ending in "…").
BRIEF_MAX = 300

_BRIEF = reprlib.Repr()
_BRIEF.maxlevel, _BRIEF.maxlist, _BRIEF.maxdict, _BRIEF.maxstring, _BRIEF.maxother = 4, 12, 8, 80, 80


def brief(value: Any) -> str:
    """A repr of ``value`` for a log line: at most 4 levels deep and a few hundred characters.

    For data anyone may have written (JSON nested hundreds deep, a huge
    string): ``%r`` of it could overflow the stack inside logging (the line
    lost, or RecursionError where a handler re-raises) or flood the log.
    The levels alone do not bound the length (12 items a level, 4 levels of
    strings: some 140,000 characters from 180 kB of JSON), so the text is cut
    to BRIEF_MAX characters as well.
    """
    return cut(_BRIEF.repr(value), BRIEF_MAX)


def cut(text: str, limit: int) -> str:
    """``text`` in at most ``limit`` characters, the last an ellipsis where it was cut."""
    return text if len(text) <= limit else text[: limit - 1] + "…"

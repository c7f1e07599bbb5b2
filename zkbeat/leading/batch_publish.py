"""Publishing a pass's claimed ticks to Redis in one pipeline, each message from a shape prepared once.

Celery's own path costs a leader ~0.25 ms of CPU a message even when kombu
buffers the writes (routing, settings looked up per call, ``saferepr`` of the
arguments, kombu's entity copies) and ~0.6 ms when it does not (one round trip
per LPUSH). A beat entry sends the same message every tick but for its task
id and zkbeat's slot and epoch headers, so the message is built through
Celery once (:class:`_Capture`: Celery's ``apply_async`` down to kombu's
``Producer.publish``, which hands us its arguments), kept as a
:class:`_Shape`, and every later tick patches the per-tick fields of a copy
and hands it to kombu's channel. Entries that share a task and options
share one shape: only their arguments (serialised once per entry) differ,
so a new leader's first round is fast too. A header option that holds the
entry's own name (django-celery-beat's ``periodic_task_name``) is the
entry's, like its arguments: it does not make a shape of its own. Where the message may differ
from tick to tick in ways only Celery knows (a ``BeatLazyFunc`` argument, a
router function in ``task_routes``), every tick is built through Celery.
Celery's ``before_task_publish`` fires for every message before it is
written, ``after_task_publish`` once Redis answered that it took it (the
first tick's too: Celery's own firing is held back while it is captured).

The messages of a pass are written to Redis together (``_Chunk``), through
redis-py's public connection calls (connect, write all the commands, read
each reply), so that what became of each message is known from where the
write stopped, not guessed from a traceback:

=======================================  =======================================
the failure came                         each message of the chunk
=======================================  =======================================
while connecting (nothing written)       not sent: the claim is withdrawn, the
                                         tick stays due
while writing, or before its reply       may have arrived: counted as sent, never
                                         sent again (at most once)
its reply was read                       sent (an error reply: the broker refused
                                         it, dropped as celery beat would)
=======================================  =======================================

A message longer than the broker's ``proto-max-bulk-len`` is never written
(Redis would close the connection on it, and the commands after it would
not run): it is dropped alone, as the per-message path would lose it.
Chunks after a failed one are not tried (not sent). The batch path is used
only where kombu (5.7 or later) offers a Redis publish batch on a
connection that never replays a write by itself (``supports_batch_publish``);
anywhere else (RabbitMQ, older kombu, ``global_keyprefix``, sent events,
compression) each tick goes through :class:`zkbeat.leading.publisher.Publisher` one at
a time, as before.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import os
import pickle
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from json.encoder import encode_basestring_ascii
from typing import Any

from celery import signals
from kombu.serialization import dumps

from ..ticking.ticks import ENTRY_OPTIONS, uuid_text
from ..ticking.ticks import HEADER_ENTRY as _ENTRY_HEADER
from ..ticking.ticks import HEADER_SLOT as _SLOT_HEADER

__all__ = [
    "SENT", "UNCERTAIN", "UNSENT", "REFUSED", "TOO_LARGE", "CHUNK", "Outcome", "can_batch", "BatchSender", "Send",
    "publish_many",
]  # fmt: skip

logger = logging.getLogger(__name__)

#: What became of one message of a batch.
SENT = "sent"
UNCERTAIN = "uncertain"
UNSENT = "unsent"
REFUSED = "refused"
#: Longer than the broker takes (``proto-max-bulk-len``): never written.
TOO_LARGE = "too large"
Outcome = str

#: Messages written to Redis in one go: large enough that a round trip is
#: paid once per thousand, small enough that the first go out while the rest
#: are prepared and a failure leaves at most this many uncertain.
CHUNK = 1000

#: Shapes kept per task (one per distinct set of entry options): a bound for
#: schedules whose entries come and go, each with options of its own.
SHAPES_PER_TASK = 64

#: Redis's own default ``proto-max-bulk-len`` (512 MB), the limit assumed
#: where ``CONFIG GET`` is not allowed.
BULK_LIMIT = 512 * 1024 * 1024


def can_batch(app: Any, producer: Any) -> bool:
    """Whether ticks can go out on this producer's channel as one Redis pipeline (see the module docstring)."""
    conf = app.conf
    if conf.task_send_sent_event or conf.task_compression or conf.task_protocol != 2:
        return False
    if signals.task_sent.receivers:  # Celery's deprecated signal: its path sends it
        return False
    try:
        channel = producer.channel
        transport = producer.connection.transport
    except Exception:  # noqa: BLE001 - an unknown producer: the per-message path
        return False
    if getattr(transport, "driver_type", None) != "redis":
        return False
    if getattr(channel, "create_publish_batch", None) is None or not getattr(channel, "supports_batch_publish", False):
        return False
    if getattr(channel, "global_keyprefix", None):
        return False
    return getattr(channel, "client", None) is not None


@dataclass
class _Shape:
    """What Celery built for a message of one task with one set of options, minus the per-tick fields."""

    task: str
    #: The entry's own options as they were, its named headers marked (shapes are shared by equality, type for
    #: type and in order: :func:`_identical`).
    options: dict
    #: Headers (of the entry's ``headers`` option) that hold the entry's own name (:func:`_shape_options`).
    named: tuple[str, ...]
    headers: dict
    properties: dict
    embed: dict
    exchange: str
    routing_key: str
    declare: list
    retry_policy: dict
    serializer: str
    priority: int
    mandatory: bool
    #: The header ``root_id`` is the task id (a beat send outside any task).
    own_root: bool
    #: The shape's message with every entry's and tick's fields cut out (:class:`_ShapeTemplate`), once found.
    template: _ShapeTemplate | None = None
    #: Entries whose first message was looked at for :attr:`template`: given up after SHAPE_TEMPLATE_TRIES.
    template_tries: int = 0
    #: The headers and properties hold plain values only (:func:`_plain_tree`), once looked at.
    plain: bool | None = None
    #: :attr:`embed` holds plain values only, once looked at (every entry's body holds it).
    embed_plain: bool | None = None


@dataclass
class _Body:
    """One entry's arguments, serialised once."""

    args: Any
    kwargs: Any
    shape: _Shape
    body: tuple
    data: bytes
    content_type: str
    content_encoding: str
    argsrepr: str
    kwargsrepr: str
    #: The entry's message as written, with gaps for the per-tick fields (after its first tick).
    template: _Template | None = None
    #: :attr:`body` holds plain values only (:func:`_plain_tree`), once looked at.
    plain: bool | None = None


@dataclass
class _Template:
    """An entry's Redis commands as kombu wrote them, the task id, slot and delivery tag cut out.

    Filled in per tick by joining strings: no dicts, no JSON encoding. Made
    only when each cut-out value occurs exactly where it is expected (the
    task id in ``id``, ``root_id`` and ``correlation_id``; the slot and the
    tag once), so that a value that happens to appear elsewhere (in the
    arguments) cannot be patched by mistake.
    """

    #: zkbeat's headers other than the slot, as they were (the epoch: one term's).
    extra: dict
    head: tuple
    parts: list[str]
    gaps: list[int]
    rest: list[tuple]

    @classmethod
    def of(cls, commands: list[tuple], task_id: str, slot: str, message: dict, extra: dict) -> _Template | None:
        tag = message.get("properties", {}).get("delivery_tag")
        if not commands or commands[0][0] != "LPUSH" or not isinstance(commands[0][2], str) or not tag:
            return None
        if any(command[0] != "PEXPIRE" for command in commands[1:]):
            return None  # routed to more than one queue: each copy is its own message
        payload = commands[0][2]
        expected = message["headers"].get("root_id") == task_id
        cut = _cut(payload, [task_id, slot, tag], [3 if expected else 2, 1, 1])
        if cut is None:
            return None
        template = cls({**extra, _SLOT_HEADER: None}, commands[0][:2], cut[0], cut[1], list(commands[1:]))
        if template.commands(task_id, slot, tag)[0][2] != payload:
            return None
        return template

    def commands(self, task_id: str, slot: str, tag: str) -> list[tuple]:
        values = (task_id, slot, tag)
        parts = self.parts
        out = [parts[0]]
        for gap, part in zip(self.gaps, parts[1:]):
            out.append(values[gap])
            out.append(part)
        return [(*self.head, "".join(out)), *self.rest]


#: Entries of one shape whose first message is looked at for the shape's template before giving up on it.
SHAPE_TEMPLATE_TRIES = 3


def _cut(payload: str, values: Sequence[str], counts: Sequence[int]) -> tuple[list[str], list[int]] | None:
    """``payload`` cut around each occurrence of ``values``: (the parts between, which value each gap held).

    None unless each value occurs exactly as often as ``counts`` says and no
    two occurrences overlap: then every occurrence found is the field it
    stands for, never the same text elsewhere in the message by chance.
    """
    found = []
    for gap, value in enumerate(values):
        if not value:
            return None
        start = payload.find(value)
        while start >= 0:
            found.append((start, gap))
            start = payload.find(value, start + len(value))
    found.sort()
    parts, gaps, end = [], [], 0
    for start, gap in found:
        if start < end:
            return None  # overlapping values: not a message we can patch
        parts.append(payload[end:start])
        gaps.append(gap)
        end = start + len(values[gap])
    parts.append(payload[end:])
    seen = [0] * len(values)
    for gap in gaps:
        seen[gap] += 1
    return (parts, gaps) if seen == list(counts) else None


def _json_text(value: Any) -> str | None:
    """A string as kombu's JSON encoder writes it (``ensure_ascii``, quoted); None for anything else."""
    return encode_basestring_ascii(value) if type(value) is str else None


@dataclass
class _ShapeTemplate:
    """A shape's Redis commands with every entry's fields cut out too: an entry's first message without kombu.

    Entries of one shape differ only in their arguments (the body, and the
    ``argsrepr`` and ``kwargsrepr`` headers) and their name (zkbeat's entry
    header), besides the per-tick fields of :class:`_Template`. Cut from an
    entry's first message as kombu wrote it (each value found exactly where
    it is expected, as for :class:`_Template`), it is checked against the
    message kombu writes for a second entry before any entry's first
    message is made from it; until then, and wherever it does not apply (a
    ``before_task_publish`` receiver changed the headers, other zkbeat
    headers, another body encoding), the entry's first message is kombu's.
    """

    #: zkbeat's headers other than the entry and the slot (the epoch: one term's).
    extra: dict
    content: tuple[str, str]
    encoding: str | None
    head: tuple
    parts: list[str]
    gaps: list[int]
    rest: list[tuple]
    #: It gave kombu's very message for an entry it was not cut from.
    checked: bool = False

    #: Gaps 0, 1, 2 are a tick's (task id, slot, delivery tag); these are the entry's.
    BODY, ARGSREPR, KWARGSREPR, ENTRY = 3, 4, 5, 6

    @classmethod
    def of(
        cls, commands: list[tuple], task_id: str, extra: dict, message: dict, body: _Body, name: str, encoding: Any
    ) -> _ShapeTemplate | None:
        tag = message.get("properties", {}).get("delivery_tag")
        if not commands or commands[0][0] != "LPUSH" or not isinstance(commands[0][2], str) or not tag:
            return None
        if any(command[0] != "PEXPIRE" for command in commands[1:]):
            return None
        text = message.get("body")
        own = _ShapeTemplate._entry_values(body, name, text)
        if own is None:
            return None
        payload = commands[0][2]
        slot = extra[_SLOT_HEADER]
        expected = message["headers"].get("root_id") == task_id
        # The name is in zkbeat's entry header and in each of the shape's named headers.
        counts = [3 if expected else 2, 1, 1, 1, 1, 1, 1 + len(body.shape.named)]
        cut = _cut(payload, [task_id, slot, tag, *own], counts)
        if cut is None:
            return None
        template = cls(
            {k: v for k, v in extra.items() if k not in _ENTRY_FIELDS},
            (body.content_type, body.content_encoding),
            encoding,
            commands[0][:2],
            cut[0],
            cut[1],
            list(commands[1:]),
        )
        made = template.for_entry(body, name, text)
        if made is None or made.commands(task_id, slot, tag)[0][2] != payload:
            return None
        return template

    @staticmethod
    def _entry_values(body: _Body, name: str, text: Any) -> list[str] | None:
        values = [text if type(text) is str else None, _json_text(body.argsrepr), _json_text(body.kwargsrepr),
                  _json_text(name)]  # fmt: skip
        return None if any(value is None for value in values) else values  # type: ignore[misc]

    def applies(self, body: _Body, extra: dict, encoding: Any) -> bool:
        """Whether an entry's first message with these zkbeat headers comes out as this template's."""
        if encoding != self.encoding or (body.content_type, body.content_encoding) != self.content:
            return False
        return {k: v for k, v in extra.items() if k not in _ENTRY_FIELDS} == self.extra

    def for_entry(self, body: _Body, name: str, text: Any) -> _Template | None:
        """The entry's own :class:`_Template` (its body as the channel encodes it: ``text``)."""
        values = self._entry_values(body, name, text)
        if values is None:
            return None
        parts, gaps = [self.parts[0]], []
        for gap, part in zip(self.gaps, self.parts[1:]):
            if gap >= self.BODY:
                parts[-1] += values[gap - self.BODY] + part
            else:
                gaps.append(gap)
                parts.append(part)
        extra = {**self.extra, _ENTRY_HEADER: name, _SLOT_HEADER: None}
        return _Template(extra, self.head, parts, gaps, list(self.rest))


#: zkbeat's headers that differ from entry to entry and tick to tick (cut out of a :class:`_ShapeTemplate`).
_ENTRY_FIELDS = (_ENTRY_HEADER, _SLOT_HEADER)


#: Values copied as they are by a deep copy and by a pickle alike (floats: see _plain_tree).
_PLAIN_ATOMS = frozenset((str, int, bool, type(None), bytes))
#: Deepest nesting :func:`_plain_tree` looks into (deeper: copied by ``copy.deepcopy``).
_PLAIN_DEPTH = 16


def _plain_tree(value: Any, depth: int = 0, seen: set[int] | None = None) -> bool:
    """Whether ``value`` is dicts, lists and tuples of strings, numbers, booleans and None only.

    A pickle round trip copies such a value as ``copy.deepcopy`` does (new
    containers, a container met twice copied once) at a third of the cost.
    A NaN is not plain: a deep copy keeps the very float, equal to itself
    inside a container, where a pickled one is unequal. A container met
    again (``seen``: shared, or a cycle) is looked at once, as pickle and
    ``copy.deepcopy`` copy it once: walking every path to it is exponential
    in the nesting of shared containers.
    """
    kind = type(value)
    if kind in _PLAIN_ATOMS:
        return True
    if kind is float:
        return value == value
    if kind is not dict and kind is not list and kind is not tuple:
        return False
    if depth >= _PLAIN_DEPTH:
        return False
    if seen is None:
        seen = set()
    elif id(value) in seen:
        return True  # its verdict is part of the answer already (a False one ends the walk)
    seen.add(id(value))
    if kind is dict:
        return all(_plain_tree(k, depth + 1, seen) and _plain_tree(v, depth + 1, seen) for k, v in value.items())
    return all(_plain_tree(item, depth + 1, seen) for item in value)


#: Deepest nesting :func:`_identical` compares (deeper: taken as different).
_IDENTICAL_DEPTH = 64


#: Types whose ``==`` tells values of the same type apart exactly (floats: ``-0.0 == 0.0``).
_EXACT_ATOMS = frozenset((str, int, bool, type(None), bytes))


def _identical(a: Any, b: Any, seen: dict[int, Any] | None = None, depth: int = 0) -> bool:
    """Whether ``a`` and ``b`` are equal with the same type at every level (``True``, ``1`` and ``1.0`` differ).

    What Celery writes for a value depends on its type (JSON ``true``, ``1``,
    ``1.0``), where ``==`` does not tell them apart; floats are compared by
    ``repr`` too (``-0.0`` is not ``0.0``), dicts in their order (the order
    they are written in). A container met again (shared, or a cycle) is
    compared once (``seen``: with what it was paired first). A value of any
    other type is identical only to itself.
    """
    if a is b:
        return True
    kind = type(a)
    if kind is not type(b):
        return False
    if kind in _EXACT_ATOMS:
        return bool(a == b)
    if kind is float:
        return repr(a) == repr(b)
    if kind is dict or kind is list or kind is tuple:
        if len(a) != len(b) or depth >= _IDENTICAL_DEPTH:
            return False
        if not a:
            return True
        if seen is None:
            seen = {}
        else:
            paired = seen.get(id(a))
            if paired is not None:
                return paired is b
        seen[id(a)] = b
        pairs = zip(a.items(), b.items()) if kind is dict else (((x, None), (y, None)) for x, y in zip(a, b))
        for (x, u), (y, v) in pairs:
            # The common case inline (a string, a number): a call for each value would cost more than ``==``.
            if x is not y:
                kind = type(x)
                if kind is not type(y) or not (x == y if kind in _EXACT_ATOMS else _identical(x, y, seen, depth + 1)):
                    return False
            if u is not v:
                kind = type(u)
                if kind is not type(v) or not (u == v if kind in _EXACT_ATOMS else _identical(u, v, seen, depth + 1)):
                    return False
        return True
    if kind is set or kind is frozenset:
        # Each element against each: a failed pairing must not be remembered (a fresh ``seen`` for each).
        return len(a) == len(b) and all(any(_identical(x, y, None, depth + 1) for y in b) for x in a)
    # Anything else (a Signature or another dict subclass, a Decimal, a datetime) is the same only as itself:
    # its ``==`` is looser than what is written for it (Decimal("1.0") == Decimal("1.00"), one instant in two
    # zones), so two such values are never taken for one, and Celery builds what they make.
    return False


def _fresh(headers: dict, properties: dict, plain: bool = False) -> tuple[dict, dict, Any]:
    """Deep copies of a message's headers and properties for the receivers, and what tells a change by
    (:func:`_unchanged`).

    ``plain`` (both hold plain values only, :func:`_plain_tree`): one copy,
    made by pickling, told by its pickle (which writes every value with its
    type). Values that cannot be copied (an object in the entry's options):
    the dicts themselves are copied, and a change inside such a value goes
    unseen.
    """
    if plain:
        try:
            pickled = pickle.dumps((headers, properties), pickle.HIGHEST_PROTOCOL)
            copied = pickle.loads(pickled)
            return copied[0], copied[1], pickled
        except Exception:  # noqa: BLE001 - changed since it was looked at: copied as any other
            pass
    try:
        headers, properties = copy.deepcopy((headers, properties))
        return headers, properties, copy.deepcopy((headers, properties))
    except Exception:  # noqa: BLE001 - never a reason to drop the tick
        return headers, properties, (headers.copy(), properties.copy())


def _unchanged(reference: Any, now: Any) -> bool:
    """Whether ``now`` is what ``reference`` (from :func:`_fresh` or :func:`_fresh_body`) was, type for type.

    A receiver that writes an equal value of another type (``1`` to ``1.0``,
    ``0`` to ``False``, ``0.0`` to ``-0.0``) changes the message Celery
    sends: ``==`` would not tell.
    """
    if type(reference) is bytes:
        try:
            return pickle.dumps(now, pickle.HIGHEST_PROTOCOL) == reference
        except Exception:  # noqa: BLE001 - a receiver put in what pickle cannot write: changed
            return False
    return _identical(reference, now)


def _fresh_body(body: tuple, plain: bool = False) -> tuple[tuple, Any]:
    """A deep copy of a prepared body for the receivers (pickled if ``plain``), and what tells a change by
    (:func:`_unchanged`); the body itself and None if it cannot be copied."""
    if plain:
        try:
            pickled = pickle.dumps(body, pickle.HIGHEST_PROTOCOL)
            return pickle.loads(pickled), pickled
        except Exception:  # noqa: BLE001 - changed since it was looked at: copied as any other
            pass
    try:
        return copy.deepcopy(body), body  # the receivers do not see it
    except Exception:  # noqa: BLE001 - never a reason to drop the tick
        return body, None


def _delivery_tag() -> str:
    """A delivery tag as kombu's ``prepare_message`` makes one (``str(uuid.uuid4())``), at a third of its cost."""
    return uuid_text(os.urandom(16), 4)


def _shape_options(entry: Any) -> tuple[dict, tuple[str, ...]]:
    """The entry's options as its shape knows them, and the headers that hold the entry's own name.

    A header whose value is the entry's name (django-celery-beat names each
    row in ``periodic_task_name``) differs from entry to entry as the name
    does: in the options shapes are shared by it holds a marker in its own
    place (the headers' order is the message's), and each message gets the
    name there (:meth:`BatchSender._patched`).
    """
    options = entry.options or {}
    headers = options.get("headers")
    name = entry.name
    if type(headers) is not dict or type(name) is not str:
        return options, ()
    named = tuple(
        key
        for key, value in headers.items()
        if type(value) is str and value == name and key not in ENTRY_OPTIONS  # zkbeat's own: never sent
    )
    if not named:
        return options, ()
    marked = {key: _OWN_NAME if key in named else value for key, value in headers.items()}
    return {**options, "headers": marked}, named


#: Options, and headers of the ``headers`` option, that Celery writes as the entry gives them, where a shape
#: writes its own per tick (:meth:`BatchSender._patched`): an entry that sets one is sent by Celery.
_OWN_OPTIONS = frozenset(("argsrepr", "kwargsrepr"))
_OWN_HEADERS = frozenset(("id", "root_id", "argsrepr", "kwargsrepr"))


def _headers_of_its_own(entry: Any) -> bool:
    """Whether the entry gives a header a shape writes per tick (hidden arguments' ``argsrepr``, an ``id``)."""
    options = entry.options
    if not options:
        return False
    if not _OWN_OPTIONS.isdisjoint(options):
        return True
    headers = options.get("headers")
    return isinstance(headers, dict) and not _OWN_HEADERS.isdisjoint(headers)


class _OwnName:
    """The marker of a header that holds the entry's own name (:func:`_shape_options`); equal to itself only."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "<the entry's own name>"


_OWN_NAME = _OwnName()


def _same(kept: Any, now: Any) -> bool:
    """The entry still holds the arguments serialised (Celery's next entry makes a new ``{}`` for no kwargs)."""
    return kept is now or (not kept and not now and type(kept) is type(now))


class _Capture:
    """Stands in for beat's producer in Celery's ``apply_async``: keeps what Celery asked kombu to publish.

    Nothing is sent here; the message goes into the batch like every other.
    It is prepared inside ``publish``, as kombu's would be, so that a
    message that cannot be built (arguments that do not serialise) fails
    there. ``publish`` then ends Celery's send with :class:`_Captured`, so
    that Celery does not fire ``after_task_publish`` for a message Redis has
    not taken yet: the batch fires it, with Celery's arguments, once Redis
    took it, as for every later tick.
    """

    def __init__(self, producer: Any, sender: BatchSender, entry: Any) -> None:
        self._producer = producer
        self._sender = sender
        self._entry = entry
        self.pending: _Pending | None = None
        #: The message as Celery built it, before the ``before_task_publish`` receivers ran (see _Unsignalled).
        self.unsignalled = _Unsignalled()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._producer, name)

    def publish(self, body: Any, **kwargs: Any) -> None:
        pending = self._sender.capture(self._entry, {"body": body, **kwargs}, self._producer, self.unsignalled)
        pending.after = {
            "sender": self._entry.task,
            "body": body,
            "headers": kwargs.get("headers"),
            "exchange": kwargs.get("exchange"),
            "routing_key": kwargs.get("routing_key"),
        }
        self.pending = pending
        raise _Captured


class _Unsignalled:
    """The headers, properties and body of one message as Celery built them, before ``before_task_publish``'s receivers.

    Receivers change a message in place (a header set where missing, a
    keyword argument added): what Celery publishes for an entry's first tick
    carries their changes, but a shape kept from it would carry them into
    every later message, where the receivers run again on Celery's own
    headers. While a first tick is built (:meth:`first`) this is connected as
    the signal's first receiver and copies the message it is handed.
    """

    def __init__(self) -> None:
        #: The task id of the message to copy (another thread's messages are not it).
        self.task_id: str | None = None
        #: Other receivers were connected: the message Celery publishes is not the one it built.
        self.others = False
        #: (headers, properties, body) as they were before the receivers, once seen.
        self.seen: tuple[dict, dict, Any] | None = None
        #: The entities to declare as Celery listed them, before the receivers (who may add to the list).
        self.declare: list = []

    def record(
        self, headers: Any = None, properties: Any = None, body: Any = None, declare: Any = None, **_: Any
    ) -> None:
        if self.seen is not None or not isinstance(headers, dict) or headers.get("id") != self.task_id:
            return
        try:
            self.seen = copy.deepcopy((headers, dict(properties or {}), body))
            self.declare = list(declare or [])
        except Exception:  # noqa: BLE001 - not copied: no shape is kept from this message
            self.seen = None

    @contextlib.contextmanager
    def first(self) -> Iterator[None]:
        """This object the first of the signal's receivers for the ``with`` block (not connected if none are)."""
        signal = signals.before_task_publish
        self.others = bool(signal.receivers)
        if not self.others:
            yield
            return
        uid = f"zkbeat.batch_publish.unsignalled.{id(self)}"
        signal.connect(self.record, weak=False, dispatch_uid=uid)
        try:
            try:
                with signal.lock:
                    mine = [item for item in signal.receivers if item[0][0] == uid]
                    others = [item for item in signal.receivers if item[0][0] != uid]
                    signal.receivers[:] = mine + others
                    signal.sender_receivers_cache.clear()
            except Exception:  # noqa: BLE001 - Celery's Signal changed: not first, so never trusted as such
                self.task_id = None
            yield
        finally:
            signal.disconnect(self.record, dispatch_uid=uid)


class _Captured(BaseException):  # noqa: N818 - not an error: it passes Celery's ``except Exception``
    """Ends Celery's send once its message is captured, before Celery announces it as published."""


@dataclass
class _Pending:
    """A message prepared for the pipeline: its commands and its signal arguments."""

    commands: list[tuple]
    after: dict | None = None


class _Recorder:
    """kombu's batch hook on the Redis channel (``_publish_batch``): collects a message's final commands."""

    def __init__(self) -> None:
        self.commands: list[tuple] = []

    def add(self, name: str, *args: Any) -> None:
        self.commands.append((name.upper(), *args))


@dataclass
class BatchSender:
    """Prepared shapes and one pass's pipeline; one per term (see the module docstring)."""

    app: Any
    shapes: dict[str, list[_Shape]] = field(default_factory=dict)
    bodies: dict[str, _Body] = field(default_factory=dict)
    _routes_static: bool | None = None
    #: The broker's longest bulk string (``proto-max-bulk-len``), asked once a term.
    bulk_limit: int | None = None
    #: Celery's argsrepr and kwargsrepr sizes and task_repr_maxlevels, read once a batch (:meth:`new_batch`).
    _repr_limits: tuple[int, int, int] | None = None

    def new_batch(self) -> None:
        """A batch of ticks is prepared: the settings kept for one batch are read again."""
        self._repr_limits = None

    # -- preparing ----------------------------------------------------------

    def prepared(self, entry: Any) -> _Body | None:
        """The entry's serialised arguments under a known shape, or None if Celery must build its message."""
        if not self._static_routes():
            return None  # a router function may answer differently at every send: Celery routes each tick
        if _headers_of_its_own(entry):
            return None  # the entry sets headers the shape writes per tick: Celery writes them its way
        body = self.bodies.get(entry.name)
        if body is not None and _same(body.args, entry.args) and _same(body.kwargs, entry.kwargs):
            shape = body.shape
            if shape.task == entry.task and _identical((shape.options, shape.named), _shape_options(entry)):
                return body
        shape = self._shape_for(entry)
        if shape is None:
            return None
        body = self._serialise(entry, shape)
        if body is not None:
            self.bodies[entry.name] = body
        return body

    def _shape_for(self, entry: Any) -> _Shape | None:
        options = _shape_options(entry)
        for shape in self.shapes.get(entry.task, ()):
            if _identical((shape.options, shape.named), options):
                return shape if self._shareable(entry) else None
        return None

    def _static_routes(self) -> bool:
        """Whether Celery's routing gives a task the same answer at every send (only ``task_routes`` maps)."""
        if self._routes_static is None:
            from celery.app.routes import MapRoute

            self._routes_static = all(isinstance(route, MapRoute) for route in self.app.amqp.routes)
        return self._routes_static

    def _shareable(self, entry: Any) -> bool:
        """Whether an entry can take another entry's shape: Celery's routing and checks do not read its arguments."""
        if not self._static_routes():
            return False
        task = self.app.tasks.get(entry.task)
        if task is not None and task.typing:
            try:
                task.__header__(*(entry.args or ()), **(entry.kwargs or {}))
            except TypeError:
                return False  # Celery's own path raises it, and the tick is dropped as celery beat drops it
            except Exception:  # noqa: BLE001 - a task without a signature to check
                pass
        return True

    def _serialise(self, entry: Any, shape: _Shape) -> _Body | None:
        from celery.app.task import Task
        from celery.beat import BeatLazyFunc

        args, kwargs = entry.args or (), entry.kwargs or {}
        if not isinstance(args, (list, tuple)) or not isinstance(kwargs, dict):
            return None
        if any(isinstance(value, BeatLazyFunc) for value in (*args, *kwargs.values())):
            return None  # evaluated on every tick by Celery's path
        task = self.app.tasks.get(entry.task)
        if task is not None and (getattr(task, "pydantic", False) or type(task).shadow_name is not Task.shadow_name):
            return None  # the message depends on the arguments in ways only Celery's path knows
        args = list(args)  # as celery.beat sends them
        limits = self._repr_limits
        if limits is None:
            # Celery reads these at every send; a batch's messages are sent together.
            amqp = self.app.amqp
            limits = self._repr_limits = (
                amqp.argsrepr_maxsize,
                amqp.kwargsrepr_maxsize,
                self.app.conf.task_repr_maxlevels,
            )
        args_max, kwargs_max, levels = limits
        body = (args, kwargs, shape.embed)
        content_type, content_encoding, data = dumps(body, serializer=shape.serializer)
        return _Body(
            entry.args,
            entry.kwargs,
            shape,
            body,
            data,
            content_type,
            content_encoding,
            _saferepr(args or (), args_max, levels),  # Celery's as_task_v2: ``args or ()``
            _saferepr(kwargs, kwargs_max, levels),
        )

    def capture(self, entry: Any, published: dict, producer: Any, unsignalled: _Unsignalled | None = None) -> _Pending:
        """Keep the shape of what Celery built for ``entry`` and prepare that message for the pipeline.

        The message is the one Celery publishes (after the ``before_task_publish``
        receivers); the shape is kept from the message as Celery built it,
        before them (``unsignalled``), since the receivers run again on every
        later message. Where that is not known and receivers ran, no shape is kept.
        """
        body = published["body"]
        headers = dict(published.get("headers") or {})
        known = {
            "body", "exchange", "routing_key", "serializer", "compression", "retry", "retry_policy",
            "delivery_mode", "declare", "headers", "timeout", "confirm_timeout", "priority", "mandatory",
            "immediate", "content_type", "content_encoding", "expiration",
        }  # fmt: skip
        properties = {name: value for name, value in published.items() if name not in known}
        exchange, delivery_mode = producer._delivery_details(
            published.get("exchange") or producer.exchange, published.get("delivery_mode")
        )
        properties["delivery_mode"] = delivery_mode
        declare = list(published.get("declare") or [])
        for entity in declare:
            producer.maybe_declare(entity)  # once per queue and connection (kombu remembers), as Celery's path
        serializer = published.get("serializer") or producer.serializer or "json"
        static = (
            not published.get("compression")
            and not published.get("content_type")
            and published.get("expiration") is None
            and headers.get("eta") is None
            and headers.get("expires") is None
            and isinstance(body, tuple)
            and len(body) == 3
        )
        kept_headers, kept_properties, embed = headers, properties, body[2] if static else {}
        if unsignalled is not None and unsignalled.others:
            # Receivers ran: the shape is the message before them (they run again on every later message).
            before = unsignalled.seen
            if before is None or not isinstance(before[2], tuple) or len(before[2]) != 3:
                static = False  # not seen before them: this entry's later messages are built by Celery too
            else:
                kept_headers = before[0]
                declare = unsignalled.declare  # what a receiver added was for that message only
                kept_properties = {name: value for name, value in before[1].items() if name not in known}
                kept_properties["delivery_mode"] = delivery_mode
                embed = before[2][2] if static else {}
        elif static and signals.after_task_publish.receivers:
            # Celery's headers and embed go to the after_task_publish receivers: what they write into them must not
            # reach the entries that take this shape.
            try:
                kept_headers, embed = copy.deepcopy((kept_headers, embed))
            except Exception:  # noqa: BLE001 - not copied: this entry's later messages are built by Celery too
                static = False
        options, named = _shape_options(entry)
        shape = _Shape(
            task=entry.task,
            options=dict(options),
            named=named,
            headers=kept_headers,
            properties=kept_properties,
            embed=embed,
            exchange=exchange,
            routing_key=published.get("routing_key") or producer.routing_key,
            declare=declare,
            retry_policy=published.get("retry_policy") or {},
            serializer=serializer,
            priority=published.get("priority") or 0,
            mandatory=bool(published.get("mandatory")),
            own_root=kept_headers.get("root_id") == kept_headers.get("id"),
        )
        if static and shape.own_root and self._static_routes():
            serialised = self._serialise(entry, self._keep(shape))
            if serialised is not None:
                self.bodies[entry.name] = serialised
        content_type, content_encoding, data = dumps(body, serializer=serializer)
        if published.get("compression"):
            from kombu.compression import compress

            data, headers["compression"] = compress(data, published["compression"])
        channel = producer.channel
        message = channel.prepare_message(data, shape.priority, content_type, content_encoding, headers, properties)
        return _Pending(self._record(channel, message, shape))

    def _keep(self, shape: _Shape) -> _Shape:
        """The kept shape for ``shape``'s task and options: the one already kept (the first wins, as
        :meth:`_shape_for` finds it), else ``shape``, the oldest of the task's dropped past SHAPES_PER_TASK."""
        kept = self.shapes.setdefault(shape.task, [])
        for known in kept:
            if _identical((known.options, known.named), (shape.options, shape.named)):
                return known
        kept.append(shape)
        if len(kept) > SHAPES_PER_TASK:
            del kept[0]  # entries that took it keep it in their bodies; new ones capture again
        return shape

    def forget_except(self, names: Any) -> None:
        """Drop the prepared bodies of entries not in ``names`` (the schedule): they left it."""
        gone = [name for name in self.bodies if name not in names]
        for name in gone:
            del self.bodies[name]

    def message(self, entry: Any, body: _Body, task_id: str, extra: dict, channel: Any) -> _Pending:
        """The next tick of a prepared entry: the shape's copy with this tick's task id and headers.

        From its second tick on, an entry's message is its first one's bytes
        with the task id, slot and kombu's delivery tag put in their places
        (:class:`_Template`), unless a ``before_task_publish`` receiver changed
        the headers, properties or body Celery's signal hands it (each a fresh
        copy, as Celery builds each message's own).
        """
        shape = body.shape
        slot = extra.get(_SLOT_HEADER)
        before = signals.before_task_publish.receivers
        after = signals.after_task_publish.receivers
        template = body.template
        if template is None and slot is not None:
            template = self._from_shape(entry, body, extra, channel)  # its first tick: without kombu, if it can
        usable = template is not None and template.extra == {**extra, _SLOT_HEADER: None}
        headers = properties = None
        before_unchanged = not before  # the headers are the shape's: no receiver changed them
        sending, data = body.body, body.data
        if before or after or not usable:
            headers, properties = self._patched(body, task_id, extra)
        if before:
            assert headers is not None and properties is not None
            # Values of their own (Celery's ``stamps``, ``timelimit``, a dict in the entry's headers option) are
            # fresh in every message Celery builds: a receiver that writes into one changes this message only,
            # and that change is seen below, as a change of a header itself is.
            # The body too is Celery's own for each message (a new list and dicts): a receiver may add to it.
            headers, properties, sent, sending, told = self._fresh_message(body, headers, properties, extra)
            signals.before_task_publish.send(
                sender=shape.task,
                body=sending,
                exchange=shape.exchange,
                routing_key=shape.routing_key,
                declare=list(shape.declare),  # Celery gives each message a list of its own
                headers=headers,
                properties=properties,
                retry_policy=dict(shape.retry_policy),
            )
            before_unchanged = _unchanged(sent, (headers, properties))
            if told is not None and not _unchanged(told, sending):
                before_unchanged = False
                data = dumps(sending, serializer=shape.serializer)[2]  # as kombu serialises Celery's body
            usable = usable and before_unchanged
        elif after:
            # Celery hands the receivers the message's own body and headers: never the shape's (shared by the
            # entries that take it) nor the entry's kept body.
            assert headers is not None and properties is not None
            headers, properties, _, sending, _ = self._fresh_message(body, headers, properties, extra)
        if usable:
            assert template is not None
            pending = _Pending(template.commands(task_id, slot, _delivery_tag()))
            body.template = template
        else:
            assert headers is not None and properties is not None
            message = channel.prepare_message(
                data, shape.priority, body.content_type, body.content_encoding, headers, properties
            )
            pending = _Pending(self._record(channel, message, shape))
            if body.template is None and slot is not None and before_unchanged:
                # Not from a message a receiver changed: a later tick it leaves alone must not carry the change.
                body.template = _Template.of(pending.commands, task_id, slot, message, extra)
                if body.template is not None:
                    self._learn_shape(entry, body, pending.commands, task_id, extra, message, channel)
        if after:
            pending.after = {
                "sender": shape.task,
                "body": sending,
                "headers": headers,
                "exchange": shape.exchange,
                "routing_key": shape.routing_key,
            }
        return pending

    @staticmethod
    def _fresh_message(body: _Body, headers: dict, properties: dict, extra: dict) -> tuple[dict, dict, Any, tuple, Any]:
        """Fresh copies of a message's headers, properties and body for the signals' receivers, each with what tells
        a change by (:func:`_fresh`, :func:`_fresh_body`)."""
        shape = body.shape
        if shape.plain is None:
            shape.plain = _plain_tree((shape.headers, shape.properties))
        if body.plain is None:
            kept = body.body
            if len(kept) == 3 and kept[2] is shape.embed:
                # The embed is the shape's, in every entry's body: looked at once.
                if shape.embed_plain is None:
                    shape.embed_plain = _plain_tree(shape.embed, 1)
                body.plain = shape.embed_plain and _plain_tree(kept[0], 1) and _plain_tree(kept[1], 1)
            else:
                body.plain = _plain_tree(kept)
        plain = shape.plain and all(type(value) in _PLAIN_ATOMS for value in extra.values())
        headers, properties, sent = _fresh(headers, properties, plain)
        sending, told = _fresh_body(body.body, body.plain)
        return headers, properties, sent, sending, told

    def _from_shape(self, entry: Any, body: _Body, extra: dict, channel: Any) -> _Template | None:
        """The entry's template made from its shape's (:class:`_ShapeTemplate`), once that one is checked."""
        shaped = body.shape.template
        encoding = getattr(channel, "body_encoding", None)
        if shaped is None or not shaped.checked or not shaped.applies(body, extra, encoding):
            return None
        return shaped.for_entry(body, entry.name, channel.encode_body(body.data, encoding)[0])

    def _learn_shape(
        self, entry: Any, body: _Body, commands: list[tuple], task_id: str, extra: dict, message: dict, channel: Any
    ) -> None:
        """From an entry's first message as kombu wrote it: cut its shape's template, or check the one cut."""
        shape = body.shape
        if shape.template_tries >= SHAPE_TEMPLATE_TRIES or (shape.template is not None and shape.template.checked):
            return
        encoding = getattr(channel, "body_encoding", None)
        slot = extra[_SLOT_HEADER]
        if shape.template is None:
            shape.template_tries += 1
            shape.template = _ShapeTemplate.of(commands, task_id, extra, message, body, entry.name, encoding)
            return
        made = (
            shape.template.for_entry(body, entry.name, message.get("body"))
            if shape.template.applies(body, extra, encoding)
            else None
        )
        tag = message.get("properties", {}).get("delivery_tag")
        if made is not None and made.commands(task_id, slot, tag)[0][2] == commands[0][2]:
            shape.template.checked = True
        else:
            shape.template_tries += 1
            shape.template = None  # not kombu's message for another entry: cut again from the next

    @staticmethod
    def _patched(body: _Body, task_id: str, extra: dict) -> tuple[dict, dict]:
        shape = body.shape
        headers = shape.headers.copy()
        for key in shape.named:
            headers[key] = extra[_ENTRY_HEADER]  # the entry's own name, where the shape's entry had its own
        headers["id"] = task_id
        if shape.own_root:
            headers["root_id"] = task_id
        headers["argsrepr"] = body.argsrepr
        headers["kwargsrepr"] = body.kwargsrepr
        headers.update(extra)
        properties = shape.properties.copy()
        properties["correlation_id"] = task_id
        return headers, properties

    @staticmethod
    def _record(channel: Any, message: dict, shape: _Shape) -> list[tuple]:
        recorder = _Recorder()
        channel.basic_publish(
            message, exchange=shape.exchange, routing_key=shape.routing_key, mandatory=shape.mandatory,
            immediate=False, _publish_batch=recorder,
        )  # fmt: skip
        return recorder.commands  # none: an exchange that routes it nowhere, as kombu would

    # -- sending -------------------------------------------------------------

    def send(
        self,
        channel: Any,
        messages: Sequence[_Pending],
        writing: Callable[[], None] | None = None,
        retry_policy: dict | None = None,
    ) -> tuple[list[Outcome], BaseException | None]:
        """Write ``messages`` to Redis at once; what became of each (the table in the module docstring).

        ``writing`` is called once the connection is up, just before the
        first byte is written: from then on every message may have arrived.
        Connecting (nothing sent yet) is retried as ``retry_policy`` (the
        app's ``task_publish_retry_policy``, when ``task_publish_retry``)
        says, its errback called before each retry as kombu calls it; what
        was written is never written again. A message longer than the
        broker's ``proto-max-bulk-len`` is never written (TOO_LARGE): Redis
        would close the connection on it, taking the messages after it along.
        ``after_task_publish`` fires for every message whose reply said it
        was taken, whatever stopped the rest.
        Returns the outcomes and the error that stopped the write, if any.
        """
        from redis.exceptions import BusyLoadingError, ResponseError

        outcomes = [UNSENT] * len(messages)
        if not messages:
            return outcomes, None
        pool = channel.client.connection_pool
        try:
            connection = _connect(pool, retry_policy)
        except Exception as exc:  # noqa: BLE001 - nothing was written: all unsent
            return outcomes, exc
        loading: BaseException | None = None
        try:
            if self.bulk_limit is None:
                self.bulk_limit = _bulk_limit(connection)
            limit = self.bulk_limit
            written = []
            for index, pending in enumerate(messages):
                if _too_large(pending.commands, limit):
                    outcomes[index] = TOO_LARGE
                else:
                    written.append(index)
            packed = connection.pack_commands([command for i in written for command in messages[i].commands])
            if writing is not None:
                writing()
            for index in written:
                outcomes[index] = UNCERTAIN
            connection.send_packed_command(packed, check_health=False)
            for index in written:
                outcome = SENT
                for _ in messages[index].commands:
                    try:
                        connection.read_response()
                    except BusyLoadingError as exc:
                        # Redis's answer while it loads its data after a restart: this command did not run.
                        outcome, loading = UNSENT, exc
                    except ResponseError:
                        outcome = REFUSED if outcome == SENT else outcome
                outcomes[index] = outcome
        except BaseException as exc:
            connection.disconnect()
            pool.release(connection)
            _announce(messages, outcomes)  # the replies read before the cut: those messages went out
            if isinstance(exc, Exception):
                return outcomes, exc
            raise
        pool.release(connection)
        _announce(messages, outcomes)
        return outcomes, loading


def _announce(messages: Sequence[_Pending], outcomes: Sequence[Outcome]) -> None:
    """Celery's ``after_task_publish`` for each message Redis said it took."""
    for pending, outcome in zip(messages, outcomes):
        if pending.after is not None and outcome == SENT:
            signals.after_task_publish.send(**pending.after)


def _too_large(commands: list[tuple], limit: int) -> bool:
    """Whether an argument of ``commands`` is longer than ``limit`` bytes once encoded (Redis reads each whole)."""
    for command in commands:
        for arg in command:
            if isinstance(arg, str):
                # A character is at most 4 bytes of UTF-8: encode only what may be near the limit.
                if len(arg) * 4 > limit and len(arg.encode()) > limit:
                    return True
            elif isinstance(arg, bytes) and len(arg) > limit:
                return True
    return False


def _bulk_limit(connection: Any) -> int:
    """The broker's ``proto-max-bulk-len``; Redis's default where ``CONFIG GET`` is refused (ACLs, renamed)."""
    from redis.exceptions import ResponseError

    connection.send_command("CONFIG", "GET", "proto-max-bulk-len")
    try:
        reply = connection.read_response()
    except ResponseError:
        return BULK_LIMIT
    values = list(reply.values()) if isinstance(reply, dict) else list(reply or [])[1::2]
    try:
        return int(values[0])
    except (IndexError, TypeError, ValueError):
        return BULK_LIMIT


#: Longest the batch path keeps reconnecting under a retry policy without a bound (kombu's would never stop).
CONNECT_WAIT = 5.0


def _connect(pool: Any, policy: dict | None) -> Any:
    """A connection of ``pool``, (re)connected and health-checked, retried as ``policy`` says (see send())."""
    tries = 0
    deadline = time.monotonic() + CONNECT_WAIT
    while True:
        try:
            try:
                connection = pool.get_connection()
            except TypeError:  # redis-py before 5.x names the command
                connection = pool.get_connection("LPUSH")
            try:
                # redis-py's PING on a connection idle past health_check_interval, before anything is written.
                connection.check_health()
            except BaseException:
                connection.disconnect()
                pool.release(connection)
                raise
            return connection
        except Exception as exc:
            if policy is None:
                raise
            limit = policy.get("max_retries")
            if (limit is not None and tries >= limit) or time.monotonic() >= deadline:
                raise
            start, step, most = (
                policy.get("interval_start", 2),
                policy.get("interval_step", 2),
                policy.get("interval_max", 30),
            )
            interval = min(start + step * tries, most, max(0.0, deadline - time.monotonic()))
            errback = policy.get("errback")
            if errback is not None:
                errback(exc, interval)
            tries += 1
            time.sleep(interval)


@dataclass(frozen=True)
class Send:
    """One claimed tick to publish in a batch: its entry, slot and a callback once its write begins."""

    entry: Any
    slot: Any


def publish_many(
    publisher: Any,
    sender: BatchSender,
    sends: Sequence[Send],
    producer: Any,
    writing: Callable[[Sequence[int]], None],
) -> list[bool]:
    """Publish ``sends`` through ``sender``; for each, False only if nothing was sent (the claim is withdrawn).

    The per-tick policy of :meth:`zkbeat.leading.publisher.Publisher.publish` holds
    for each message: sent or "may have arrived" counts as run (the latter
    logged, never sent again), a message the broker can never take is
    dropped as celery beat drops it, and one that was not sent stays due.
    ``writing(indices)`` is told which sends may go out from now on, before
    their first byte is written (zkbeat.leading.term marks them as being sent).
    """
    from ..ticking.ticks import HEADER_ENTRY, HEADER_EPOCH, HEADER_SLOT, message_options, task_id_for
    from . import publisher as publisher_module
    from .broker import is_broker_error
    from .publisher import MAYBE_ARRIVED

    broker = publisher.broker
    root = publisher.settings.root
    epoch = publisher.epoch
    results = [False] * len(sends)
    conf = broker.app.conf
    policy = dict(conf.task_publish_retry_policy or {}) if conf.task_publish_retry else None
    channel = producer.channel
    verbose = logger.isEnabledFor(logging.INFO)
    sending = logging.getLogger("zkbeat.leading.publisher")
    say = _quick_line(sending, "Scheduler: Sending due task %s (%s) slot %s epoch %s")
    sender.new_batch()
    for start in range(0, len(sends), CHUNK):
        chunk = range(start, min(start + CHUNK, len(sends)))
        messages: list[_Pending] = []
        indices: list[int] = []
        task_ids: list[str] = []
        for index in chunk:
            send = sends[index]
            entry, slot = send.entry, send.slot
            slot_text = slot.isoformat()
            if say is not None:
                say(entry.name, entry.task, slot_text, epoch)
            task_id = task_id_for(root, entry.name, slot, slot_text)
            try:
                body = sender.prepared(entry)
                if body is not None:
                    extra = {HEADER_ENTRY: entry.name, HEADER_SLOT: slot_text, HEADER_EPOCH: epoch}
                    pending = sender.message(entry, body, task_id, extra, channel)
                else:
                    options = message_options(entry, root, slot, epoch)
                    if "confirm_timeout" in options and not publisher_module.HAS_CONFIRM_TIMEOUT:
                        publisher_module._warn_confirm_timeout(entry.name)
                    pending = _through_celery(broker, sender, entry, options, producer)
            except Exception as exc:  # noqa: BLE001 - a message that cannot be built must not end beat
                publisher.metrics.publish_error()
                if is_broker_error(exc, broker.made_connection()):
                    logger.error("zkbeat: could not publish %s (slot %s): %r", entry.name, slot_text, exc)
                    publisher._unreachable(time.monotonic())
                    broker.forget()
                    return results  # this and the rest: not sent, withdrawn
                logger.error(
                    "zkbeat: %s (slot %s) cannot be sent and is dropped, as celery beat would: %r",
                    entry.name,
                    slot_text,
                    exc,
                )
                results[index] = True
                continue
            messages.append(pending)
            indices.append(index)
            task_ids.append(task_id)
        started = time.monotonic()
        outcomes, error = sender.send(channel, messages, lambda indices=indices: writing(indices), policy)
        for index, task_id, outcome in zip(indices, task_ids, outcomes):
            entry, slot = sends[index].entry, sends[index].slot
            if outcome == SENT:
                publisher.metrics.published()
                results[index] = True
            elif outcome == UNCERTAIN:
                publisher.metrics.publish_uncertain()
                logger.error(
                    "zkbeat: the publish of %s (slot %s, task id %s) got no answer (%r): it %s, and is not "
                    "sent again (at most once); look for that task id in the queue or the worker's log",
                    entry.name,
                    slot.isoformat(),
                    task_id,
                    error,
                    MAYBE_ARRIVED,
                )
                results[index] = True
            elif outcome == REFUSED:
                publisher.metrics.publish_error()
                logger.error(
                    "zkbeat: %s (slot %s) was refused by the broker and is dropped, as celery beat would",
                    entry.name,
                    slot.isoformat(),
                )
                results[index] = True
            elif outcome == TOO_LARGE:
                publisher.metrics.publish_error()
                logger.error(
                    "zkbeat: %s (slot %s) is longer than the broker takes (proto-max-bulk-len %d bytes) and is "
                    "dropped, as celery beat would",
                    entry.name,
                    slot.isoformat(),
                    sender.bulk_limit,
                )
                results[index] = True
            else:
                publisher.metrics.publish_error()
        if error is not None:
            unsent = sum(1 for outcome in outcomes if outcome == UNSENT)
            uncertain = sum(1 for outcome in outcomes if outcome == UNCERTAIN)
            logger.error(
                "zkbeat: a batch of %d publishes failed (%r): %d not sent and %d not tried (they stay due), %d %s",
                len(messages),
                error,
                unsent,
                len(sends) - chunk.stop,
                uncertain,
                MAYBE_ARRIVED,
            )
            publisher._unreachable(started)
            broker.forget()
            return results
        if verbose:
            logger.debug("zkbeat: %d publishes written to the broker in one go (epoch %s)", len(messages), epoch)
    return results


#: Types whose repr() is what Celery's saferepr() writes for them (str: see _plain).
_SIMPLE = (int, float, bool, type(None))
#: Longest repr() taken as saferepr()'s: far below any maxsize that truncates.
_QUICK_REPR_MAX = 256


def _saferepr(value: Any, maxsize: int, levels: int) -> str:
    """Celery's ``saferepr`` of a message's arguments (its argsrepr/kwargsrepr header).

    For a flat list or dict of numbers, booleans, None and plain strings
    (printable, no quote or backslash) short enough not to be truncated,
    saferepr writes what ``repr()`` writes, at a fiftieth of the cost: a
    burst's first ticks serialise every entry's arguments once. Anything
    else is Celery's own.
    """
    from celery.utils.saferepr import saferepr

    items = value.values() if type(value) is dict else value if type(value) in (list, tuple) else None
    if items is not None and levels >= 1 and all(_plain(item) for item in items):
        if type(value) is not dict or all(type(key) is str and _plain(key) for key in value):
            text = repr(value)
            if len(text) <= min(maxsize, _QUICK_REPR_MAX):
                return text
    return saferepr(value, maxsize, maxlevels=levels)


def _plain(value: Any) -> bool:
    if type(value) is str:
        return value.isprintable() and "'" not in value and "\\" not in value
    return type(value) in _SIMPLE


def _quick_line(log: logging.Logger, message: str) -> Callable[..., None] | None:
    """``log.info(message, *args)`` for a line said once per publish, at half its cost; None if INFO is off.

    ``Logger.info`` looks for its caller's frame on every call, about half
    the ~20 µs a line costs; the caller here is always the same, so it is
    looked up once (the record names the line that asked for this function)
    and each line is a record handed to the logger's handlers, as
    ``Logger.info`` hands it: same logger, level, message, arguments,
    filters and record factory.
    """
    if not log.isEnabledFor(logging.INFO):
        return None
    path, line, function, _ = log.findCaller(stacklevel=2)
    name, make, handle = log.name, log.makeRecord, log.handle

    def say(*args: Any) -> None:
        handle(make(name, logging.INFO, path, line, message, args, None, function))

    return say


def _through_celery(broker: Any, sender: BatchSender, entry: Any, options: dict, producer: Any) -> _Pending:
    """Build ``entry``'s message with Celery's ``apply_async`` (its first tick): keep its shape, send nothing yet."""
    from .publisher import _copy

    sending = _copy(entry)
    sending.options = options
    capture = _Capture(producer, sender, entry)
    capture.unsignalled.task_id = options.get("task_id")
    with capture.unsignalled.first():
        try:
            broker.apply_async(sending, producer=capture, advance=False)
        except _Captured:
            pass
    if capture.pending is None:
        raise RuntimeError(f"Celery published nothing for {entry.name!r}")
    return capture.pending

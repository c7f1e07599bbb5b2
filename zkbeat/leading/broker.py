"""Riding out a broker outage with kombu's own retry policy.

A leader must not claim ticks it cannot send: each claim it then has to
withdraw is two ZooKeeper writes and a publish attempt per entry per second,
with beat's shutdown signals held all the while. So before claiming, the
leader asks kombu to (re)establish the broker connection, under kombu's
retry policy (``Connection.ensure_connection``: back-off, a bound on the
total wait), and claims only once that succeeded. While the broker is down
the due ticks simply stay due; when it is back each is published once, late,
or skipped if it is past its misfire grace time.

Establishing a connection is the probe: kombu's Redis transport pings the
server when it builds a channel, whereas ``Connection.connected`` of a
connection built before the outage still says True. That is why a leader
whose publish failed throws the connection away (:func:`forget`), so that the
next wait really asks the broker.

A publish that fails is not always unsent. One that fails while it waits
for the broker's answer (a Redis reply, a RabbitMQ publisher confirm) was
already written: the broker may hold the message. Sending that tick again,
whether by kombu's publish retry or by writing the claim back so that it
stays due, could put it in the queue twice under one task id. Such a tick
counts as sent, at most once (:func:`may_have_arrived`, :func:`guard_retries`).
"""

from __future__ import annotations

import errno
import logging
import socket
import threading
import traceback
from collections.abc import Callable
from typing import Any

from kombu.exceptions import OperationalError

__all__ = [
    "RETRY_POLICY",
    "PUBLISH_TIMEOUTS",
    "PublishUncertainError",
    "wait_for_broker",
    "is_broker_error",
    "may_have_arrived",
    "guard_retries",
    "forget",
    "beat_connection",
    "load_transport",
    "probe",
    "PROBE_TIMEOUT",
]

logger = logging.getLogger(__name__)

#: kombu's retry policy while waiting for the broker: try again at once, then
#: every half second, then every second; a returning broker is used within a
#: second. The total wait per call is bounded by the caller's ``timeout``.
RETRY_POLICY = {"interval_start": 0, "interval_step": 0.5, "interval_max": 1.0}
#: Socket timeouts of beat's own Redis connection when the user set none:
#: kombu's Redis transport has none by default, so a publish to a black-holed
#: broker would block until TCP gives up (many minutes), with beat's
#: shutdown signals held. A healthy Redis answers an LPUSH in a millisecond;
#: 10 s keeps a reply that is merely slow (its timeout leaves the tick
#: uncertain, counted as sent: see may_have_arrived) very unlikely, and
#: bounds the hang to 10 s, since a publish without an answer is not retried. Connecting gets
#: 5 s, so that one attempt fits in a pass's broker wait (zkbeat.leading.publisher.BROKER_WAIT).
PUBLISH_TIMEOUTS = {"socket_timeout": 10.0, "socket_connect_timeout": 5.0}


def wait_for_broker(
    connection: Any, timeout: float, errback: Callable[[Exception, float], None] | None = None
) -> Exception | None:
    """Have kombu (re)connect ``connection`` within ``timeout`` seconds.

    Returns None when the broker answers, else the last error. Never raises a
    connection error: beat must outlive any broker outage.
    """
    try:
        connection.ensure_connection(errback=errback, max_retries=None, timeout=timeout, **RETRY_POLICY)
    except (OperationalError, *_errors(connection)) as exc:
        return exc
    return None


def is_broker_error(exc: BaseException, connection: Any) -> bool:
    """True when ``exc`` (or what it was raised from) says the broker is unreachable.

    Only errors of reaching the broker count: a refused or reset socket, a
    timeout, an unknown host, the client library's own connection errors,
    and kombu's ``OperationalError`` when it wraps one of those (or nothing).
    Transports list broader types among their connection errors (kombu's
    Redis transport lists ``KeyError`` and ``OSError``); taken as outages,
    a task routed to a queue that does not exist (Celery's ``QueueNotFound``
    is a ``KeyError``) would be claimed and withdrawn every second forever.
    Celery wraps a failed publish in ``SchedulingError`` raised inside the
    except block, so the chain is followed through ``__cause__``/``__context__``.
    """
    kinds = _unreachable_kinds(connection)
    chain = _chain(exc)
    if any(_is_unreachable(current, kinds) for current in chain):
        return True
    # kombu raises OperationalError of its own (no cause) when it gives up
    # connecting; one that wraps something else (a KeyError, a nack) is not an outage.
    return any(
        isinstance(current, OperationalError) and current.__cause__ is None and current.__context__ is None
        for current in chain
    )


class PublishUncertainError(Exception):
    """A publish failed after it was written: the broker may have the message, so it is not sent again."""


#: Where a publish hands the message over: kombu's virtual transports (Redis)
#: and py-amqp, with and without confirms.
_PUBLISH_FRAMES = frozenset({"basic_publish", "_basic_publish", "basic_publish_confirm", "_put"})
#: Waiting for the broker's answer to what was written: redis-py's reply to
#: the command (``parse_response``), py-amqp's wait for a publisher confirm
#: (``wait``, called by ``basic_publish_confirm`` itself; the ``wait`` of the
#: ``confirm_select`` it sends first on a new channel is no answer to the
#: message). Not redis-py's PING health check or handshake, which read
#: replies before the command is written, nor the ``drain_events`` that
#: py-amqp's ``_basic_publish`` runs before it writes (it sees a link that
#: RabbitMQ closed or reset while beat was idle).
_ANSWER_FRAMES = frozenset({"parse_response", "wait"})
#: Connection errors that are the broker's answer, not its silence: Redis's
#: ``-LOADING`` (after a restart, until its data is loaded) says the command did not run.
_ANSWER_ERRORS = frozenset({("redis.exceptions", "BusyLoadingError")})
#: (Re)connecting, which sends no message: redis-py's pool and handshake, py-amqp's connect.
_CONNECT_FRAMES = frozenset({"get_connection", "connect", "_connect", "connect_check_health", "on_connect"})


def may_have_arrived(exc: BaseException, connection: Any) -> bool:
    """True when ``exc`` (or what it was raised from) cut off the wait for the broker's answer to a publish.

    Read off the traceback: an error of reaching the broker (a timeout, a
    reset, a closed link: not an answer such as a nack), raised in a publish
    frame below which a frame waits for an answer, with no (re)connect in
    between. Anything else (a refused connection, a failed write, a
    declare, serialising) sent nothing the broker could act on: a write cut
    short leaves an incomplete command or frame, which Redis and RabbitMQ
    both discard. A traceback we cannot read this way counts as unsent.
    """
    kinds = _unreachable_kinds(connection)
    for current in _chain(exc):
        if isinstance(current, PublishUncertainError):
            return True
        if not _is_unreachable(current, kinds) or _is_answer(current):
            continue
        names = [frame.f_code.co_name for frame, _ in traceback.walk_tb(current.__traceback__)]
        publishing = [i for i, name in enumerate(names) if name in _PUBLISH_FRAMES]
        if not publishing:
            continue
        below = names[publishing[-1] + 1 :]
        # py-amqp's confirm wait is the publish frame's own call; a wait further
        # down is another request's (confirm_select on a new channel).
        waiting = [i for i, name in enumerate(below) if name in _ANSWER_FRAMES and (name != "wait" or i == 0)]
        connecting = [i for i, name in enumerate(below) if name in _CONNECT_FRAMES]
        if waiting and not (connecting and connecting[0] < waiting[0]):
            return True
    return False


def guard_retries(
    options: dict[str, Any], connection: Any, default_policy: dict[str, Any] | None = None
) -> dict[str, Any]:
    """``options`` with a retry policy whose errback stops kombu from sending again what may have arrived.

    kombu's publish retry (on by default in Celery) reconnects and sends
    again after any connection error, a lost answer included. The errback
    runs before each retry; raising there ends the retries. A publish that
    failed before it was sent is still retried as the user's policy says,
    and the user's errback (the entry's, else ``task_publish_retry_policy``'s,
    ``default_policy``: Celery lets the entry's errback replace it) still runs.
    """
    policy = dict(options.get("retry_policy") or {})
    theirs = policy.get("errback") or (default_policy or {}).get("errback")

    def errback(exc: BaseException, interval: float) -> None:
        if may_have_arrived(exc, connection):
            raise PublishUncertainError(f"no answer to a publish that was sent: {exc!r}") from exc
        if theirs is not None:
            theirs(exc, interval)

    policy["errback"] = errback
    return {**options, "retry_policy": policy}


#: errno values of an OSError that mean "cannot reach the other side".
_UNREACHABLE_ERRNOS = frozenset(
    {
        errno.ECONNREFUSED,
        errno.ECONNRESET,
        errno.ECONNABORTED,
        errno.EPIPE,
        errno.ETIMEDOUT,
        errno.EHOSTUNREACH,
        errno.ENETUNREACH,
        errno.ENETDOWN,
        errno.EHOSTDOWN,
    }
)


def _chain(exc: BaseException) -> list[BaseException]:
    seen: set[int] = set()
    chain = []
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        chain.append(current)
        current = current.__cause__ or current.__context__
    return chain


def _unreachable_kinds(connection: Any) -> tuple[type[BaseException], ...]:
    """The connection errors of the transport's client library, not builtins like KeyError."""
    try:
        listed = tuple(connection.connection_errors)
    except Exception:  # noqa: BLE001 - a transport that cannot say: rely on the builtins below
        listed = ()
    own = tuple(kind for kind in listed if isinstance(kind, type) and kind.__module__ != "builtins")
    return (ConnectionError, TimeoutError, socket.gaierror, socket.herror, *own)


def _is_answer(exc: BaseException) -> bool:
    return any((kind.__module__, kind.__name__) in _ANSWER_ERRORS for kind in type(exc).__mro__)


def _is_unreachable(exc: BaseException, kinds: tuple[type[BaseException], ...]) -> bool:
    if isinstance(exc, kinds):
        return True
    return type(exc) is OSError and exc.errno in _UNREACHABLE_ERRNOS


def beat_connection(app: Any) -> Any:
    """Beat's broker connection: the app's, plus PUBLISH_TIMEOUTS on Redis where the user set none.

    On Redis ``retry_on_timeout`` is turned off for beat's connection (with
    a warning): redis-py would send an LPUSH whose reply timed out again by
    itself, below kombu and zkbeat, so a reply that was only slow would put
    the tick in the queue twice. Only beat's own connection is changed; the
    app's configuration (and so a worker in the same process) is left as
    the user wrote it.
    """
    connection = app.connection_for_write()
    try:
        is_redis = connection.transport.driver_type == "redis"
    except Exception:  # noqa: BLE001 - an unknown transport: leave it alone
        return connection
    given = app.conf.broker_transport_options or {}
    extra: dict[str, Any] = {name: value for name, value in PUBLISH_TIMEOUTS.items() if given.get(name) is None}
    if is_redis and given.get("retry_on_timeout"):
        if not _warned:
            _warned.add("retry_on_timeout")
            logger.warning(
                "zkbeat: beat's own Redis connection does not use retry_on_timeout: redis-py would send a "
                "publish whose reply timed out again, and a slow reply would queue that tick twice"
            )
        extra["retry_on_timeout"] = False
    if not is_redis or not extra:
        return connection
    connection.release()
    return app.connection_for_write(transport_options=extra)


#: Settings of the user's that beat_connection has warned about (once per process).
_warned: set[str] = set()


def load_transport(app: Any) -> None:
    """Have kombu import the transport of beat's broker now (it keeps the class), not in a leader's first pass.

    Importing kombu's Redis transport and redis-py takes tens of
    milliseconds: in a new leader's first pass, every due tick waited for
    it. The connection made here is an object only (kombu opens nothing
    until it is used) and is dropped. A transport kombu cannot load (an
    unknown scheme, a missing client library) is not reported here: kombu
    keeps no class for it, so the leader's pass meets the same error making
    beat's connection, and handles it as before (an unexpected error).
    """
    try:
        app.connection_for_write().get_transport_cls()
    except Exception:  # noqa: BLE001, S110 - the first pass that needs it reports it
        pass


def forget(scheduler: Any) -> None:
    """Drop beat's cached broker connection and producer, so the next use reconnects.

    The connection is collected, not released: releasing closes channels
    politely, and on py-amqp that waits for the broker's close-ok, forever
    on a link that lost its answers.
    """
    connection = _take_connection(scheduler)
    if connection is not None:
        try:
            connection.collect()
        except Exception:  # noqa: BLE001 - it is broken already; we only let it go
            logger.debug("zkbeat: error releasing the broker connection", exc_info=True)


#: Longest close() waits for the broker to answer the close of beat's
#: connection (a healthy one answers in milliseconds).
CLOSE_TIMEOUT = 2.0


def _take_connection(scheduler: Any) -> Any:
    """Beat's cached broker connection (None if it made none), taken off the scheduler with its producer."""
    scheduler.__dict__.pop("producer", None)
    return scheduler.__dict__.pop("connection", None)


def close_connection(scheduler: Any, timeout: float = CLOSE_TIMEOUT) -> None:
    """At shutdown: close beat's broker connection politely, waiting at most ``timeout`` for the broker.

    Celery's own close releases the connection, and on py-amqp that waits
    for the broker's close-ok with no limit: a RabbitMQ that stops reading
    (a memory or disk alarm blocks publishers; a link that drops every
    packet) would keep the process from ever exiting after its handover.
    The release runs on a daemon thread of its own; past ``timeout`` it is
    left to the process's exit.
    """
    connection = _take_connection(scheduler)
    if connection is None:
        return
    released = threading.Event()

    def release() -> None:
        try:
            connection.release()
        except Exception:  # noqa: BLE001 - shutting down: nothing more is sent on it
            logger.debug("zkbeat: error closing the broker connection", exc_info=True)
        finally:
            released.set()

    threading.Thread(target=release, name="zkbeat-broker-close", daemon=True).start()
    if not released.wait(timeout):
        logger.warning(
            "zkbeat: the broker did not answer the close of beat's connection within %g s; exiting without its answer",
            timeout,
        )


#: Longest a probe of the broker may take, connecting and waiting included (on
#: Redis its socket timeouts are bounded by it too, whatever the user set for
#: beat's own connection: a probe is a question, not a publish). Long enough
#: for a healthy broker across a slow network many times over.
PROBE_TIMEOUT = 3.0


def probe(app: Any, timeout: float = PROBE_TIMEOUT) -> Exception | None:
    """Whether this process reaches the broker now: None if it does, else the error.

    On a connection of its own (beat's is left alone), thrown away after;
    used by zkbeat.coordination.broker_handover to tell a leader's broken link from a
    broker outage.
    """
    connection = app.connection_for_write()
    try:
        is_redis = connection.transport.driver_type == "redis"
    except Exception:  # noqa: BLE001 - an unknown transport: its own timeouts, bounded by kombu's wait
        is_redis = False
    if is_redis:
        connection.release()
        bounded = {"socket_timeout": timeout, "socket_connect_timeout": timeout, "retry_on_timeout": False}
        connection = app.connection_for_write(transport_options=bounded)
    try:
        return wait_for_broker(connection, timeout)
    finally:
        try:
            connection.collect()
        except Exception:  # noqa: BLE001 - it was only a question
            logger.debug("zkbeat: error dropping the probe's broker connection", exc_info=True)


def _errors(connection: Any) -> tuple[type[BaseException], ...]:
    try:
        return tuple(connection.recoverable_connection_errors) + tuple(connection.connection_errors)
    except Exception:  # noqa: BLE001 - a transport that cannot say: rely on OperationalError
        return ()

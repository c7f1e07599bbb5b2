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
"""

from __future__ import annotations

import errno
import logging
import socket
from collections.abc import Callable
from typing import Any

from kombu.exceptions import OperationalError

__all__ = ["RETRY_POLICY", "PUBLISH_TIMEOUTS", "wait_for_broker", "is_broker_error", "forget", "beat_connection"]

logger = logging.getLogger(__name__)

#: kombu's retry policy while waiting for the broker: try again at once, then
#: every half second, then every second; a returning broker is used within a
#: second. The total wait per call is bounded by the caller's ``timeout``.
RETRY_POLICY = {"interval_start": 0, "interval_step": 0.5, "interval_max": 1.0}
#: Socket timeouts of beat's own Redis connection when the user set none:
#: kombu's Redis transport has none by default, so a publish to a black-holed
#: broker would block until TCP gives up (many minutes), with beat's
#: shutdown signals held. A healthy Redis answers an LPUSH in a millisecond;
#: 10 s keeps a reply that is merely slow (whose timeout would make the tick
#: be withdrawn and sent again) very unlikely, and bounds the hang to about
#: 40 s with Celery's default publish retries (4 attempts). Connecting gets
#: 5 s, so that one attempt fits in a pass's broker wait (zkbeat.term.BROKER_WAIT).
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


def _is_unreachable(exc: BaseException, kinds: tuple[type[BaseException], ...]) -> bool:
    if isinstance(exc, kinds):
        return True
    return type(exc) is OSError and exc.errno in _UNREACHABLE_ERRNOS


def beat_connection(app: Any) -> Any:
    """Beat's broker connection: the app's, plus PUBLISH_TIMEOUTS on Redis where the user set none.

    Only beat's own connection gets them; the app's configuration (and so a
    worker in the same process) is left as the user wrote it.
    """
    connection = app.connection_for_write()
    try:
        is_redis = connection.transport.driver_type == "redis"
    except Exception:  # noqa: BLE001 - an unknown transport: leave it alone
        return connection
    given = app.conf.broker_transport_options or {}
    extra = {name: value for name, value in PUBLISH_TIMEOUTS.items() if given.get(name) is None}
    if not is_redis or not extra:
        return connection
    connection.release()
    return app.connection_for_write(transport_options=extra)


def forget(scheduler: Any) -> None:
    """Drop beat's cached broker connection and producer, so the next use reconnects."""
    connection = scheduler.__dict__.pop("connection", None)
    scheduler.__dict__.pop("producer", None)
    if connection is not None:
        try:
            connection.release()
        except Exception:  # noqa: BLE001 - it is broken already; we only let it go
            logger.debug("zkbeat: error releasing the broker connection", exc_info=True)


def _errors(connection: Any) -> tuple[type[BaseException], ...]:
    try:
        return tuple(connection.recoverable_connection_errors) + tuple(connection.connection_errors)
    except Exception:  # noqa: BLE001 - a transport that cannot say: rely on OperationalError
        return ()

"""One way to build a kazoo client from Settings (beat and the CLI share it).

kazoo logs every connection attempt (``Connecting to ...`` at INFO,
``Connection dropped: ... Connection refused`` at WARNING), about twice a
second while ZooKeeper cannot be reached, forever, and none of those lines
says which setting to fix. zkbeat's clients log those lines at DEBUG
instead, and, in beat, :class:`Unreachable` says once every
``REPORT_EVERY`` seconds what they add up to: ``zkbeat_hosts``, the hosts
tried, for how long, and the last error. kazoo's other lines (a session
that expired, a failed authentication) keep their level.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, MutableMapping
from typing import Any

from kazoo.client import KazooClient
from kazoo.exceptions import NoAuthError, NoNodeError
from kazoo.protocol.serialization import Auth
from kazoo.protocol.states import KazooState
from kazoo.retry import KazooRetry
from kazoo.security import ACL, Id, make_acl, make_digest_acl

from ..conf import RECONNECT_MAX_DELAY, Settings

__all__ = ["make_client", "owner_acl", "apply_acl", "Unreachable", "REPORT_EVERY", "REPORT_AFTER"]

logger = logging.getLogger(__name__)

_REDACTED = "<redacted>"
#: Znodes whose ACL ``zkbeat acl`` changes in one pipelined batch.
_ACL_BATCH = 1000
#: Seconds between zkbeat's warnings while ZooKeeper cannot be reached.
REPORT_EVERY = 30.0
#: Seconds ZooKeeper must have been unreachable before the first warning: a
#: member that is down while the next one answers is no outage.
REPORT_AFTER = 5.0
#: kazoo's lines that say an attempt failed, and why (kazoo/protocol/connection.py).
_FAILED = ("Connection dropped: ", "Connection time-out: ", "Cannot resolve ")
#: How each of kazoo's lines about one connection attempt begins.
_ATTEMPT = ("Connecting to ", "Transition to CONNECTING", *_FAILED)


class _RedactCredentials(logging.Filter):
    """Hide credentials in the requests kazoo logs.

    kazoo logs every request it sends at DEBUG, verbatim: the ``Auth`` request
    carries ``user:password`` in clear, and every create carries the digest
    ACL, a SHA-1 of that password which can be cracked offline. Both are
    rewritten in the record's arguments; the requests themselves are untouched.
    A filter runs only for records that pass the level check, so this costs
    nothing unless DEBUG is on.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.args, tuple):
            record.args = tuple(_redact(arg) for arg in record.args)
        return True


def _redact(value: Any) -> Any:
    if isinstance(value, Auth):
        return value._replace(auth=_REDACTED)
    if isinstance(value, Id) and value.scheme == "digest":
        return value._replace(id=value.id.partition(":")[0] + ":" + _REDACTED)
    if isinstance(value, tuple) and hasattr(value, "_fields"):  # kazoo's requests are namedtuples
        return type(value)(*(_redact(item) for item in value))
    if isinstance(value, list):
        return [_redact(item) for item in value]
    return value


#: The logger zkbeat's clients log through: a child of kazoo's own, so kazoo's
#: logging configuration (levels, handlers) applies to it unchanged.
_client_logger = logging.getLogger("kazoo.client.zkbeat")
_client_logger.addFilter(_RedactCredentials())


class Unreachable:
    """Says, once every REPORT_EVERY seconds, that ZooKeeper cannot be reached, and where zkbeat tried.

    Fed by kazoo's own attempt lines (:class:`_ClientLog`, on kazoo's
    connection thread) and by the client's state listener (kazoo's event
    thread); it only records and logs, never calls ZooKeeper. The first
    warning comes at the first failed attempt once ZooKeeper has been
    unreachable for REPORT_AFTER seconds, since the client started or lost
    its connection; a line at INFO says when it answers again.
    """

    def __init__(self, hosts: str, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.hosts = hosts
        self._clock = clock
        self._lock = threading.Lock()
        #: Monotonic time since which ZooKeeper has not answered; None while connected.
        self._since: float | None = clock()
        self._tried: dict[str, None] = {}
        self._error = ""
        self._reported: float | None = None
        #: Warnings logged, for tests.
        self.warnings = 0

    def attempt(self, host: str) -> None:
        """kazoo is connecting to ``host`` (``host:port``)."""
        with self._lock:
            if self._since is not None:
                self._tried[host] = None

    def failed(self, error: str) -> None:
        """An attempt failed with ``error``; warn if it is time to."""
        with self._lock:
            now = self._clock()
            if self._since is None:
                return  # a connection that dropped: the state listener starts the count
            self._error = error
            down = now - self._since
            if down < REPORT_AFTER or (self._reported is not None and now - self._reported < REPORT_EVERY):
                return
            self._reported = now
            self.warnings += 1
            tried = ", ".join(self._tried) or "none resolved"
            error = self._error
        logger.warning(
            "zkbeat: cannot reach ZooKeeper for %.0fs at zkbeat_hosts=%r (tried %s; last error: %s); "
            "retrying, and publishing nothing until it answers",
            down,
            self.hosts,
            tried,
            error,
        )

    def state(self, state: str) -> None:
        """The client's state listener: CONNECTED ends an outage, anything else may begin one."""
        with self._lock:
            now = self._clock()
            if state == KazooState.CONNECTED:
                since, reported = self._since, self._reported
                self._since, self._reported, self._tried, self._error = None, None, {}, ""
            else:
                if self._since is None:
                    self._since = now
                return
        if since is not None and reported is not None:
            logger.info("zkbeat: ZooKeeper answers again at zkbeat_hosts=%r after %.0fs", self.hosts, now - since)


class _ClientLog(logging.LoggerAdapter):
    """The logger kazoo is given for zkbeat's clients: its attempt lines at DEBUG, fed to :class:`Unreachable`.

    kazoo logs through the client's ``logger`` (``info``, ``warning``, ``log``,
    ``exception``...); every one of them comes through :meth:`log`, before the
    level check, so the outage is seen whatever the level.
    """

    def __init__(self, logger: logging.Logger, unreachable: Unreachable | None) -> None:
        super().__init__(logger, {})
        self.unreachable = unreachable

    def process(self, msg: Any, kwargs: MutableMapping[str, Any]) -> tuple[Any, MutableMapping[str, Any]]:
        return msg, kwargs

    def log(self, level: int, msg: Any, *args: Any, **kwargs: Any) -> None:
        if isinstance(msg, str) and msg.startswith(_ATTEMPT):
            level = min(level, logging.DEBUG)
            if self.unreachable is not None:
                self._observe(msg, args)
        super().log(level, msg, *args, **kwargs)

    def _observe(self, msg: str, args: tuple[Any, ...]) -> None:
        unreachable = self.unreachable
        assert unreachable is not None
        try:
            if msg.startswith("Connecting to ") and len(args) >= 3:
                unreachable.attempt(f"{args[0]}:{args[2]}")
            elif msg.startswith("Cannot resolve ") and len(args) >= 2:
                unreachable.attempt(f"{args[0]} (does not resolve)")
                unreachable.failed(str(args[1]))
            elif msg.startswith(_FAILED):
                unreachable.failed(str(args[0]) if args else msg)
        except Exception:  # noqa: BLE001 - a log line of kazoo's must never break its connection loop
            logger.debug("zkbeat: could not read kazoo's line %r", msg, exc_info=True)

    def warn(self, msg: Any, *args: Any, **kwargs: Any) -> None:  # kazoo still calls warn() in places
        self.warning(msg, *args, **kwargs)


def make_client(
    settings: Settings, client_class: type[KazooClient] = KazooClient, *, report_unreachable: bool = False
) -> KazooClient:
    """A client with zkbeat's reconnect policy, credentials, ACL and TLS.

    kazoo's lines about each connection attempt are logged at DEBUG. With
    ``report_unreachable`` (beat, not a one-shot command that says it once
    itself) an :class:`Unreachable` warns every REPORT_EVERY seconds while
    ZooKeeper cannot be reached, naming ``zkbeat_hosts``.

    kazoo's default reconnect back-off doubles up to a minute, so after a
    ZooKeeper outage a replica could idle for tens of seconds with ZooKeeper
    back; the delay is capped at about a second instead. With digest auth
    every znode zkbeat creates under ``zkbeat_root`` is readable and writable
    by those identities only (:func:`owner_acl`; see :func:`_share_ancestors`
    for the ones above it).
    """
    options: dict[str, Any] = {}
    ancestor_acl: list[ACL] = []
    if settings.auth:
        options["auth_data"] = list(settings.auth)
        owners = owner_acl(settings)
        if owners:
            options["default_acl"] = owners
            ancestor_acl = [*owners, make_acl("world", "anyone", read=True, create=True)]
    if settings.use_ssl:
        # kazoo checks the chain but not the name unless asked: any certificate
        # the CA ever signed (a client's, say) would pass for the server.
        # ZooKeeper's own Java client verifies the host name by default too.
        options.update(
            use_ssl=True,
            ca=settings.ssl_ca,
            certfile=settings.ssl_cert,
            keyfile=settings.ssl_key,
            check_hostname=True,
        )
    unreachable = Unreachable(settings.hosts) if report_unreachable else None
    client = client_class(
        hosts=settings.hosts,
        timeout=settings.session_timeout,
        connection_retry=KazooRetry(max_tries=-1, delay=0.05, backoff=2, max_delay=RECONNECT_MAX_DELAY),
        logger=_ClientLog(_client_logger, unreachable),
        **options,
    )
    if unreachable is not None:
        client.add_listener(unreachable.state)
    if ancestor_acl:
        _share_ancestors(client, settings.root, ancestor_acl)
    return client


def owner_acl(settings: Settings) -> list[ACL]:
    """The ACL zkbeat gives what it creates under the root: every permission to each digest identity of zkbeat_auth.

    Each one, not only the first: while a credential is rotated every
    replica holds both the old and the new one (docs/operating.md), so what
    any of them creates stays readable by replicas that hold either. Empty
    without a digest credential (ZooKeeper's open ACL then applies).
    """
    acl = []
    for scheme, credential in settings.auth:
        if scheme == "digest":
            user, _, password = credential.partition(":")
            entry = make_digest_acl(user, password, all=True)
            if entry not in acl:
                acl.append(entry)
    return acl


def apply_acl(client: KazooClient, root: str, acl: list[ACL]) -> tuple[int, list[str]]:
    """Set ``acl`` on ``root`` and every znode under it; (the number set, the paths ZooKeeper refused).

    A step of a credential rotation (``zkbeat acl``, docs/operating.md):
    what exists gets the ACL the replicas' current zkbeat_auth gives what
    they create. Breadth first, in pipelined batches of _ACL_BATCH, listing
    each znode before its ACL changes (this client needs READ and ADMIN on
    each, which the rotation's first step gives it). A znode ZooKeeper
    refuses (NoAuth: a stranger's, under someone else's ACL) is reported,
    with what is under it, and the rest go on; one whose ACL changed though
    its listing was refused (ADMIN without READ) is listed again under its
    new ACL. Znodes that go meanwhile (a
    candidate, a request) are skipped; ones made meanwhile already carry the
    replicas' ACL.
    """
    done, refused = 0, []
    level = [root.rstrip("/") or "/"]
    while level:
        below: list[str] = []
        for start in range(0, len(level), _ACL_BATCH):
            batch = level[start : start + _ACL_BATCH]
            lists = [client.get_children_async(path) for path in batch]
            sets = [client.set_acls_async(path, acl) for path in batch]
            unlisted: list[str] = []
            for path, listing, change in zip(batch, lists, sets):
                try:
                    below.extend(f"{path.rstrip('/')}/{child}" for child in listing.get())
                    listed = True
                except NoNodeError:
                    listed = True
                except NoAuthError:
                    listed = False
                try:
                    change.get()
                    done += 1
                except NoNodeError:
                    pass
                except NoAuthError:
                    refused.append(path)
                    continue
                if not listed:
                    unlisted.append(path)
            # A znode that let this client change its ACL (ADMIN) but not list it (no READ): its new ACL
            # gives READ, so it is listed again and what is under it is visited.
            again = [client.get_children_async(path) for path in unlisted]
            for path, listing in zip(unlisted, again):
                try:
                    below.extend(f"{path.rstrip('/')}/{child}" for child in listing.get())
                except NoNodeError:
                    pass
                except NoAuthError:
                    refused.append(path)
        level = below
    return done, refused


def _share_ancestors(client: KazooClient, root: str, shared: list[ACL]) -> None:
    """Create the missing ancestors of ``root`` with ``shared``, not the identity-only ACL.

    Apps share ``/zkbeat`` by default (roots ``/zkbeat/<app.main>``). Were the
    first app to create ``/zkbeat`` for its identity alone, every other app, with
    another credential or none, could never create its own root there. So an
    ancestor zkbeat creates lets anyone read it and create children, and only
    this identity change, re-ACL or delete it; its children, the roots, keep
    their own ACLs. Ancestors that already exist are left as they are.

    kazoo's ``ensure_path`` (used by the election and the ledger) creates each
    missing parent through ``ensure_path_async``, so wrapping that one method
    on this client covers every path zkbeat ensures.
    """
    ancestors = set()
    path = root.rstrip("/")
    while path.count("/") > 1:
        path = path.rsplit("/", 1)[0]
        ancestors.add(path)
    if not ancestors:
        return
    ensure_path_async = client.ensure_path_async

    def ensure_path_async_sharing_ancestors(path: str, acl: list[ACL] | None = None) -> Any:
        # kazoo recurses through this method, parent by parent, with acl=...
        return ensure_path_async(path, shared if path.rstrip("/") in ancestors else acl)

    client.ensure_path_async = ensure_path_async_sharing_ancestors  # type: ignore[method-assign]

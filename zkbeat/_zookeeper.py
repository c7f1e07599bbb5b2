"""One way to build a kazoo client from Settings (beat and the CLI share it)."""

from __future__ import annotations

import logging
from typing import Any

from kazoo.client import KazooClient
from kazoo.protocol.serialization import Auth
from kazoo.retry import KazooRetry
from kazoo.security import ACL, Id, make_acl, make_digest_acl

from .conf import RECONNECT_MAX_DELAY, Settings

__all__ = ["make_client"]

_REDACTED = "<redacted>"


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


def make_client(settings: Settings, client_class: type[KazooClient] = KazooClient) -> KazooClient:
    """A client with zkbeat's reconnect policy, credentials, ACL and TLS.

    kazoo's default reconnect back-off doubles up to a minute, so after a
    ZooKeeper outage a replica could idle for tens of seconds with ZooKeeper
    back; the delay is capped at about a second instead. With digest auth
    every znode zkbeat creates under ``zkbeat_root`` is readable and writable
    by that identity only (see :func:`_share_ancestors` for the ones above it).
    """
    options: dict[str, Any] = {}
    ancestor_acl: list[ACL] = []
    if settings.auth:
        options["auth_data"] = list(settings.auth)
        digests = [credential for scheme, credential in settings.auth if scheme == "digest"]
        if digests:
            user, _, password = digests[0].partition(":")
            owner = make_digest_acl(user, password, all=True)
            options["default_acl"] = [owner]
            ancestor_acl = [owner, make_acl("world", "anyone", read=True, create=True)]
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
    client = client_class(
        hosts=settings.hosts,
        timeout=settings.session_timeout,
        connection_retry=KazooRetry(max_tries=-1, delay=0.05, backoff=2, max_delay=RECONNECT_MAX_DELAY),
        logger=_client_logger,
        **options,
    )
    if ancestor_acl:
        _share_ancestors(client, settings.root, ancestor_acl)
    return client


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

"""One way to build a kazoo client from Settings (beat and the CLI share it)."""

from __future__ import annotations

from typing import Any

from kazoo.client import KazooClient
from kazoo.retry import KazooRetry
from kazoo.security import make_digest_acl

from .conf import RECONNECT_MAX_DELAY, Settings

__all__ = ["make_client"]


def make_client(settings: Settings, client_class: type[KazooClient] = KazooClient) -> KazooClient:
    """A client with zkbeat's reconnect policy, credentials, ACL and TLS.

    kazoo's default reconnect back-off doubles up to a minute, so after a
    ZooKeeper outage a replica could idle for tens of seconds with ZooKeeper
    back; the delay is capped at about a second instead. With digest auth
    every znode zkbeat creates is readable and writable by that identity only.
    """
    options: dict[str, Any] = {}
    if settings.auth:
        options["auth_data"] = list(settings.auth)
        digests = [credential for scheme, credential in settings.auth if scheme == "digest"]
        if digests:
            user, _, password = digests[0].partition(":")
            options["default_acl"] = [make_digest_acl(user, password, all=True)]
    if settings.use_ssl:
        options.update(use_ssl=True, ca=settings.ssl_ca, certfile=settings.ssl_cert, keyfile=settings.ssl_key)
    return client_class(
        hosts=settings.hosts,
        timeout=settings.session_timeout,
        connection_retry=KazooRetry(max_tries=-1, delay=0.05, backoff=2, max_delay=RECONNECT_MAX_DELAY),
        **options,
    )

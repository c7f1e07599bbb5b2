"""The admin's way to ZooKeeper: the Celery app's zkbeat settings and one shared client per process.

Settings are the Celery app's ``zkbeat_*`` (``CELERY_ZKBEAT_*`` under Django),
read with :func:`zkbeat.conf.read_settings` as beat and the ``zkbeat -A``
command read them, so the admin looks at the root the replicas use. The app
is the one named by the Django setting ``ZKBEAT_CELERY_APP``
(``"proj.celery:app"``), else Celery's current app (the project's, once its
``proj/__init__.py`` imported it, as Celery's Django guide has it).

One kazoo client per process, started by the first page that needs it (never
at import: Django imports the admin in ``manage.py migrate`` too, and a
pre-forking server imports it before it forks), kept for the next pages and
stopped at exit. A process that forked after the client started makes its own:
a kazoo client does not survive a fork. While ZooKeeper cannot be reached the
client keeps reconnecting in the background (zkbeat's capped back-off); a
page waits for it at most :data:`CONNECT_WAIT` seconds, the first time, and
then not at all, and shows what it could not read as unavailable.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
from typing import Any

from kazoo.client import KazooClient
from kazoo.handlers.threading import KazooTimeoutError

from ...conf import Settings, read_settings
from ...exceptions import ConfigurationError

__all__ = ["Unavailable", "CONNECT_WAIT", "APP_SETTING", "celery_app", "settings", "client", "close"]

logger = logging.getLogger(__name__)

#: Seconds the first page waits for the shared client's first connection.
CONNECT_WAIT = 3.0
#: The Django setting that names the Celery app, as ``module:attribute``.
APP_SETTING = "ZKBEAT_CELERY_APP"


class Unavailable(Exception):
    """ZooKeeper (or the settings to reach it) cannot serve this page; the message says why."""


def celery_app() -> Any:
    """The project's Celery app: ``settings.ZKBEAT_CELERY_APP`` if set, else Celery's current app."""
    from celery import current_app
    from django.conf import settings as django_settings
    from kombu.utils.imports import symbol_by_name

    named = getattr(django_settings, APP_SETTING, None)
    if named:
        try:
            return symbol_by_name(named)
        except (ImportError, AttributeError, ValueError) as exc:
            raise Unavailable(f"{APP_SETTING} = {named!r} cannot be imported ({exc})") from None
    return current_app._get_current_object()


def settings() -> Settings:
    """The Celery app's zkbeat settings; Unavailable (naming the setting) if they are invalid."""
    app = celery_app()
    try:
        return read_settings(app.conf, app.main)
    except ConfigurationError as exc:
        raise Unavailable(str(exc)) from None


class _Shared:
    """The process's client, and what it was made for (its connection settings and process)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.client: KazooClient | None = None
        self.key: tuple[Any, ...] | None = None
        self.pid: int | None = None
        self.started: Any = None


_shared = _Shared()


def _key(found: Settings) -> tuple[Any, ...]:
    """What the client depends on: a change to any of these makes a new one (the root is per call)."""
    return (found.hosts, tuple(found.auth), found.use_ssl, found.ssl_ca, found.ssl_cert, found.ssl_key,
            found.session_timeout)  # fmt: skip


def client(found: Settings) -> KazooClient:
    """The shared client, connected; Unavailable if it is not (within CONNECT_WAIT, on a first start)."""
    from ...coordination._zookeeper import make_client

    with _shared.lock:
        if _shared.client is not None and (_shared.key != _key(found) or _shared.pid != os.getpid()):
            _drop(stop=_shared.pid == os.getpid())
        if _shared.client is None:
            made = make_client(found)
            _shared.started = made.start_async()
            _shared.client, _shared.key, _shared.pid = made, _key(found), os.getpid()
            first = True
        else:
            first = False
        made, started = _shared.client, _shared.started
    if not made.connected and first:
        try:
            started.wait(CONNECT_WAIT)
        except KazooTimeoutError:
            pass
    if not made.connected:
        raise Unavailable(f"ZooKeeper at {found.hosts} cannot be reached (zkbeat_hosts; the admin keeps trying)")
    return made


def _drop(stop: bool) -> None:
    """Forget the shared client; stop and close it unless it is a forked parent's."""
    old, _shared.client, _shared.key, _shared.pid, _shared.started = _shared.client, None, None, None, None
    if old is not None and stop:
        try:
            old.stop()
            old.close()
        except Exception:  # noqa: BLE001 - closing at exit or on a settings change: nothing to report to
            logger.debug("zkbeat admin: closing the ZooKeeper client failed", exc_info=True)


def close() -> None:
    """Stop and close the shared client (at exit; tests call it between servers)."""
    with _shared.lock:
        _drop(stop=_shared.pid == os.getpid())


atexit.register(close)

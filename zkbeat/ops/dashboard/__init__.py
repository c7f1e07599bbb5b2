"""``zkbeat dashboard``: the cluster, every entry, and its controls in a browser.

Three parts: :mod:`.model` (ZooKeeper reads and watches: one view per
process), :mod:`.server` (the HTTP server: page, JSON, events, controls) and
``static/`` (one HTML page, one script, one style sheet: no build step, no
CDN). :mod:`.describe` says what each entry's schedule, next fire times and
last run mean.
"""

from __future__ import annotations

import logging
import os
import signal
from pathlib import Path
from typing import Any

from ...conf import Settings
from ...exceptions import ConfigurationError

__all__ = ["SECRET_ENV", "MIN_SECRET", "load_secret", "serve"]

logger = logging.getLogger(__name__)

#: The environment variable that may hold the controls' secret.
SECRET_ENV = "ZKBEAT_DASHBOARD_SECRET"
#: Shortest secret accepted: a guessable one would be no lock at all.
MIN_SECRET = 16


def load_secret(secret_file: str | None, environ: dict[str, str] | os._Environ[str] = os.environ) -> str | None:
    """The controls' secret: from ``secret_file``, else ``$ZKBEAT_DASHBOARD_SECRET``; None leaves them off.

    A secret that is set but empty or short fails, naming where it came from:
    a typo must not leave the buttons open, nor silently closed.
    """
    if secret_file:
        try:
            secret = Path(secret_file).read_text(encoding="utf-8").strip()
        except OSError as exc:
            raise ConfigurationError("--secret-file", secret_file, f"cannot be read ({exc.strerror})") from None
        source, shown = "--secret-file", secret_file
    elif environ.get(SECRET_ENV) is not None:
        secret = environ[SECRET_ENV].strip()
        source, shown = SECRET_ENV, "<redacted>"
    else:
        return None
    if len(secret) < MIN_SECRET:
        raise ConfigurationError(source, shown, f"holds a secret of {len(secret)} characters; use {MIN_SECRET} or more")
    return secret


def serve(
    settings: Settings,
    app: Any,
    schedule: dict[str, Any] | None,
    bind: str,
    port: int,
    secret: str | None,
    timeout: float,
    announce: Any = print,
) -> None:
    """Connect, watch, and serve until SIGTERM or Ctrl-C."""
    from ...coordination._zookeeper import make_client
    from .model import ClusterModel
    from .server import DashboardServer

    client = make_client(settings)
    client.start(timeout=timeout)
    model = ClusterModel(client, settings, schedule, app).start()
    if not model.wait_ready(timeout):
        logger.warning("zkbeat dashboard: the first read of %s is not done yet; serving what is known", settings.root)
    try:
        server = DashboardServer((bind, port), model, secret=secret, schedule=schedule)
    except BaseException:
        model.stop()
        client.stop()
        client.close()
        raise
    host, bound = server.server_address[:2]
    controls = "pause, resume and run-now are on (secret given)" if secret else "read-only (no secret: controls off)"
    announce(f"zkbeat dashboard of {settings.root} on {settings.hosts}: http://{host}:{bound}/ ({controls})")

    def stop(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        server.serve_forever(poll_interval=0.2)
    except KeyboardInterrupt:
        pass
    finally:
        signal.signal(signal.SIGTERM, previous)
        server.stopping = True
        server.server_close()
        model.stop()
        client.stop()
        client.close()

"""The dashboard's HTTP server: the page, its JSON, server-sent events, and the controls.

Python's own ``ThreadingHTTPServer``: no web framework, nothing to build.

========================  =====  ==========================================================
path                      verb   what
========================  =====  ==========================================================
/                         GET    the page (static HTML; every value is filled in by app.js)
/static/<file>            GET    app.js, app.css (served from the package: no CDN)
/api/state                GET    the whole model as JSON
/api/events               GET    server-sent events: the whole model, then what changed
/api/pause                POST   ``entry``, ``note``: zkbeat.ledger.controls.pause
/api/resume               POST   ``entry``: zkbeat.ledger.controls.resume
/api/run                  POST   ``entry``: zkbeat.ledger.controls.request_trigger (one run now)
========================  =====  ==========================================================

The controls are off unless the command was given a secret, and each POST
must carry it (header ``X-Zkbeat-Secret``, or a ``secret`` form field),
compared in constant time. No cookie is ever set, so a page elsewhere cannot
ride on a browser's credentials: without the secret it can only be refused
(403). Served on a loopback address, requests must name a loopback host,
which keeps a DNS-rebinding page from reading the JSON. Every response
forbids inline scripts and framing (Content-Security-Policy), so an entry
name that holds markup could not run even if it were ever written as HTML;
the page only ever writes text nodes.
"""

from __future__ import annotations

import getpass
import hmac
import json
import logging
import socket
import threading
import time
import unicodedata
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from typing import Any
from urllib.parse import parse_qs, urlsplit

from kazoo.exceptions import KazooException, NoAuthError, ZookeeperError

from ..._decode import json_object
from ...ledger import controls
from .model import ClusterModel

__all__ = ["DashboardServer", "SECRET_HEADER", "MAX_SSE_CLIENTS"]

logger = logging.getLogger(__name__)

SECRET_HEADER = "X-Zkbeat-Secret"
#: Who is pressing the button, as the page was told (kept with a pause or a run-now).
OPERATOR_HEADER = "X-Zkbeat-Operator"
#: Browsers following the events at once; more get 503 (each holds a thread).
MAX_SSE_CLIENTS = 64
#: Seconds between keep-alive comments on an idle event stream.
_KEEPALIVE = 15.0
#: Shortest gap between two events to one browser: changes in between go together.
_EVENT_GAP = 0.1
_MAX_BODY = 64 * 1024
_STATIC = {"app.js": "text/javascript; charset=utf-8", "app.css": "text/css; charset=utf-8"}
_LOOPBACK_NAMES = {"127.0.0.1", "localhost", "::1", "[::1]"}
_SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self'; "
        "base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}


def _static(name: str) -> bytes:
    return resources.files(__package__).joinpath("static", name).read_bytes()


def _clean(text: str, limit: int) -> str:
    """One plain line of at most ``limit`` characters (control characters dropped)."""
    return "".join(ch for ch in text if not unicodedata.category(ch).startswith("C"))[:limit].strip()


class DashboardServer(ThreadingHTTPServer):
    """Serves one :class:`ClusterModel`; ``secret`` (None: controls off) guards the POSTs."""

    daemon_threads = True

    def __init__(
        self,
        address: tuple[str, int],
        model: ClusterModel,
        secret: str | None = None,
        schedule: dict[str, Any] | None = None,
    ) -> None:
        self.model = model
        self.secret = secret.encode() if secret else None
        self.schedule = schedule
        self.stopping = False
        self.streams = threading.BoundedSemaphore(MAX_SSE_CLIENTS)
        self.loopback_only = address[0] in ("127.0.0.1", "::1", "localhost") or address[0].startswith("127.")
        try:
            user = getpass.getuser()
        except (KeyError, OSError):
            user = "?"
        self.where = f"{user}@{socket.gethostname()}"
        self.page = _static("index.html")
        super().__init__(address, _Handler)

    def stop(self) -> None:
        self.stopping = True
        self.shutdown()
        self.server_close()


class _Handler(BaseHTTPRequestHandler):
    server: DashboardServer
    protocol_version = "HTTP/1.1"

    # -- plumbing ------------------------------------------------------------

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - http.server's signature
        logger.debug("zkbeat dashboard: %s " + format, self.address_string(), *args)

    def _send(self, code: int, content_type: str, body: bytes, extra: dict[str, str] | None = None) -> None:
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for name, value in {**_SECURITY_HEADERS, **(extra or {})}.items():
            self.send_header(name, value)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        """http.server's own refusals (a method not served, a request it cannot read) as every answer: JSON, with
        the security headers (http.server's error page has none of them)."""
        self.close_connection = True
        self._json(code, {"error": message or self.responses.get(code, ("error",))[0]})

    def _json(self, code: int, data: Any) -> None:
        self._send(code, "application/json", json.dumps(data, sort_keys=True).encode())

    def _host_allowed(self) -> bool:
        """On a loopback bind, only requests that name a loopback host (DNS rebinding cannot)."""
        if not self.server.loopback_only:
            return True
        host = self.headers.get("Host", "")
        name = host.rsplit(":", 1)[0] if not host.endswith("]") else host
        return name in _LOOPBACK_NAMES

    # -- GET -------------------------------------------------------------------

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        if not self._host_allowed():
            self._json(403, {"error": "this dashboard answers on its loopback address only"})
            return
        path = urlsplit(self.path).path
        if path in ("/", "/index.html"):
            self._send(200, "text/html; charset=utf-8", self.server.page)
        elif path.startswith("/static/") and path[len("/static/") :] in _STATIC:
            name = path[len("/static/") :]
            self._send(200, _STATIC[name], _static(name))
        elif path == "/api/state":
            state = self.server.model.snapshot()
            state["controls"] = self.server.secret is not None
            self._json(200, state)
        elif path == "/api/events":
            self._events()
        elif path == "/healthz":
            self._json(200, {"status": "ok", "zookeeper": self.server.model.connection})
        else:
            self._json(404, {"error": "not found"})

    def _events(self) -> None:
        """Server-sent events: the whole model first, then each change (at most one per _EVENT_GAP)."""
        server = self.server
        if not server.streams.acquire(blocking=False):
            self._json(503, {"error": f"at most {MAX_SSE_CLIENTS} browsers follow the events at once"})
            return
        try:
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Connection", "close")
            for name, value in _SECURITY_HEADERS.items():
                self.send_header(name, value)
            self.end_headers()
            self.close_connection = True
            state = server.model.snapshot()
            state["controls"] = server.secret is not None
            seq = state["seq"]
            self._event(state)
            while not server.stopping:
                now = server.model.wait(seq, _KEEPALIVE)
                if server.stopping:
                    return
                if now == seq:
                    self.wfile.write(b": keep-alive\n\n")
                    self.wfile.flush()
                    continue
                changes = server.model.changes(seq)
                changes["controls"] = server.secret is not None
                seq = changes["seq"]
                self._event(changes)
                time.sleep(_EVENT_GAP)
        except (BrokenPipeError, ConnectionResetError, TimeoutError):
            return
        finally:
            server.streams.release()

    def _event(self, data: dict[str, Any]) -> None:
        # json.dumps escapes control characters: one event is one data line.
        self.wfile.write(b"data: " + json.dumps(data, sort_keys=True).encode() + b"\n\n")
        self.wfile.flush()

    # -- POST: the controls ------------------------------------------------------

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        if not self._host_allowed():
            self._json(403, {"error": "this dashboard answers on its loopback address only"})
            return
        action = urlsplit(self.path).path
        if action not in ("/api/pause", "/api/resume", "/api/run"):
            self._json(404, {"error": "not found"})
            return
        fields = self._fields()
        if fields is None:
            return
        refusal = self._refusal(fields)
        if refusal is not None:
            self._json(403, {"error": refusal})
            return
        entry = fields.get("entry")
        if not isinstance(entry, str) or not entry:
            self._json(400, {"error": "name the entry (field 'entry')"})
            return
        operator = _clean(str(self.headers.get(OPERATOR_HEADER) or fields.get("operator") or ""), 64)
        by = f"{operator or 'someone'} via the dashboard of {self.server.where} ({self.client_address[0]})"
        try:
            self._control(action, entry, str(fields.get("note") or ""), by)
        except controls.UnknownEntryError as exc:
            self._json(404, {"error": str(exc)})
        except controls.ControlError as exc:
            self._json(409, {"error": str(exc)})
        except NoAuthError:
            self._json(502, {"error": f"ZooKeeper denied access under {self.server.model.root} (NoAuth)"})
        except (KazooException, ZookeeperError) as exc:
            self._json(503, {"error": f"ZooKeeper answered with an error: {type(exc).__name__}"})

    def _control(self, action: str, entry: str, note: str, by: str) -> None:
        server = self.server
        client, root = server.model.client, server.model.root_setting
        # In the app's schedule: an entry that has never run (no ledger state yet) can be named too.
        scheduled = entry in (server.schedule or {})
        if action == "/api/pause":
            # Refused (LayoutError: 409) while no replica in line reads layout 2, as `zkbeat pause` without --force.
            state, changed = controls.pause(client, root, entry, by, note, scheduled=scheduled)
            assert state.paused is not None
            logger.info("zkbeat dashboard: %s paused %r", by, entry)
            self._json(200, {"entry": entry, "paused": state.paused.as_dict(), "changed": changed})
        elif action == "/api/resume":
            state, changed = controls.resume(client, root, entry, scheduled=scheduled)
            logger.info("zkbeat dashboard: %s resumed %r", by, entry)
            was = state.paused.as_dict() if changed and state.paused else None
            self._json(200, {"entry": entry, "was_paused": was, "changed": changed})
        else:
            request = controls.request_trigger(client, root, entry, by, scheduled=scheduled)
            logger.info("zkbeat dashboard: %s asked to run %r now (%s)", by, entry, request)
            self._json(202, {"entry": entry, "request": request.rsplit("/", 1)[-1]})

    def _fields(self) -> dict[str, Any] | None:
        """The POST's fields, from JSON or a form; None after answering a bad request."""
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            length = -1
        if not 0 <= length <= _MAX_BODY:
            self._json(413 if length > _MAX_BODY else 400, {"error": "bad Content-Length"})
            return None
        body = self.rfile.read(length)
        kind = (self.headers.get("Content-Type") or "").split(";")[0].strip().lower()
        try:
            if kind == "application/json":
                return json_object(body, empty_ok=True)
            if kind == "application/x-www-form-urlencoded":
                return {k: v[0] for k, v in parse_qs(body.decode("utf-8"), keep_blank_values=True).items()}
        except ValueError as exc:  # UnicodeDecodeError too
            self._json(400, {"error": f"cannot read the request body ({exc})"})
            return None
        self._json(415, {"error": "send application/json or a form"})
        return None

    def _refusal(self, fields: dict[str, Any]) -> str | None:
        """Why this control request is refused (403), or None."""
        secret = self.server.secret
        if secret is None:
            return (
                "controls are off: start `zkbeat dashboard` with --secret-file or ZKBEAT_DASHBOARD_SECRET "
                "to turn them on"
            )
        origin = self.headers.get("Origin")
        if origin and urlsplit(origin).netloc != self.headers.get("Host", ""):
            return "a request from another site"
        given = self.headers.get(SECRET_HEADER) or fields.get("secret") or ""
        if not isinstance(given, str) or not hmac.compare_digest(given.encode(), secret):
            return "the dashboard's secret is missing or wrong"
        return None

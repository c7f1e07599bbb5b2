"""Optional Prometheus metrics and a /healthz endpoint for one replica.

Off unless ``zkbeat_metrics_port`` is set (and ``zkbeat[metrics]``, i.e.
prometheus_client, is installed). The replica's own state (connected, leading,
epoch, last publish) is tracked either way, because that costs nothing and is
what /healthz reports.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from ..conf import Settings
from ..exceptions import ConfigurationError

__all__ = ["Metrics"]

logger = logging.getLogger(__name__)


class Metrics:
    """Counters and gauges the scheduler updates; cheap to call when disabled."""

    def __init__(self, settings: Settings) -> None:
        self.identity = settings.identity
        self.connection_state = "LOST"
        self.is_leader = False
        self.epoch: int | None = None
        #: With shards: each shard this replica leads, with its epoch.
        self.shards: dict[int, int] = {}
        self.last_publish: float | None = None
        #: While leading: each entry with a tick planned and not yet settled, and
        #: the wall-clock moment it becomes overdue by one period (see tick_planned).
        self._overdue_at: dict[str, float] = {}
        self._left_out = 0
        self._settings = settings
        self._server: ThreadingHTTPServer | None = None
        self._prom: dict[str, Any] | None = None
        if settings.metrics_port is not None:
            self._prom = _prometheus_metrics(settings)

    # -- updates from the scheduler ----------------------------------------

    def leadership(self, is_leader: bool, epoch: int | None) -> None:
        if is_leader != self.is_leader and self._prom:
            self._prom["changes"].inc()
        self.is_leader, self.epoch = is_leader, epoch if is_leader else None
        if not is_leader:
            self._overdue_at = {}
        if self._prom:
            self._prom["is_leader"].set(1 if is_leader else 0)

    def schedule_load_step_down(self) -> None:
        """This replica stepped aside: its schedule had not loaded within the stall timeout of taking over.

        Or, already marked unready, at its first try, with a replica that can lead behind it in that line.
        """
        if self._prom:
            self._prom["schedule_load_step_downs"].inc()

    def refusing(self, refusing: bool) -> None:
        """Whether this replica last refused to lead (a newer zkbeat layout is here; zkbeat.coordination.peers)."""
        if self._prom:
            self._prom["refusing"].set(1 if refusing else 0)

    def shard_leadership(self, shard: int, epoch: int | None) -> None:
        """With shards: ``shard`` is led here under ``epoch`` now, or not (None); leading any shard is leading."""
        if epoch is None:
            self.shards.pop(shard, None)
        else:
            self.shards[shard] = epoch
        leading = bool(self.shards)
        if leading != self.is_leader and self._prom:
            self._prom["changes"].inc()
        self.is_leader = leading
        self.epoch = min(self.shards.values()) if self.shards else None
        if not leading:
            self._overdue_at = {}
        if self._prom:
            self._prom["is_leader"].set(1 if leading else 0)
            self._prom["shard_leader"].labels(shard=str(shard)).set(0 if epoch is None else 1)

    def tick_planned(self, name: str, overdue_at: Callable[[], float]) -> None:
        """A leader planned a tick of ``name``; ``overdue_at()``: when it is one period late (epoch seconds).

        Only asked when metrics are on (it costs a schedule evaluation). A
        tick planned again (its claim failed, the broker was down) keeps the
        first moment: it has been owed since then.
        """
        if self._prom is None or name in self._overdue_at:
            return
        try:
            self._overdue_at[name] = overdue_at()
        except Exception:  # noqa: BLE001 - a schedule that cannot say is left out here; it is logged elsewhere
            return

    def tick_settled(self, name: str) -> None:
        """The planned tick of ``name`` was published, skipped or held back by a pause: it is not owed any more."""
        self._overdue_at.pop(name, None)

    def left_out(self, count: int) -> None:
        """Entries left out of the schedule for now: their schedule, clock or name raised (logged)."""
        self._left_out = count

    def overdue(self, now: float | None = None) -> int:
        """Entries whose planned tick is still unsettled more than one period after it was due."""
        return len(self.overdue_names(now))

    def overdue_names(self, now: float | None = None) -> list[str]:
        """The entries :meth:`overdue` counts."""
        moment = time.time() if now is None else now
        return [name for name, at in list(self._overdue_at.items()) if at < moment]

    def connection(self, state: str) -> None:
        """Called from kazoo's listener: sets values only, never blocks."""
        self.connection_state = str(state)
        if self._prom:
            for name in ("CONNECTED", "SUSPENDED", "LOST"):
                self._prom["state"].labels(state=name).set(1 if name == self.connection_state else 0)

    def claims(self, result: str, count: int = 1) -> None:
        if self._prom and count:
            self._prom["claims"].labels(result=result).inc(count)

    def published(self, count: int = 1) -> None:
        self.last_publish = time.monotonic()
        if self._prom:
            self._prom["publishes"].inc(count)

    def publish_error(self) -> None:
        if self._prom:
            self._prom["publish_errors"].inc()

    def publish_uncertain(self) -> None:
        if self._prom:
            self._prom["publishes_uncertain"].inc()

    def deposal(self) -> None:
        """A predecessor was deleted through its liveness socket (zkbeat.coordination.liveness); any thread."""
        if self._prom:
            self._prom["deposals"].inc()

    def broker_handover(self) -> None:
        """This leader handed over: it could not reach the broker and another replica could; any thread."""
        if self._prom:
            self._prom["broker_handovers"].inc()

    def ledger_ahead(self, count: int) -> None:
        """Ledger entries found with a last run later than ZooKeeper's time of their write (zkbeat.ledger.clock)."""
        if self._prom and count:
            self._prom["ledger_ahead"].inc(count)

    def ledger_loaded(self, seconds: float) -> None:
        if self._prom:
            self._prom["ledger_load"].set(seconds)

    # -- health and serving --------------------------------------------------

    def health(self) -> tuple[bool, dict[str, Any]]:
        """Healthy means connected to ZooKeeper; followers are healthy too."""
        ok = self.connection_state == "CONNECTED"
        return ok, {
            "status": "ok" if ok else "unhealthy",
            "identity": self.identity,
            "zookeeper": self.connection_state,
            "is_leader": self.is_leader,
            "epoch": self.epoch,
            **({"shards": {str(k): v for k, v in sorted(self.shards.items())}} if self._settings.shards > 1 else {}),
            "seconds_since_last_publish": self.seconds_since_last_publish(),
        }

    def seconds_since_last_publish(self) -> float | None:
        return None if self.last_publish is None else round(time.monotonic() - self.last_publish, 3)

    def serve(self) -> None:
        """Start /metrics and /healthz on zkbeat_metrics_port (a daemon thread)."""
        if self._prom is None or self._server is not None:
            return
        settings = self._settings
        address = (settings.metrics_address, settings.metrics_port)
        try:
            self._server = ThreadingHTTPServer(address, _handler(self))
        except OSError as exc:  # the port taken (another replica on this host), the address not this host's
            raise ConfigurationError(
                "zkbeat_metrics_port",
                settings.metrics_port,
                f"cannot listen on {settings.metrics_address}:{settings.metrics_port} ({exc.strerror or exc}); "
                "each replica on a host needs a port of its own",
            ) from None
        self._server.daemon_threads = True
        thread = threading.Thread(target=self._server.serve_forever, name="zkbeat-metrics", daemon=True)
        thread.start()
        logger.info("zkbeat: metrics and /healthz on %s:%s", settings.metrics_address, self.port)

    @property
    def port(self) -> int | None:
        return self._server.server_address[1] if self._server else self._settings.metrics_port

    def render(self) -> bytes:
        from prometheus_client import generate_latest

        return generate_latest(self._prom["registry"]) if self._prom else b""

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None


def _prometheus_metrics(settings: Settings) -> dict[str, Any]:
    try:
        from prometheus_client import CollectorRegistry, Counter, Gauge
    except ImportError:
        raise ConfigurationError(
            "zkbeat_metrics_port", settings.metrics_port, "needs prometheus_client: pip install 'zkbeat[metrics]'"
        ) from None
    registry = CollectorRegistry()
    labels = {"identity": settings.identity}
    names = list(labels)

    def gauge(name: str, doc: str, extra: tuple[str, ...] = ()) -> Any:
        metric = Gauge(name, doc, names + list(extra), registry=registry)
        return metric.labels(**labels) if not extra else _Bound(metric, labels)

    def counter(name: str, doc: str, extra: tuple[str, ...] = ()) -> Any:
        metric = Counter(name, doc, names + list(extra), registry=registry)
        return metric.labels(**labels) if not extra else _Bound(metric, labels)

    prom: dict[str, Any] = {
        "registry": registry,
        "is_leader": gauge("zkbeat_is_leader", "1 while this replica leads and may publish"),
        "changes": counter("zkbeat_leadership_changes", "Times this replica became or stopped being leader"),
        "claims": counter("zkbeat_claims", "Ledger claims by result (committed, conflicted, fenced)", ("result",)),
        "publishes": counter("zkbeat_publishes", "Ticks published to the broker"),
        "publish_errors": counter(
            "zkbeat_publish_errors", "Claimed ticks the broker refused or could not be reached for"
        ),
        "publishes_uncertain": counter(
            "zkbeat_publishes_uncertain",
            "Ticks sent that the broker never answered: they may not have arrived, and are not sent again",
        ),
        "deposals": counter(
            "zkbeat_liveness_deposals",
            "Predecessors this replica deleted because their liveness socket closed and refused a re-dial",
        ),
        "broker_handovers": counter(
            "zkbeat_broker_handovers",
            "Times this replica handed leadership over because it could not reach the broker and another replica could",
        ),
        "schedule_load_step_downs": counter(
            "zkbeat_schedule_load_step_downs",
            "Times this replica stepped out of the election because its schedule had not loaded within "
            "zkbeat_stall_timeout of taking over (a DatabaseScheduler that cannot read its database), or at its "
            "first try when it was marked unready and a replica that can lead stood behind it",
        ),
        "state": gauge("zkbeat_zookeeper_state", "1 for the current ZooKeeper connection state", ("state",)),
        "ledger_load": gauge("zkbeat_ledger_load_seconds", "Time the last ledger load on takeover took"),
        "ledger_ahead": counter(
            "zkbeat_ledger_ahead",
            "Ledger entries found with a last run later than ZooKeeper's time of their write (a leader's clock "
            "was ahead): not trusted, they went on from that write",
        ),
    }
    since = gauge("zkbeat_seconds_since_last_publish", "Seconds since this replica last published (NaN if never)")
    prom["since"] = since
    prom["shard_leader"] = gauge(
        "zkbeat_is_shard_leader", "With zkbeat_shards > 1: 1 while this replica leads the shard", ("shard",)
    )
    prom["refusing"] = gauge(
        "zkbeat_refusing_to_lead", "1 if this replica last refused to lead: a newer zkbeat layout is in the root"
    )
    prom["refusing"].set(0)
    prom["overdue"] = gauge(
        "zkbeat_entries_overdue",
        "Entries (on the leader) whose due tick is more than one period late and still not published",
    )
    prom["left_out"] = gauge(
        "zkbeat_entries_left_out", "Entries left out for now: their schedule, clock or name raised (see the log)"
    )
    return prom


class _Bound:
    """A labelled metric with the replica's own labels filled in."""

    def __init__(self, metric: Any, labels: dict[str, str]) -> None:
        self._metric, self._labels = metric, labels

    def labels(self, **extra: str) -> Any:
        return self._metric.labels(**self._labels, **extra)


def _handler(metrics: Metrics) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            if self.path.split("?")[0] == "/healthz":
                ok, body = metrics.health()
                self._send(200 if ok else 503, "application/json", json.dumps(body).encode())
            elif self.path.split("?")[0] in ("/metrics", "/"):
                if metrics._prom:
                    since = metrics.seconds_since_last_publish()
                    metrics._prom["since"].set(float("nan") if since is None else since)
                    metrics._prom["overdue"].set(metrics.overdue())
                    metrics._prom["left_out"].set(metrics._left_out)
                self._send(200, "text/plain; version=0.0.4; charset=utf-8", metrics.render())
            else:
                self._send(404, "text/plain", b"not found\n")

        def _send(self, code: int, content_type: str, body: bytes) -> None:
            self.send_response(code)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - http.server's signature
            logger.debug("zkbeat metrics: " + format, *args)

    return Handler

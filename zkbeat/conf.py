"""The ``zkbeat_*`` settings: names, defaults, validation, in one place.

Settings are read once from the Celery app's configuration (so Django's
``CELERY_ZKBEAT_*`` names work through Celery's namespace) into a frozen
:class:`Settings`. Every bad value fails here, at start-up, with an error
that names the setting and the value, never later inside the beat loop.
"""

from __future__ import annotations

import difflib
import math
import os
import re
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from datetime import timedelta
from typing import Any

from kazoo.hosts import collect_hosts

from .exceptions import ConfigurationError

__all__ = [
    "Settings",
    "DEFAULT_HOSTS",
    "DEFAULT_SESSION_TIMEOUT",
    "DEFAULT_STALL_TIMEOUT",
    "DEFAULT_BROKER_HANDOVER_TIMEOUT",
    "MAX_SHARDS",
    "read_settings",
    "setting_names",
    "unknown_settings",
]

DEFAULT_HOSTS = "127.0.0.1:2181"
DEFAULT_SESSION_TIMEOUT = 10.0
#: Seconds a leader's pass may run before the watchdog steps it down. The
#: longest legitimate pass is about 7 s: kombu's broker wait (5 s at most,
#: zkbeat.leading.publisher.BROKER_WAIT), a 1,000-entry batch (~0.9 s of publishes and one
#: ledger transaction) and a takeover's ledger load (~0.2 s for 10,000
#: entries); 30 s leaves four times that for a loaded host.
DEFAULT_STALL_TIMEOUT = 30.0
#: The stall timeout must exceed the broker wait of one pass (zkbeat.leading.publisher.BROKER_WAIT).
MIN_STALL_TIMEOUT = 5.0
#: Seconds a leader may fail to reach the broker before it asks a replica that
#: can to take over (zkbeat.coordination.broker_handover). Longer than one publish that
#: waits out Redis's 10 s reply timeout (zkbeat.leading.broker.PUBLISH_TIMEOUTS) and
#: the reconnect after it, so one slow reply or a broker restart never moves
#: leadership; as long as a lost ZooKeeper session takes with the default
#: timeout (10 s, plus tickTime buckets), so a leader cut off from the
#: broker is replaced about as soon as one cut off from ZooKeeper; and well
#: under the 30 s stall timeout.
DEFAULT_BROKER_HANDOVER_TIMEOUT = 15.0
#: Most shards a root may be split into (docs/sharding.md): each is one election
#: every replica joins, so a shard costs every replica a candidate, a watch and
#: about 3 threads (64 shards: about 200 threads in every replica).
MAX_SHARDS = 64
#: Largest ``zkbeat_catchup_limit``: catch-up ``all`` counts up to this many
#: missed slots of one entry (a bounded amount per pass, zkbeat.ticking.catchup), and
#: a backlog larger than this is better skipped than replayed.
MAX_CATCHUP_LIMIT = 10_000
#: Most runs an entry's ledger znode keeps (``zkbeat_recent_runs``, zkbeat.ledger.history): ZooKeeper
#: holds every znode in memory and logs every write, so it is not a history store.
MAX_RECENT_RUNS = 10
#: kazoo's own reconnect back-off doubles up to a minute; after a ZooKeeper
#: outage a replica would then idle for tens of seconds with ZooKeeper back.
RECONNECT_MAX_DELAY = 1.0
#: Per-entry override, read from ``options`` and removed before publish.
ENTRY_MISFIRE_OPTION = "zkbeat_misfire_grace_time"
#: Per-entry catch-up policy (``once``, ``skip``, ``all``), removed before publish.
ENTRY_CATCHUP_OPTION = "zkbeat_catchup"
#: Per-entry jitter in seconds, removed before publish.
ENTRY_JITTER_OPTION = "zkbeat_jitter"
#: Every option zkbeat reads from an entry and removes before publish.
ENTRY_OPTIONS = (ENTRY_MISFIRE_OPTION, ENTRY_CATCHUP_OPTION, ENTRY_JITTER_OPTION)

_REDACTED = "<redacted>"
#: What a ZooKeeper auth scheme looks like ("digest", "sasl", "x509", ...).
_AUTH_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9_.-]*")


def _setting(default: Any, *, shown: str, help: str) -> Any:
    """A Settings field with its documentation as data: the settings reference is generated from it.

    ``shown`` is the default as a user sees it (``zkbeat_root``'s depends on
    the app), ``help`` what the setting means; both are reStructuredText.
    """
    return field(default=default, metadata={"default": shown, "help": help})


@dataclass(frozen=True)
class Settings:
    """Validated zkbeat settings; build it with :func:`read_settings`.

    Each field is the setting ``zkbeat_<field>`` (``CELERY_ZKBEAT_<FIELD>``
    under Django); its metadata holds the default as shown and the meaning.
    """

    hosts: str = _setting(
        DEFAULT_HOSTS,
        shown="env ``ZKBEAT_HOSTS``, else ``127.0.0.1:2181``",
        help="ZooKeeper connect string, chroot allowed (``zk1:2181,zk2:2181/apps``).",
    )
    root: str = _setting(
        "/zkbeat/default",
        shown="``/zkbeat/<app.main>``",
        help="Base znode of this app's election and ledger.",
    )
    session_timeout: float = _setting(
        DEFAULT_SESSION_TIMEOUT,
        shown="``10.0``",
        help="Seconds; bounds crash failover (ZooKeeper expires a session in ``tickTime`` buckets, "
        "and clamps it to 2-20 x ``tickTime``).",
    )
    identity: str = _setting(
        "",
        shown="``<hostname>:<pid>``",
        help="Shown in logs, ``zkbeat status`` and candidate data; printable characters only.",
    )
    misfire_grace_time: float | None = _setting(
        None,
        shown="``None``",
        help="A tick later than this many seconds is skipped (logged), not caught up; ``None`` catches up once, "
        "Celery's own rule. Per entry: ``options={'zkbeat_misfire_grace_time': 30}`` (removed before publish).",
    )
    catchup: str = _setting(
        "once",
        shown="``'once'``",
        help="What a leader does with ticks missed (a failover, an outage, a pause): ``once`` runs the missed "
        "ticks as one (Celery's rule; with a misfire grace time, a tick later than it is skipped), ``skip`` "
        "skips a missed tick (later than the misfire grace time, or without one, once a later slot is due too), "
        "``all`` runs every missed slot once, in order, each under its own task id (slots older than the misfire "
        "grace time are dropped), but refuses past ``zkbeat_catchup_limit`` missed slots and says why. Per "
        "entry: ``options={'zkbeat_catchup': 'all'}`` (removed before publish).",
    )
    catchup_limit: int = _setting(
        100,
        shown="``100``",
        help="Most missed slots the ``all`` catch-up publishes for one entry; past it none of them is, the "
        "entry goes on from its next slot, and the log says how many were missed (as Kubernetes CronJobs do). "
        "At most 10,000: the missed slots are counted when a backlog is found, a bounded number per pass of "
        "the leader's loop (an entry waits for its count while the others run).",
    )
    jitter: float = _setting(
        0.0,
        shown="``0`` (off)",
        help="Seconds: each tick is published up to this much after its slot, by an offset in ``[0, jitter)`` "
        "that a hash of the root, the entry and the slot fixes, so every replica and every leader after a "
        "failover publishes a slot at the same moment; headers and task ids keep the nominal slot. An entry "
        "whose interval (a crontab's gap to its next run) is not longer than the jitter runs without it (logged "
        "once). Per entry: ``options={'zkbeat_jitter': 30}`` (removed before publish).",
    )
    recent_runs: int = _setting(
        MAX_RECENT_RUNS,
        shown="``10``",
        help="Runs of each entry its ledger znode keeps (slot, publish time, replica, epoch, kind) for ``zkbeat "
        "history`` and the dashboard, written by the claim that records each run (no ZooKeeper write of their "
        "own): 0 to 10, about 67 bytes a run. Each publish writes them to ZooKeeper's log with the entry "
        "(about 850 bytes with 10, 180 with none), and a new leader reads them all: 0 keeps none (an entry's "
        "next claim drops its list), for schedules of many thousands of entries or a small ZooKeeper heap.",
    )
    auth: tuple[tuple[str, str], ...] = _setting(
        (),
        shown="``None``",
        help="E.g. ``[('digest', 'user:secret')]``; znodes are created with an ACL that grants each digest "
        "identity listed every permission, and nobody else; the secret is never shown. To rotate it, list both "
        "credentials for a while (see Operating: rotating ``zkbeat_auth``).",
    )
    use_ssl: bool = _setting(
        False,
        shown="``False``",
        help="TLS to ZooKeeper; ``zkbeat_hosts`` then names its ``secureClientPort``.",
    )
    ssl_ca: str | None = _setting(
        None,
        shown="``None`` (the system's CAs)",
        help="CA file the ZooKeeper server's certificate must chain to.",
    )
    ssl_cert: str | None = _setting(
        None,
        shown="``None``",
        help="Client certificate file, for a server with ``ssl.clientAuth=need``.",
    )
    ssl_key: str | None = _setting(
        None,
        shown="``None``",
        help="Private key file of ``zkbeat_ssl_cert``.",
    )
    #: Port for Prometheus metrics and /healthz; None keeps them off.
    metrics_port: int | None = _setting(
        None,
        shown="``None`` (off)",
        help="Port of Prometheus ``/metrics`` and ``/healthz`` (needs ``zkbeat[metrics]``).",
    )
    metrics_address: str = _setting(
        "0.0.0.0",
        shown="``0.0.0.0``",
        help="Address the metrics port binds to.",
    )

    liveness: bool = _setting(
        True,
        shown="``True``",
        help="Each replica listens on a small socket whose end its successor sees at once, so a crashed "
        "process (kill -9, the OOM killer) is replaced in milliseconds instead of a session timeout; "
        "``False`` leaves crash detection to the session.",
    )
    liveness_address: tuple[str, int] | None = _setting(
        None,
        shown="the local address of the replica's ZooKeeper connection, any free port",
        help="``'host'`` or ``'host:port'`` (``[v6]:port``) the liveness socket binds to and announces; "
        "the other replicas must be able to connect to it. Port 0 takes any free port.",
    )
    stall_timeout: float = _setting(
        DEFAULT_STALL_TIMEOUT,
        shown="``30.0``",
        help="Seconds a leader's pass of the beat loop may take (a publish to a black-holed broker, a hung "
        "query, a deadlock) before the replica steps down and lets another lead; it contends again once its "
        "loop turns. Must exceed the longest legitimate pass (kombu's broker wait of 5 s, a 1,000-entry batch). "
        "Also how long a new leader whose schedule has not loaded (a DatabaseScheduler that cannot read its "
        "database) holds the lead before it steps aside for 30 s.",
    )
    broker_handover_timeout: float = _setting(
        DEFAULT_BROKER_HANDOVER_TIMEOUT,
        shown="``15.0``",
        help="Seconds a leader may fail to reach the broker (counted from the start of the publish or connection "
        "that failed) before it asks the other replicas to take over; the next in line that reaches the broker "
        "does. In a broker outage nobody does, and leadership stays put. Longer than one publish's 10 s wait for "
        "Redis's answer, so one slow reply never moves leadership. ``0`` never hands over for the broker.",
    )
    shards: int = _setting(
        1,
        shown="``1``",
        help="Shards the schedule is split into (1 to 64): each entry belongs to one shard by a stable hash of "
        "the root and its name, each shard has its own election, and the replicas share the shards' leadership "
        "(docs/sharding.md). ``1`` is one leader for everything. Change it by a rolling restart.",
    )

    def __repr__(self) -> str:
        # Credentials never reach a log line or a traceback through repr().
        auth = [(scheme, _REDACTED) for scheme, _ in self.auth]
        return (
            f"Settings(hosts={self.hosts!r}, root={self.root!r}, "
            f"session_timeout={self.session_timeout!r}, identity={self.identity!r}, "
            f"misfire_grace_time={self.misfire_grace_time!r}, auth={auth!r}, "
            f"use_ssl={self.use_ssl!r}, liveness={self.liveness!r}, "
            f"liveness_address={self.liveness_address!r}, stall_timeout={self.stall_timeout!r})"
        )


def read_settings(
    conf: Mapping[str, Any],
    app_name: str | None = None,
    environ: Mapping[str, str] | None = None,
) -> Settings:
    """Read and validate every ``zkbeat_*`` setting from ``conf``.

    ``conf`` is a Celery ``app.conf`` or any mapping; ``environ`` defaults to
    ``os.environ`` and supplies ``ZKBEAT_HOSTS`` when ``zkbeat_hosts`` is unset.
    """
    environ = os.environ if environ is None else environ

    def get(name: str) -> Any:
        return conf.get(name)

    hosts = get("zkbeat_hosts")
    if hosts is None:
        hosts = environ.get("ZKBEAT_HOSTS") or DEFAULT_HOSTS
    use_ssl = _parse_bool("zkbeat_use_ssl", get("zkbeat_use_ssl"))
    return Settings(
        hosts=parse_hosts("zkbeat_hosts", hosts),
        root=parse_root("zkbeat_root", _or_default(get("zkbeat_root"), default_root(app_name))),
        session_timeout=_parse_session_timeout(get("zkbeat_session_timeout")),
        identity=_parse_identity(get("zkbeat_identity")),
        misfire_grace_time=parse_misfire_grace_time("zkbeat_misfire_grace_time", get("zkbeat_misfire_grace_time")),
        catchup=parse_catchup("zkbeat_catchup", _or_default(get("zkbeat_catchup"), "once")),
        catchup_limit=_parse_catchup_limit(get("zkbeat_catchup_limit")),
        jitter=parse_jitter("zkbeat_jitter", get("zkbeat_jitter")),
        recent_runs=_parse_recent_runs(get("zkbeat_recent_runs")),
        auth=_parse_auth(get("zkbeat_auth")),
        use_ssl=use_ssl,
        ssl_ca=_parse_file("zkbeat_ssl_ca", get("zkbeat_ssl_ca")),
        ssl_cert=_parse_file("zkbeat_ssl_cert", get("zkbeat_ssl_cert")),
        ssl_key=_parse_file("zkbeat_ssl_key", get("zkbeat_ssl_key")),
        metrics_port=_parse_port("zkbeat_metrics_port", get("zkbeat_metrics_port")),
        metrics_address=_parse_address("zkbeat_metrics_address", get("zkbeat_metrics_address")),
        liveness=_parse_bool("zkbeat_liveness", get("zkbeat_liveness"), default=True),
        liveness_address=parse_liveness_address("zkbeat_liveness_address", get("zkbeat_liveness_address")),
        stall_timeout=parse_stall_timeout("zkbeat_stall_timeout", get("zkbeat_stall_timeout")),
        broker_handover_timeout=parse_broker_handover_timeout(
            "zkbeat_broker_handover_timeout", get("zkbeat_broker_handover_timeout")
        ),
        shards=parse_shards("zkbeat_shards", get("zkbeat_shards")),
    )


def setting_names() -> tuple[str, ...]:
    """Every setting zkbeat reads, as ``app.conf`` names it (``zkbeat_hosts``, ...)."""
    return tuple(f"zkbeat_{each.name}" for each in fields(Settings))


#: A key that looks meant for zkbeat, in any spelling Celery or Django might hold it.
_LOOKS_LIKE_OURS = re.compile(r"^(celery_)?zkbeat_", re.IGNORECASE)


def unknown_settings(conf: Mapping[str, Any]) -> list[tuple[str, str | None]]:
    """Keys of ``conf`` that look like zkbeat settings but that zkbeat never reads, each with the closest one it does.

    A typo (``zkbeat_sesion_timeout``) is otherwise silently ignored. A key is
    read if ``conf.get`` of a setting's name resolves to it: the name itself,
    and under a Celery namespace (Django's ``CELERY``) also ``CELERY_ZKBEAT_*``.
    The suggestion is spelled as the key is (``CELERY_ZKBEAT_...`` for an
    upper-case one where that spelling is read), or None when nothing is close.
    """
    names = setting_names()
    conf.get(names[0])  # a Celery app's conf learns its namespace when it is first read
    read = {name: _keys_read(conf, name) for name in names}
    known = {key for keys in read.values() for key in keys}
    found = []
    for key in list(conf.keys()):
        if not isinstance(key, str) or key in known or not _LOOKS_LIKE_OURS.match(key):
            continue
        wanted = key.lower()
        wanted = wanted[len("celery_") :] if wanted.startswith("celery_") else wanted
        close = difflib.get_close_matches(wanted, names, n=1, cutoff=0.6)
        suggestion = None
        if close:
            spellings = read[close[0]]
            suggestion = next((s for s in spellings if s.isupper() == key.isupper()), spellings[0])
        found.append((key, suggestion))
    return sorted(found)


def _keys_read(conf: Mapping[str, Any], name: str) -> tuple[str, ...]:
    """The keys ``conf.get(name)`` looks up: Celery's namespaced Settings try ``CELERY_<NAME>`` first."""
    to_keys = getattr(conf, "_to_keys", None)
    if to_keys is None:
        return (name,)
    try:
        return tuple(to_keys(name))
    except Exception:  # noqa: BLE001 - a Celery without that helper: the name as written
        return (name,)


def _or_default(value: Any, default: Any) -> Any:
    """Unset (None) takes the default; an explicit empty value is an error, not a default."""
    return default if value is None else value


def default_root(app_name: str | None) -> str:
    """``/zkbeat/<app.main>``: apps with different names never share a ledger."""
    name = (app_name or "").strip()
    if not name or name == "__main__":
        name = "default"
    return "/zkbeat/" + name.replace("/", "_")


def parse_hosts(setting: str, value: Any) -> str:
    """A ZooKeeper connect string ``host:port,host:port[/chroot]``."""
    if not isinstance(value, str) or not value.strip():
        raise ConfigurationError(setting, value, "expected 'host:port[,host:port...][/chroot]'")
    value = value.strip()
    if re.search(r":0*(,|/|$)", value):
        raise ConfigurationError(setting, value, "port 0 is not a ZooKeeper port")
    try:
        pairs, chroot = collect_hosts(value)
    except ValueError as exc:
        raise ConfigurationError(setting, value, f"cannot parse connect string ({exc})") from None
    for host, port in pairs:
        if not host or not 0 < port < 65536:
            raise ConfigurationError(setting, value, f"bad host or port {host!r}:{port}")
    if chroot is not None:
        parse_root(setting, chroot)
    return value


def parse_root(setting: str, value: Any) -> str:
    """An absolute znode path without a trailing slash or empty parts."""
    if not isinstance(value, str) or not value.startswith("/"):
        raise ConfigurationError(setting, value, "expected an absolute znode path like '/zkbeat/proj'")
    if value != "/" and value.endswith("/"):
        value = value[:-1]
    parts = value.split("/")[1:]
    if value != "/" and any(part in ("", ".", "..") for part in parts):
        raise ConfigurationError(setting, value, "empty, '.' or '..' path components are not allowed")
    if any(_forbidden_in_path(ch) for ch in value):
        raise ConfigurationError(setting, value, "character not allowed in a ZooKeeper path")
    return value


def _forbidden_in_path(ch: str) -> bool:
    """ZooKeeper's own path rules (PathUtils.validatePath)."""
    code = ord(ch)
    return code < 0x20 or 0x7F <= code <= 0x9F or 0xD800 <= code <= 0xF8FF or 0xFFF0 <= code <= 0xFFFF


def parse_misfire_grace_time(setting: str, value: Any) -> float | None:
    """``None`` (catch up once, Celery's rule) or a number of seconds ≥ 0."""
    if value is None:
        return None
    if isinstance(value, timedelta):
        value = value.total_seconds()
    seconds = _parse_number(setting, value, "None or a number of seconds >= 0")
    if seconds < 0:
        raise ConfigurationError(setting, value, "must be None or a number of seconds >= 0")
    return seconds


#: The catch-up policies (zkbeat.ticking.catchup).
CATCHUP_POLICIES = ("once", "skip", "all")


def parse_catchup(setting: str, value: Any) -> str:
    """One of ``once``, ``skip``, ``all``."""
    if not isinstance(value, str) or value.strip().lower() not in CATCHUP_POLICIES:
        raise ConfigurationError(setting, value, f"expected one of {', '.join(CATCHUP_POLICIES)}")
    return value.strip().lower()


def _parse_catchup_limit(value: Any) -> int:
    if value is None:
        return 100
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_CATCHUP_LIMIT:
        expected = f"must be a whole number from 1 to {MAX_CATCHUP_LIMIT:,}"
        raise ConfigurationError("zkbeat_catchup_limit", value, expected)
    return value


def parse_shards(setting: str, value: Any) -> int:
    """A whole number from 1 to MAX_SHARDS (a whole-number string too: settings may come from the environment)."""
    if value is None:
        return 1
    number = value
    if isinstance(value, str) and value.strip().isdigit():
        number = int(value.strip())
    if isinstance(number, bool) or not isinstance(number, int) or not 1 <= number <= MAX_SHARDS:
        raise ConfigurationError(setting, value, f"must be a whole number from 1 to {MAX_SHARDS}")
    return number


def parse_jitter(setting: str, value: Any) -> float:
    """A number of seconds >= 0; ``None`` and 0 are off."""
    if value is None:
        return 0.0
    if isinstance(value, timedelta):
        value = value.total_seconds()
    seconds = _parse_number(setting, value, "a number of seconds >= 0 (0 = off)")
    if seconds < 0:
        raise ConfigurationError(setting, value, "must be a number of seconds >= 0 (0 = off)")
    return seconds


def _parse_recent_runs(value: Any) -> int:
    if value is None:
        return MAX_RECENT_RUNS
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_RECENT_RUNS:
        raise ConfigurationError("zkbeat_recent_runs", value, f"must be a whole number from 0 to {MAX_RECENT_RUNS}")
    return value


def _parse_session_timeout(value: Any) -> float:
    if value is None:
        return DEFAULT_SESSION_TIMEOUT
    seconds = _parse_number("zkbeat_session_timeout", value, "a number of seconds > 0")
    if seconds <= 0:
        raise ConfigurationError("zkbeat_session_timeout", value, "must be a number of seconds > 0")
    return seconds


def _parse_number(setting: str, value: Any, expected: str) -> float:
    if isinstance(value, bool):
        raise ConfigurationError(setting, value, f"expected {expected}")
    try:
        number = float(value)
    except (TypeError, ValueError, OverflowError):
        raise ConfigurationError(setting, value, f"expected {expected}") from None
    if not math.isfinite(number):
        raise ConfigurationError(setting, value, f"expected {expected}")
    return number


def _parse_port(setting: str, value: Any) -> int | None:
    if value is None or value == "":
        return None
    if isinstance(value, bool):
        raise ConfigurationError(setting, value, "expected a TCP port 1-65535 or None")
    try:
        port = int(value)
    except (TypeError, ValueError, OverflowError):  # OverflowError: float("inf")
        raise ConfigurationError(setting, value, "expected a TCP port 1-65535 or None") from None
    if not 0 < port < 65536 or port != float(value):
        raise ConfigurationError(setting, value, "expected a TCP port 1-65535 or None")
    return port


def _parse_address(setting: str, value: Any) -> str:
    if value is None:
        return "0.0.0.0"
    if not isinstance(value, str) or not value.strip():
        raise ConfigurationError(setting, value, "expected an address to bind, e.g. '0.0.0.0' or '127.0.0.1'")
    return value.strip()


def _parse_identity(value: Any) -> str:
    if value is None:
        return f"{socket.gethostname()}:{os.getpid()}"
    if not isinstance(value, str) or not value.strip():
        raise ConfigurationError("zkbeat_identity", value, "expected a non-empty string")
    if not value.strip().isprintable():
        # Logs, `zkbeat status` and every run in the ledger carry it: a control character garbles
        # the first and is written as six bytes in the last.
        raise ConfigurationError("zkbeat_identity", value, "expected printable characters (no control characters)")
    return value.strip()


def parse_liveness_address(setting: str, value: Any) -> tuple[str, int] | None:
    """``'host'``, ``'host:port'`` or ``'[v6]:port'`` (port 0 = any free port); None = the default."""
    if value is None or value == "":
        return None
    expected = "expected 'host' or 'host:port' (port 0-65535; '[v6]:port' for IPv6)"
    if not isinstance(value, str) or not value.strip():
        raise ConfigurationError(setting, value, expected)
    text = value.strip()
    port_text = ""
    if text.startswith("["):
        host, sep, rest = text[1:].partition("]")
        if not sep or (rest and not rest.startswith(":")):
            raise ConfigurationError(setting, value, expected)
        port_text = rest[1:]
    elif text.count(":") == 1:
        host, _, port_text = text.partition(":")
    else:
        host = text  # a bare name, an IPv4 address or a bare IPv6 address
    if not host or any(ch.isspace() for ch in host):
        raise ConfigurationError(setting, value, expected)
    if host in ("0.0.0.0", "::", "*"):
        raise ConfigurationError(
            setting, value, "the address is announced to the other replicas: name one they can connect to"
        )
    port = 0
    if port_text:
        if not port_text.isdigit() or not 0 <= int(port_text) < 65536:
            raise ConfigurationError(setting, value, expected)
        port = int(port_text)
    return host, port


def parse_stall_timeout(setting: str, value: Any) -> float:
    """Seconds > MIN_STALL_TIMEOUT (a pass may wait that long for the broker)."""
    if value is None:
        return DEFAULT_STALL_TIMEOUT
    seconds = _parse_number(setting, value, f"a number of seconds > {MIN_STALL_TIMEOUT:g}")
    if seconds <= MIN_STALL_TIMEOUT:
        raise ConfigurationError(
            setting,
            value,
            f"must be more than {MIN_STALL_TIMEOUT:g} s: a healthy pass may wait that long for the broker",
        )
    return seconds


def parse_broker_handover_timeout(setting: str, value: Any) -> float:
    """Seconds >= 0 (0 = never hand over for the broker); unset is the default."""
    if value is None:
        return DEFAULT_BROKER_HANDOVER_TIMEOUT
    if isinstance(value, timedelta):
        value = value.total_seconds()
    seconds = _parse_number(setting, value, "a number of seconds > 0, or 0 to never hand over for the broker")
    if seconds < 0:
        raise ConfigurationError(setting, value, "must be a number of seconds > 0, or 0 to never hand over")
    return seconds


def _parse_bool(setting: str, value: Any, default: bool = False) -> bool:
    if value is None:
        return default
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("1", "true", "yes", "on", "0", "false", "no", "off", ""):
        return value.strip().lower() in ("1", "true", "yes", "on")
    raise ConfigurationError(setting, value, "expected true or false")


def _parse_file(setting: str, value: Any) -> str | None:
    if value in (None, ""):
        return None
    if not isinstance(value, (str, os.PathLike)):
        raise ConfigurationError(setting, value, "expected a file path")
    path = os.fspath(value)
    if not os.path.isfile(path):
        raise ConfigurationError(setting, path, "file does not exist")
    return path


def _parse_auth(value: Any) -> tuple[tuple[str, str], ...]:
    if not value:
        return ()
    bad = ConfigurationError(
        "zkbeat_auth", _REDACTED, "expected a list of (scheme, credential) pairs, e.g. [('digest', 'user:secret')]"
    )
    if isinstance(value, (str, bytes)) or not hasattr(value, "__iter__"):
        raise bad
    pairs = []
    for item in value:
        if not isinstance(item, (tuple, list)) or len(item) != 2:
            raise bad
        scheme, credential = item
        if not isinstance(scheme, str) or not isinstance(credential, str) or not scheme or not credential:
            raise bad
        if not _AUTH_SCHEME.fullmatch(scheme):
            # Settings' repr shows schemes: a credential put first must not be one.
            raise ConfigurationError("zkbeat_auth", _REDACTED, "a scheme is a name like 'digest'; swapped pair?")
        if scheme == "digest" and ":" not in credential:
            raise ConfigurationError("zkbeat_auth", _REDACTED, "a digest credential is 'user:password'")
        pairs.append((scheme, credential))
    return tuple(pairs)

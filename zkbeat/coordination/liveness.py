"""Seeing a crashed predecessor through the kernel, not through its session.

When a process dies (kill -9, the OOM killer, a segfault) the kernel closes
its sockets at once, whereas ZooKeeper only notices when the session times
out. So each candidate listens on a small socket (the :class:`Beacon`) and
announces host, port and a random token in its candidate data, and each
follower keeps a connection open to its predecessor's beacon (the
:class:`Watcher`). The protocol is only the token: the follower sends the
token it read from ZooKeeper, the beacon answers with the same token (and,
asked, with the address it sees the connection come from), and then neither
side sends anything ever again.

A refusal proves a death only when it comes from the beacon's own host: a
restarting proxy, sidecar, docker-proxy or port-forward in between ends the
connection and refuses the re-dial while the process lives. So the beacon
tells the watcher where it sees the connection come from, and the watcher
compares that with its own end of it: equal means nothing in between
relays the connection (a direct path); anything else (a proxy, NAT) means
an end or a refusal there says nothing about the process.

===========================================  ================================
the watcher sees                              it concludes
===========================================  ================================
the beacon answers its token, direct path     alive: hold the connection
the beacon answers, but sees the connection   nothing can be concluded there:
come from elsewhere (a proxy, NAT)            logged once (INFO); the session
                                              decides
end of stream or reset on a verified          maybe gone: dial again
connection
that re-dial refused, closed without the      gone: delete that exact
token, or answered with another token         candidate znode (WARNING, counted
                                              in zkbeat_liveness_deposals_total)
that re-dial answered with the token          alive (a spurious end): watch on
that re-dial silent (timeout, unreachable)    nothing; the session decides
the candidate is already gone (a graceful     it left: DEBUG, nothing to do
stop deleted it before closing its socket)
a candidate announcing a socket this          it lived after all (something
watcher once deposed it by                    between refused for it): its
                                              session decides from now on
no answer on the first dial, ever             unreachable (logged once); the
                                              session decides
silence on a verified connection              nothing (SIGSTOP, a lost host,
                                              a partition): the session decides
===========================================  ================================

A refusal counts only after a connection to that candidate was once
verified: a follower behind a firewall that rejects never mistakes the
rejection for a death. Each verdict is reached once per candidate and
logged once, at the level it deserves. Safety never rests on this module: a
candidate deleted while its process in fact lives only fences that
process's next claim (one handover, never a duplicate), because every claim
checks its own candidate in the same ZooKeeper transaction.

A beacon of an older release (no ``protocol`` in its announcement) is
dialled as before: it cannot say where it sees a connection from, so its
path is taken as direct.

The beacon is bounded: at most ``MAX_CONNECTIONS`` connections at a time
(beyond that it stops accepting, so the kernel's backlog holds the rest and
a dial there is merely silent, which proves nothing), a stranger has
``HANDSHAKE_TIMEOUT`` seconds to send the token, reads are at most the
hello's length, and anything else a peer sends closes its connection.
"""

from __future__ import annotations

import contextlib
import errno
import hmac
import ipaddress
import logging
import secrets
import selectors
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kazoo.client import KazooClient
from kazoo.exceptions import NoNodeError
from kazoo.hosts import collect_hosts

from .candidates import CandidateNode

__all__ = [
    "Beacon",
    "Watcher",
    "Announcement",
    "local_address",
    "default_host",
    "MAX_CONNECTIONS",
    "HANDSHAKE_TIMEOUT",
]

logger = logging.getLogger(__name__)

#: Connections a beacon holds at once (followers, their re-dials, strangers).
MAX_CONNECTIONS = 64
#: Seconds a new connection has to send the token before it is closed.
HANDSHAKE_TIMEOUT = 2.0
#: Seconds a watcher's dial may take (connect and the token's answer).
DIAL_TIMEOUT = 1.0
#: Seconds between a watcher's attempts while its predecessor is unreachable.
REDIAL_DELAY = 2.0
#: Pending connections the kernel queues while the beacon is at its cap.
_BACKLOG = 16
_TOKEN_BYTES = 16
#: The token on the wire: hex, so its length is fixed.
TOKEN_LENGTH = 2 * _TOKEN_BYTES
#: Key of the announcement in a candidate's data (an extra key: layout v1 as before).
DATA_KEY = "liveness"
#: The liveness protocol this release's beacons speak: 2 answers, when asked,
#: with the address the connection is seen to come from; 1 (older releases) only the token.
PROTOCOL = 2
#: First byte of a hello that asks for that address: never a hex digit, so a
#: protocol-1 hello (the bare token) is told apart by its first byte.
_ASK = b"@"
#: Longest address line a beacon sends after its token ("<ip> <port>\n").
_ADDRESS_MAX = 64
#: Deposed sockets, and candidates with a verdict, a watcher remembers (see Watcher): more than a line ever holds.
_DEPOSED_KEPT = 256


@dataclass(frozen=True)
class Announcement:
    """Where a candidate's beacon listens, and the token it answers with."""

    host: str
    port: int
    token: str
    #: 1: an older release's beacon, which answers the token only (see PROTOCOL).
    protocol: int = 1

    def as_data(self) -> dict[str, Any]:
        data: dict[str, Any] = {"host": self.host, "port": self.port, "token": self.token}
        if self.protocol > 1:
            data["protocol"] = self.protocol
        return {DATA_KEY: data}

    @classmethod
    def of(cls, candidate: CandidateNode) -> Announcement | None:
        """The announcement in a candidate's data, or None (liveness off, an older zkbeat, bad data)."""
        raw = candidate.data.get(DATA_KEY) if candidate.readable else None
        if not isinstance(raw, dict):
            return None
        host, port, token = raw.get("host"), raw.get("port"), raw.get("token")
        if not isinstance(host, str) or not host or isinstance(port, bool) or not isinstance(port, int):
            return None
        if not 0 < port < 65536 or not isinstance(token, str) or len(token) != TOKEN_LENGTH:
            return None
        protocol = raw.get("protocol", 1)
        if isinstance(protocol, bool) or not isinstance(protocol, int) or protocol < 1:
            protocol = 1
        return cls(host, port, token, min(protocol, PROTOCOL))


def local_address(hosts: str, timeout: float = 1.0) -> str | None:
    """The local address this host would use to reach the first answering ZooKeeper host.

    ``hosts`` is any connect string kazoo takes: ports may be left out
    (2181), IPv6 literals are bracketed, a chroot may follow. A UDP
    "connect" only asks the kernel for a route; nothing is sent. That
    address is reachable wherever ZooKeeper is (the replicas reach it too).
    """
    try:
        servers, _ = collect_hosts(hosts)
    except ValueError:
        return None
    for host, port in servers:
        try:
            infos = socket.getaddrinfo(host, port, type=socket.SOCK_DGRAM)
        except (OSError, UnicodeError):
            continue
        for family, kind, proto, _, address in infos:
            try:
                with socket.socket(family, kind, proto) as probe:
                    probe.settimeout(timeout)
                    probe.connect(address)
                    return probe.getsockname()[0]
            except OSError:
                continue
    return None


def default_host(hosts: str) -> str:
    """Where a beacon listens unless ``zkbeat_liveness_address`` says: the route to ZooKeeper, else loopback.

    Loopback only reaches replicas on this host: when ZooKeeper is not on
    loopback too, that is said at WARNING, since a crash of this replica
    is then seen only at its session timeout.
    """
    found = local_address(hosts)
    if found is not None:
        return found
    if not _on_loopback(hosts):
        logger.warning(
            "zkbeat: no route to any host of zkbeat_hosts (%s) to pick the liveness socket's address from; it "
            "listens on 127.0.0.1, which replicas on other hosts cannot reach, so a crash of this replica is seen "
            "only at its session timeout: set zkbeat_liveness_address to an address they can connect to",
            hosts,
        )
    return "127.0.0.1"


def _on_loopback(hosts: str) -> bool:
    """True when every ZooKeeper host of ``hosts`` is named as this host's loopback."""
    try:
        servers, _ = collect_hosts(hosts)
    except ValueError:
        return False
    for host, _ in servers:
        if host.lower() == "localhost":
            continue
        try:
            if not ipaddress.ip_address(host).is_loopback:
                return False
        except ValueError:
            return False
    return bool(servers)


class _Conn:
    """One connection to the beacon: its bytes so far and its deadline."""

    __slots__ = ("sock", "received", "deadline", "verified")

    def __init__(self, sock: socket.socket, deadline: float) -> None:
        self.sock = sock
        self.received = b""
        self.deadline = deadline
        self.verified = False


class Beacon:
    """A candidate's liveness socket: answers its own token, and nothing else.

    One small thread with a selector; no asyncio. Limits: it never sends
    anything but the token (and, asked, the address it sees the connection
    come from), and never more than once per connection; ``close()`` is
    safe to call twice.
    """

    def __init__(self, host: str, port: int = 0, token: str | None = None) -> None:
        self.token = token or secrets.token_hex(_TOKEN_BYTES)
        self._token = self.token.encode("ascii")
        self._listener = socket.create_server((host, port), family=_family(host), backlog=_BACKLOG)
        self._listener.setblocking(False)
        # The bound address, not the name asked for: what the others dial.
        self.host, self.port = self._listener.getsockname()[:2]
        self._selector = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._selector.register(self._wake_r, selectors.EVENT_READ, None)
        self._selector.register(self._listener, selectors.EVENT_READ, None)
        self._accepting = True
        self._conns: dict[socket.socket, _Conn] = {}
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="zkbeat-liveness", daemon=True)

    @property
    def announcement(self) -> Announcement:
        return Announcement(self.host, self.port, self.token, PROTOCOL)

    @property
    def connections(self) -> int:
        """Connections held now (for tests and status)."""
        return len(self._conns)

    def start(self) -> Beacon:
        self._thread.start()
        return self

    def close(self) -> None:
        """Stop listening and drop every connection (a watcher sees an end of stream)."""
        if self._closed:
            return
        self._closed = True
        with contextlib.suppress(OSError):
            self._wake_w.send(b"x")
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(2.0)
        if self._thread.is_alive():
            return  # it closes everything itself on its way out
        self._close_all()

    def _close_all(self) -> None:
        for sock in [self._listener, *self._conns, self._wake_r, self._wake_w]:
            with contextlib.suppress(OSError):
                sock.close()
        self._conns.clear()
        with contextlib.suppress(Exception):
            self._selector.close()

    def _run(self) -> None:
        try:
            while not self._closed:
                try:
                    self._turn()
                except Exception:  # noqa: BLE001 - a bug here must not end liveness silently
                    logger.exception("zkbeat: liveness socket error; going on")
                    time.sleep(0.1)
        finally:
            self._close_all()

    def _turn(self) -> None:
        now = time.monotonic()
        deadlines = [c.deadline for c in self._conns.values() if not c.verified]
        timeout = max(0.0, min(deadlines) - now) if deadlines else None
        for key, _ in self._selector.select(timeout):
            sock = key.fileobj
            if sock is self._wake_r:
                with contextlib.suppress(OSError):
                    self._wake_r.recv(64)
            elif sock is self._listener:
                self._accept()
            else:
                self._readable(sock)  # type: ignore[arg-type]
        now = time.monotonic()
        for conn in [c for c in self._conns.values() if not c.verified and c.deadline <= now]:
            self._drop(conn.sock)
        self._pace()

    def _accept(self) -> None:
        for _ in range(MAX_CONNECTIONS):
            if len(self._conns) >= MAX_CONNECTIONS:
                return
            try:
                sock, _ = self._listener.accept()
            except BlockingIOError:
                return
            except OSError as exc:
                if exc.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    logger.warning("zkbeat: liveness socket cannot accept (%s); pausing", exc)
                    time.sleep(0.1)
                return
            sock.setblocking(False)
            self._conns[sock] = _Conn(sock, time.monotonic() + HANDSHAKE_TIMEOUT)
            self._selector.register(sock, selectors.EVENT_READ, None)

    def _pace(self) -> None:
        """Stop accepting at the cap (the kernel's backlog waits), resume below it."""
        full = len(self._conns) >= MAX_CONNECTIONS
        if full and self._accepting:
            self._selector.unregister(self._listener)
            self._accepting = False
        elif not full and not self._accepting:
            self._selector.register(self._listener, selectors.EVENT_READ, None)
            self._accepting = True

    def _readable(self, sock: socket.socket) -> None:
        conn = self._conns.get(sock)
        if conn is None:
            return
        if conn.verified:
            # A verified peer never sends again: bytes or an end both close it.
            self._drop(sock)
            return
        try:
            data = sock.recv(_hello_length(conn.received) - len(conn.received))
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self._drop(sock)
            return
        if not data:
            self._drop(sock)
            return
        conn.received += data
        asks = conn.received[:1] == _ASK
        token = conn.received[1:] if asks else conn.received
        if not hmac.compare_digest(token, self._token[: len(token)]):
            self._drop(sock)  # not our token: a stranger, garbage or another candidate's follower
            return
        if len(conn.received) < _hello_length(conn.received):
            return
        answer = self._token
        if asks:
            try:
                peer = sock.getpeername()
            except OSError:
                self._drop(sock)
                return
            answer += f"{peer[0]} {peer[1]}\n".encode("ascii")
        try:
            sock.send(answer)  # under 100 bytes into an empty send buffer: never partial
        except OSError:
            self._drop(sock)
            return
        conn.verified = True

    def _drop(self, sock: socket.socket) -> None:
        self._conns.pop(sock, None)
        with contextlib.suppress(Exception):
            self._selector.unregister(sock)
        with contextlib.suppress(OSError):
            sock.close()


def _hello_length(received: bytes) -> int:
    """Bytes of the hello begun with ``received``: the token, after the ask byte in protocol 2."""
    return TOKEN_LENGTH + 1 if received[:1] == _ASK else TOKEN_LENGTH


def _family(host: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ":" in host else socket.AF_INET


#: Outcomes of one dial.
ALIVE = "alive"
GONE = "gone"
SILENT = "silent"
#: The beacon answered, but something between relays the connection: no verdict can rest on it.
PROXIED = "proxied"


def dial(announcement: Announcement, timeout: float = DIAL_TIMEOUT) -> tuple[str, socket.socket | None, str]:
    """Connect to a beacon and check its token.

    Returns (ALIVE, socket, ""), (GONE, None, why), (SILENT, None, why), or
    (PROXIED, None, why) when the beacon sees the connection come from
    elsewhere than this end of it (protocol 2 only).
    """
    deadline = time.monotonic() + timeout
    try:
        sock = socket.create_connection((announcement.host, announcement.port), timeout=timeout)
    except ConnectionRefusedError:
        return GONE, None, "refused"
    except OSError as exc:
        return SILENT, None, repr(exc)
    expected = announcement.token.encode("ascii")
    asks = announcement.protocol >= 2
    try:
        sock.sendall(_ASK + expected if asks else expected)
        answer = _receive(sock, deadline, TOKEN_LENGTH)
        seen = _receive(sock, deadline, _ADDRESS_MAX, until=b"\n") if asks and answer == expected else b""
    except TimeoutError:
        sock.close()
        return SILENT, None, "no answer"
    except OSError as exc:
        sock.close()
        if exc.errno in (errno.ECONNRESET, errno.EPIPE, errno.ECONNREFUSED):
            return GONE, None, "reset"
        return SILENT, None, repr(exc)
    if answer != expected:
        sock.close()
        return GONE, None, "closed without the token" if not answer else "answered with another token"
    if asks:
        here = sock.getsockname()
        there = _endpoint(seen)
        if there != _endpoint(f"{here[0]} {here[1]}".encode("ascii")):
            sock.close()
            shown = seen.decode("ascii", "replace").strip() or "nothing"
            return PROXIED, None, f"the beacon sees it come from {shown}, this end is {here[0]} {here[1]}"
    sock.settimeout(None)
    sock.setblocking(False)
    return ALIVE, sock, ""


def _receive(sock: socket.socket, deadline: float, limit: int, until: bytes | None = None) -> bytes:
    """Up to ``limit`` bytes (or through ``until``), before ``deadline``; less if the peer ends first."""
    received = b""
    while len(received) < limit and not (until and until in received):
        sock.settimeout(max(0.01, deadline - time.monotonic()))
        chunk = sock.recv(limit - len(received) if until is None else 1)
        if not chunk:
            break
        received += chunk
    return received


def _endpoint(text: bytes) -> tuple[str, int] | None:
    """``b"<ip> <port>"`` as a comparable (address, port); an IPv4-mapped IPv6 address as IPv4."""
    try:
        host, port = text.decode("ascii").split()
        address = ipaddress.ip_address(host.split("%", 1)[0])
        if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
            address = address.ipv4_mapped
        return str(address), int(port)
    except (UnicodeDecodeError, ValueError):
        return None


class Watcher:
    """A follower's watch on its predecessor's beacon, on a thread of its own.

    ``follow(candidate)`` is called with the current predecessor (or None)
    from any thread and never blocks; the watcher's thread dials, waits,
    and on a confirmed death deletes that exact candidate znode, so the
    election goes on as after a graceful stop (its watch on the predecessor
    fires). Every ZooKeeper call is made on this thread, never in a kazoo
    callback. Each candidate gets one verdict (the table in the module
    docstring); after it the watcher waits for the next predecessor.

    ``on_gone(candidate, why)`` is called on this thread after each deposal
    (the scheduler counts them). A socket deposed once is remembered by its
    token: if its candidate comes back announcing it, its process lived, and
    this watcher leaves it to its session from then on.
    """

    def __init__(self, client: KazooClient, on_gone: Callable[[CandidateNode, str], None] | None = None) -> None:
        self.client = client
        self._target: CandidateNode | None = None
        self._lock = threading.Lock()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._closed = False
        self._on_gone = on_gone
        #: Candidates this watcher deleted (their paths), for tests and logs.
        self.deleted: list[str] = []
        self._unreachable_logged: set[str] = set()
        #: Tokens of the sockets this watcher deposed, with the candidate each was announced by.
        self._deposed: dict[str, str] = {}
        #: Candidates whose verdict is in (their paths, oldest first): never watched, nor logged, again. More
        #: than the last one: a rejoin can put a newer candidate between, and when it leaves, the one before
        #: it is followed again.
        self._concluded: dict[str, None] = {}
        self._thread = threading.Thread(target=self._run, name="zkbeat-liveness-watch", daemon=True)

    def start(self) -> Watcher:
        self._thread.start()
        return self

    def follow(self, candidate: CandidateNode | None) -> None:
        """Watch ``candidate`` from now on (None: nobody). Any thread; never blocks."""
        with self._lock:
            if (candidate.path if candidate else None) == (self._target.path if self._target else None):
                return
            self._target = candidate
        self._wake()

    def close(self) -> None:
        self._closed = True
        self._wake()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(2.0)
        for sock in (self._wake_r, self._wake_w):
            with contextlib.suppress(OSError):
                sock.close()

    def _wake(self) -> None:
        with contextlib.suppress(OSError):
            self._wake_w.send(b"x")

    def _drain(self) -> None:
        with contextlib.suppress(OSError):
            while self._wake_r.recv(64):
                pass

    def _current(self, candidate: CandidateNode) -> bool:
        return not self._closed and self._target is candidate

    def _run(self) -> None:
        while not self._closed:
            self._drain()
            target = self._target
            try:
                announcement = Announcement.of(target) if target is not None else None
                if target is None or announcement is None or target.path in self._concluded:
                    self._sleep(None)
                    continue
                if self._watch(target, announcement):
                    self._concluded[target.path] = None
                    while len(self._concluded) > _DEPOSED_KEPT:
                        del self._concluded[next(iter(self._concluded))]
            except Exception:  # noqa: BLE001 - liveness is an optimisation: never die of it
                logger.exception("zkbeat: liveness watch failed; the session decides meanwhile")
                self._sleep(REDIAL_DELAY)

    def _sleep(self, timeout: float | None) -> None:
        """Wait for a change of predecessor (or close), at most ``timeout`` seconds."""
        with selectors.DefaultSelector() as selector:
            selector.register(self._wake_r, selectors.EVENT_READ)
            selector.select(timeout)

    def _watch(self, target: CandidateNode, announcement: Announcement) -> bool:
        """Follow one predecessor until its verdict is in (True) or it is no longer the one followed (False)."""
        name = _name(target)
        if announcement.token in self._deposed:
            logger.info(
                "zkbeat: %s announces the liveness socket it was deposed by before (as %s), so its process lived "
                "and something between refused for it; its session decides when it is gone",
                name,
                self._deposed[announcement.token],
            )
            return True
        verified = False
        while self._current(target):
            outcome, sock, why = dial(announcement)
            if outcome == ALIVE:
                assert sock is not None
                verified = True
                self._unreachable_logged.discard(target.path)
                logger.debug("zkbeat: watching the liveness of %s at %s:%s", target.path, announcement.host,
                             announcement.port)  # fmt: skip
                if not self._wait_for_end(target, sock):
                    return False  # the predecessor changed (or we close)
                continue  # an end of stream: the next dial confirms or refutes it
            if outcome == PROXIED:
                logger.info(
                    "zkbeat: the liveness connection to %s at %s:%s goes through something that relays it (a "
                    "proxy, a sidecar, NAT: %s); its end or a refusal there says nothing about the process, so its "
                    "session decides when it is gone",
                    name,
                    announcement.host,
                    announcement.port,
                    why,
                )
                return True
            if outcome == GONE and verified:
                self._gone(target, announcement, why)
                return True
            if target.path not in self._unreachable_logged:
                if outcome == GONE and not self._exists(target):
                    logger.debug("zkbeat: %s left: its candidate is gone and its liveness socket %s", name, why)
                    return True
                self._unreachable_logged.add(target.path)
                log = logger.info if verified else logger.warning
                log(
                    "zkbeat: cannot reach the liveness socket of %s at %s:%s (%s); its session decides when it is gone",
                    name,
                    announcement.host,
                    announcement.port,
                    why,
                )
            self._sleep(REDIAL_DELAY)
        return False

    def _wait_for_end(self, target: CandidateNode, sock: socket.socket) -> bool:
        """Block until the connection ends (True) or the predecessor changes (False)."""
        with sock, selectors.DefaultSelector() as selector:
            selector.register(self._wake_r, selectors.EVENT_READ, "wake")
            selector.register(sock, selectors.EVENT_READ, "peer")
            while True:
                events = selector.select()
                if any(key.data == "peer" for key, _ in events):
                    # The beacon never sends after its token: readable means an end.
                    return True
                self._drain()
                if not self._current(target):
                    return False

    def _exists(self, target: CandidateNode) -> bool:
        try:
            return self.client.exists(target.path) is not None
        except Exception:  # noqa: BLE001 - unknown: say it as if it were there
            return True

    def _gone(self, target: CandidateNode, announcement: Announcement, why: str) -> None:
        """The predecessor's process is gone (its socket refused on a direct path): delete that exact candidate."""
        name = _name(target)
        try:
            _, stat = self.client.get(target.path)
            if stat.ephemeralOwner != target.owner:
                return  # not that candidate any more (cannot happen: paths are never reused)
            self.client.delete(target.path, version=stat.version)
        except NoNodeError:
            # A graceful stop deletes the candidate before it closes the socket.
            logger.debug("zkbeat: %s left: its candidate is gone and its liveness socket %s", name, why)
            return
        except Exception as exc:  # noqa: BLE001 - the session removes it in the end
            logger.warning("zkbeat: could not delete the candidate %s of a dead process: %r", target.path, exc)
            return
        self.deleted.append(target.path)
        self._deposed[announcement.token] = target.path
        while len(self._deposed) > _DEPOSED_KEPT:
            del self._deposed[next(iter(self._deposed))]
        logger.warning(
            "zkbeat: %s is gone: its liveness connection ended and a re-dial was %s; deleted its candidate instead "
            "of waiting for its session",
            name,
            why,
        )
        if self._on_gone is not None:
            self._on_gone(target, why)


def _name(candidate: CandidateNode) -> str:
    """A candidate as people read it: its identity and place in line (its sequence), else its znode."""
    identity = candidate.data.get("identity") if candidate.readable else None
    return f"{identity} (candidate {candidate.sequence})" if isinstance(identity, str) else candidate.path

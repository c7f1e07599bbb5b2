"""Real ZooKeeper and Redis servers for the test suite, plus session "powers".

Everything here runs genuine server processes on free loopback ports, each in
its own temporary directory with its log written to a file there (never to the
pytest terminal).  A missing server binary is a hard error, never a skip: a
suite that silently skips its integration tests proves nothing.

Processes are started in their own session (so a Ctrl-C in the terminal does
not race our own shutdown), are killed by an ``atexit`` hook if a test forgets
them, and -- when started from the main thread -- get a parent-death signal
through ``setpriv`` so that not even a SIGKILLed pytest leaves JVMs behind.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import random
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import TypeVar

from kazoo.client import KazooClient, KazooState

from tests.support.helpers import wait_for

JAVA_DIR = Path("/usr/share/java")
ZOOKEEPER_JAR = JAVA_DIR / "zookeeper.jar"
# zookeeper.jar's manifest Class-Path already names Debian's jute, netty,
# metrics-core, commons-cli, snappy, jackson and slf4j-api jars, so the
# classpath only has to add a logging backend (slf4j-simple logs to stderr,
# which we redirect to the log file).
ZOOKEEPER_CLASSPATH = f"{ZOOKEEPER_JAR}:{JAVA_DIR / 'slf4j-simple.jar'}"
ZOOKEEPER_HINT = "apt-get install -y zookeeper"
JAVA_HINT = "apt-get install -y default-jre-headless"
REDIS_HINT = "apt-get install -y redis-server"

STANDALONE_MAIN = "org.apache.zookeeper.server.ZooKeeperServerMain"
QUORUM_MAIN = "org.apache.zookeeper.server.quorum.QuorumPeerMain"

# A small heap, the cheap JIT tier and the serial GC make a short-lived JVM
# start in well under a second on a small machine (the heap's maximum is
# ZooKeeperServer's ``heap_mb``, DEFAULT_HEAP_MB unless asked).  preAllocSize (KiB) stops
# every transaction log from pre-allocating 64 MiB; forceSync=no skips fsync,
# which only matters for machine crashes, not for the process kills tests do.
#: The maximum heap of a ZooKeeper the tests start (MB): plenty for their znodes. The bench's
#: 100,000-entry ledgers need more (``python -m bench --zk-heap-mb``).
DEFAULT_HEAP_MB = 256
JVM_FLAGS = (
    "-XX:+UseSerialGC",
    "-XX:TieredStopAtLevel=1",
    "-XX:-UsePerfData",
    "-Djava.net.preferIPv4Stack=true",
    "-Dzookeeper.admin.enableServer=false",
    "-Dzookeeper.preAllocSize=1024",
    "-Dzookeeper.forceSync=no",
    "-Dorg.slf4j.simpleLogger.showDateTime=true",
    "-Dorg.slf4j.simpleLogger.dateTimeFormat=HH:mm:ss.SSS",
)

FOUR_LETTER_WHITELIST = "ruok,srvr,stat,mntr,cons,wchc,wchp,wchs,dump,conf"


#: Where free_port() looks: below the kernel's ephemeral range, from this port up.
_PICKED_FROM = 20000
_pick = random.SystemRandom()  # not the random module's seed, which a plugin may make the same in every worker
#: Ports free_port() has handed out in this process.
_handed: set[int] = set()


def _worker() -> tuple[int, int]:
    """This pytest-xdist worker's index and the number of workers ((0, 1) outside xdist)."""
    name = os.environ.get("PYTEST_XDIST_WORKER", "")
    try:
        count = max(int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")), 1)
        index = int(name[2:]) if name.startswith("gw") else 0
    except ValueError:
        return 0, 1
    return (index, count) if 0 <= index < count else (0, 1)


def _ephemeral_low() -> int:
    """The first port of the kernel's ephemeral range (where bind(0) and outgoing connections take theirs)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 0


def free_port() -> int:
    """Return a loopback TCP port that was free a moment ago.

    Most callers hand the port to a server that binds it later (a replica's
    /metrics, a ZooKeeper). A port from the ephemeral range could be taken
    meanwhile by any outgoing connection on the machine (the kernel's pick
    for a client socket); one below that range is taken only by another
    explicit bind, so it is picked there, at random, when the range allows.
    """
    low = _ephemeral_low()
    # Each pytest-xdist worker picks from its own residues (no two workers hand out one port), and a process
    # never hands out a port twice (a port picked is bound later, often after the next pick).
    index, count = _worker()
    slots = (low - _PICKED_FROM - index) // count
    for _ in range(50 if slots >= 1000 // count else 0):
        port = _PICKED_FROM + index + count * _pick.randrange(slots)
        if port in _handed:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
        _handed.add(port)
        return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def require_binary(path_or_name: str, install_hint: str, *, what: str | None = None) -> str:
    """Return the absolute path of a required program or file, or fail loudly.

    ``path_or_name`` is either a path (checked for existence) or a command
    name (looked up on ``PATH``).  The error names the install command so a
    fresh machine can be fixed without reading this file.
    """
    if os.sep in path_or_name:
        found = path_or_name if os.path.exists(path_or_name) else None
    else:
        found = shutil.which(path_or_name)
    if found is None:
        label = what or os.path.basename(path_or_name)
        raise RuntimeError(f"{label} is not installed ({path_or_name} missing): run `{install_hint}` or `make test`")
    return found


# --------------------------------------------------------------------------
# Process management shared by all servers
# --------------------------------------------------------------------------

# (typing.Self would need Python 3.11; the project supports 3.10.)
S = TypeVar("S", bound="_ServerProcess")
E = TypeVar("E", bound="ZooKeeperEnsemble")

_UNCLOSED: set[_ServerProcess] = set()
_UNCLOSED_LOCK = threading.Lock()


@atexit.register
def _close_leftovers() -> None:
    """Kill every server not closed by its owner and remove its directory."""
    with _UNCLOSED_LOCK:
        leftovers = list(_UNCLOSED)
    for server in leftovers:
        server.close()


class _ServerProcess:
    """A server process living in a private temp dir, with its log in a file."""

    _prefix = "zkbeat-server-"
    _log_name = "server.log"

    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix=self._prefix))
        self._proc: subprocess.Popen[bytes] | None = None
        with _UNCLOSED_LOCK:
            _UNCLOSED.add(self)

    # -- subclass hooks ---------------------------------------------------
    def _command(self) -> list[str]:
        raise NotImplementedError

    def _ready(self) -> bool:
        raise NotImplementedError

    # -- lifecycle --------------------------------------------------------
    @property
    def log_path(self) -> Path:
        return self.dir / self._log_name

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self.running and self._proc else None

    def launch(self) -> None:
        """Spawn the process without waiting for it to serve (see ``wait_ready``)."""
        if self.running:
            return
        cmd = self._command()
        # PDEATHSIG fires when the *thread* that forked us exits, so only ask
        # for it from the main thread, which lives as long as pytest does.
        setpriv = shutil.which("setpriv")
        if setpriv and threading.current_thread() is threading.main_thread():
            cmd = [setpriv, "--pdeathsig", "KILL", "--", *cmd]
        with open(self.log_path, "ab") as log:
            self._proc = subprocess.Popen(
                cmd,
                cwd=self.dir,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def wait_ready(self, timeout: float = 30) -> None:
        """Block until the server serves, or raise with the tail of its log."""
        if not wait_for(lambda: not self.running or self._ready(), timeout, 0.05, raise_on_timeout=False):
            raise RuntimeError(f"{self!r} not ready after {timeout}s\n{self.log_tail()}")
        if not self.running:
            raise RuntimeError(f"{self!r} exited during start\n{self.log_tail()}")

    def start(self: S, timeout: float = 30) -> S:
        """Start the server and wait until it answers."""
        self.launch()
        self.wait_ready(timeout)
        return self

    def stop(self, timeout: float = 10) -> None:
        """Stop gracefully (SIGTERM), falling back to SIGKILL after ``timeout``."""
        self._signal(signal.SIGTERM)
        if self._proc is not None:
            try:
                self._proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()

    def kill(self) -> None:
        """Kill the server abruptly, like a crash or an OOM kill."""
        self._signal(signal.SIGKILL)
        if self._proc is not None:
            self._proc.wait()

    def restart(self: S, timeout: float = 30) -> S:
        """Stop, then start again on the same port with the same data directory."""
        self.stop()
        return self.start(timeout)

    def close(self) -> None:
        """Kill the server and remove its directory (log included)."""
        self.kill()
        shutil.rmtree(self.dir, ignore_errors=True)
        with _UNCLOSED_LOCK:
            _UNCLOSED.discard(self)

    def log_tail(self, lines: int = 40) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])

    def _signal(self, sig: signal.Signals) -> None:
        if self.running and self._proc is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self._proc.pid, sig)

    def __enter__(self: S) -> S:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


# --------------------------------------------------------------------------
# ZooKeeper
# --------------------------------------------------------------------------


def four_letter(port: int, cmd: str, timeout: float = 2.0) -> str:
    """Send a ZooKeeper four-letter command to 127.0.0.1:port and return the answer."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(cmd.encode())
        chunks = []
        while chunk := sock.recv(4096):
            chunks.append(chunk)
    return b"".join(chunks).decode(errors="replace")


class ZooKeeperServer(_ServerProcess):
    """One ZooKeeper JVM: standalone by default, or an ensemble member.

    ``extra_cfg`` adds or overrides zoo.cfg lines.  ``myid`` and ``peers``
    (``server.N=...`` lines) turn it into a ``QuorumPeerMain`` member; they are
    meant for :class:`ZooKeeperEnsemble`.  ``heap_mb`` is the JVM's maximum
    heap (``-Xmx``): ZooKeeper holds every znode in it, and a server without
    room for them dies of ``OutOfMemoryError``.
    """

    _prefix = "zkbeat-zk-"
    _log_name = "zookeeper.log"

    def __init__(
        self,
        tick_time: int = 500,
        extra_cfg: Mapping[str, object] | None = None,
        *,
        port: int | None = None,
        myid: int | None = None,
        peers: Sequence[str] = (),
        heap_mb: int = DEFAULT_HEAP_MB,
    ) -> None:
        if heap_mb < 32:
            raise ValueError(f"heap_mb must be at least 32 (the initial heap), got {heap_mb}")
        self._java = require_binary("java", JAVA_HINT, what="Java")
        require_binary(str(ZOOKEEPER_JAR), ZOOKEEPER_HINT, what="ZooKeeper")
        super().__init__()
        self._port = port or free_port()
        self.tick_time = tick_time
        self.heap_mb = heap_mb
        self.myid = myid
        self.data_dir = self.dir / "data"
        self.data_dir.mkdir()
        cfg: dict[str, object] = {
            "tickTime": tick_time,
            "dataDir": self.data_dir,
            "clientPort": self._port,
            "clientPortAddress": "127.0.0.1",
            "admin.enableServer": "false",
            "4lw.commands.whitelist": FOUR_LETTER_WHITELIST,
            "maxClientCnxns": 0,
        }
        if myid is not None:
            cfg |= {"initLimit": 10, "syncLimit": 5}
            (self.data_dir / "myid").write_text(f"{myid}\n")
        cfg |= dict(extra_cfg or {})
        lines = [f"{key}={value}" for key, value in cfg.items()] + list(peers)
        self.cfg_path = self.dir / "zoo.cfg"
        self.cfg_path.write_text("\n".join(lines) + "\n")

    def __repr__(self) -> str:
        kind = "standalone" if self.myid is None else f"member {self.myid}"
        return f"<ZooKeeperServer {kind} {self.hosts}>"

    @property
    def port(self) -> int:
        return self._port

    @property
    def hosts(self) -> str:
        return f"127.0.0.1:{self._port}"

    @property
    def mode(self) -> str | None:
        """``leader``/``follower``/``standalone``, or None when not serving."""
        try:
            answer = self.four_letter("srvr")
        except OSError:
            return None
        for line in answer.splitlines():
            if line.startswith("Mode: "):
                return line.removeprefix("Mode: ").strip()
        return None

    def four_letter(self, cmd: str) -> str:
        return four_letter(self._port, cmd)

    def _command(self) -> list[str]:
        main = STANDALONE_MAIN if self.myid is None else QUORUM_MAIN
        return [
            self._java,
            "-Xms32m",
            f"-Xmx{self.heap_mb}m",
            *JVM_FLAGS,
            "-cp",
            ZOOKEEPER_CLASSPATH,
            main,
            str(self.cfg_path),
        ]

    def _ready(self) -> bool:
        # ruok answers as soon as the port is bound; srvr only reports a Mode
        # once the server (or the quorum it belongs to) really serves.
        try:
            if self.four_letter("ruok") != "imok":
                return False
        except OSError:
            return False
        return self.mode in ("standalone", "leader", "follower")


class ZooKeeperEnsemble:
    """``n`` ZooKeeper members forming one quorum on loopback ports."""

    def __init__(
        self,
        n: int = 3,
        tick_time: int = 500,
        extra_cfg: Mapping[str, object] | None = None,
    ) -> None:
        ids = range(1, n + 1)
        peers = [f"server.{i}=127.0.0.1:{free_port()}:{free_port()}" for i in ids]
        self.members = [ZooKeeperServer(tick_time, extra_cfg, myid=i, peers=peers) for i in ids]

    def __repr__(self) -> str:
        return f"<ZooKeeperEnsemble {self.hosts}>"

    @property
    def hosts(self) -> str:
        return ",".join(member.hosts for member in self.members)

    def start(self: E, timeout: float = 60) -> E:
        """Start every member that is not running and wait for one leader.

        JVMs boot in parallel (launch all, then wait once), so three members
        cost barely more than one.  Safe to call on a healthy ensemble, which
        makes it the way to heal one after a test killed members.
        """
        for member in self.members:
            member.launch()
        deadline = time.monotonic() + timeout
        for member in self.members:
            member.wait_ready(max(deadline - time.monotonic(), 0.1))
        self.leader(max(deadline - time.monotonic(), 0.1))
        return self

    def stop(self) -> None:
        for member in self.members:
            member._signal(signal.SIGTERM)
        for member in self.members:
            member.stop()

    def close(self) -> None:
        for member in self.members:
            member.close()

    def leader(self, timeout: float = 10) -> ZooKeeperServer:
        """Return the member whose ``srvr`` says leader, waiting for exactly one."""
        found: list[ZooKeeperServer] = []

        def one_leader() -> bool:
            found[:] = [m for m in self.members if m.running and m.mode == "leader"]
            return len(found) == 1

        if not wait_for(one_leader, timeout, 0.05, raise_on_timeout=False):
            modes = {m.myid: m.mode for m in self.members}
            raise RuntimeError(f"{self!r} has no single leader after {timeout}s: {modes}")
        return found[0]

    def __enter__(self: E) -> E:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


# --------------------------------------------------------------------------
# Redis
# --------------------------------------------------------------------------


class RedisServer(_ServerProcess):
    """A throw-away ``redis-server`` without persistence (restart loses data)."""

    _prefix = "zkbeat-redis-"
    _log_name = "redis.log"

    def __init__(self, port: int | None = None) -> None:
        self._binary = require_binary("redis-server", REDIS_HINT, what="Redis")
        super().__init__()
        self._port = port or free_port()

    def __repr__(self) -> str:
        return f"<RedisServer {self.url}>"

    @property
    def port(self) -> int:
        return self._port

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self._port}/0"

    def _command(self) -> list[str]:
        return [
            self._binary,
            "--port", str(self._port),
            "--bind", "127.0.0.1",
            "--save", "",
            "--appendonly", "no",
            "--daemonize", "no",
            "--dir", str(self.dir),
            "--logfile", str(self.log_path),
        ]  # fmt: skip

    def _ready(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self._port), timeout=1) as sock:
                sock.sendall(b"PING\r\n")
                return sock.recv(64).startswith(b"+PONG")
        except OSError:
            return False


# --------------------------------------------------------------------------
# Session powers
# --------------------------------------------------------------------------


def _wait_for_states(
    client: KazooClient,
    states: Sequence[KazooState],
    action: Callable[[], object],
    timeout: float,
    what: str,
) -> None:
    """Run ``action`` and wait until ``client`` reports ``states`` in that order."""
    pending = list(states)
    done = threading.Event()

    def listener(state: KazooState) -> bool:
        if pending and state == pending[0]:
            pending.pop(0)
        if not pending:
            done.set()
            return True  # kazoo removes a listener that returns True
        return False

    client.add_listener(listener)
    try:
        action()
        if not done.wait(timeout):
            raise AssertionError(f"{what}: client never reported {pending} within {timeout}s")
    finally:
        client.remove_listener(listener)


def expire_session_quietly(session_id: int, password: bytes, hosts: str, timeout: float = 10) -> None:
    """Expire a session on the server, leaving its owner to find out later.

    A probe client attaches to the session with its id and password and closes
    it, which kills the session server-side.  The probe then attaches again:
    if it is handed a brand-new session, the old one is verifiably gone.  If
    the real owner raced in and re-attached first, the loop simply repeats.
    """
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        probe = KazooClient(hosts, client_id=(session_id, password), timeout=4)
        try:
            probe.start(timeout=max(deadline - time.monotonic(), 1))
            resumed = probe.client_id is not None and probe.client_id[0] == session_id
        finally:
            probe.stop()  # closes the session the probe holds
            probe.close()
        if not resumed:
            return
    raise RuntimeError(f"session 0x{session_id:x} still alive after {timeout}s")


def expire_session(client: KazooClient, hosts: str, timeout: float = 10) -> None:
    """Expire ``client``'s session on the server and wait until it sees LOST.

    Afterwards kazoo reconnects on its own with a new session id; wait for
    ``client.connected`` if the test needs it.
    """
    if client.client_id is None:
        raise RuntimeError("client has no session to expire")
    session_id, password = client.client_id
    _wait_for_states(
        client,
        [KazooState.LOST],
        lambda: expire_session_quietly(session_id, password, hosts, timeout),
        timeout,
        "expire_session",
    )


def drop_connection(client: KazooClient, timeout: float = 10) -> None:
    """Break ``client``'s TCP connection; wait for SUSPENDED, then CONNECTED.

    Only the socket dies, not the session, so kazoo reconnects with the same
    session id -- the everyday network blip a leader must ride out.
    """
    sock = client._connection._socket  # kazoo has no public handle on it
    if sock is None:
        raise RuntimeError("client is not connected")

    def shut() -> None:
        with contextlib.suppress(OSError):  # already gone: kazoo is reconnecting
            sock.shutdown(socket.SHUT_RDWR)

    _wait_for_states(
        client,
        [KazooState.SUSPENDED, KazooState.CONNECTED],
        shut,
        timeout,
        "drop_connection",
    )

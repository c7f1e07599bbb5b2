"""A TCP proxy on 127.0.0.1 that a test can black-hole: a network partition.

Put one between a single replica and ZooKeeper (give that replica the
proxy's address as its connect string) and the test can cut that replica off
while it keeps its broker. A black hole is a pulled cable, not a refused
connection: nothing is closed and nothing is answered, bytes simply vanish,
so the client only learns of it through its own timeouts, as in production.

When the link heals, connections that lost bytes are reset (their streams
are corrupt; real TCP would have given up on them too) and new ones are
forwarded again.

``lose_replies()`` cuts one direction only: what clients send still reaches
the server, what it answers vanishes. A request then takes effect while its
sender waits for an answer that never comes, the case a "maybe sent" publish
must handle.

``cut_after(n)`` cuts a write in two: the next ``n`` bytes clients send
reach the server, then that connection is reset (RST) mid-stream, as a link
dropping in the middle of a large write; later connections are forwarded.

``reset()`` is the other kind of outage, a server that went away: every
connection is reset (RST) and new ones are refused until ``heal()``, so a
test can take a server it must not stop (the machine's RabbitMQ) away from
the replicas, as a stopped server would be.
"""

from __future__ import annotations

import contextlib
import selectors
import socket
import struct
import threading

__all__ = ["TcpProxy"]

_CHUNK = 65536


class _Pair:
    """One accepted client connection and its upstream (None while black-holed)."""

    def __init__(self, client: socket.socket, upstream: socket.socket | None) -> None:
        self.client = client
        self.upstream = upstream
        self.tainted = upstream is None

    def peer(self, sock: socket.socket) -> socket.socket | None:
        return self.upstream if sock is self.client else self.client

    def sockets(self) -> list[socket.socket]:
        return [s for s in (self.client, self.upstream) if s is not None]


class TcpProxy:
    """Forward 127.0.0.1:<port> to 127.0.0.1:<target_port> until told to black-hole."""

    def __init__(self, target_port: int, port: int = 0) -> None:
        self.target_port = target_port
        # ``port``: listen where a closed proxy listened, as a restarted one would.
        self._listener = socket.create_server(("127.0.0.1", port))
        self._listener.setblocking(False)
        self.port = self._listener.getsockname()[1]
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._listener, selectors.EVENT_READ, None)
        self._pairs: list[_Pair] = []
        self._lock = threading.Lock()
        self._blackholed = False
        self._replies_lost = False
        #: Bytes from clients dropped while black-holed (a test waits on it to know they are gone).
        self.dropped = 0
        #: Bytes from the server dropped while its replies are lost.
        self.replies_dropped = 0
        self._refusing = False
        #: Client bytes still forwarded before the connection carrying them is cut (cut_after).
        self._cut_left: int | None = None
        #: Client bytes that reached the server and were lost by cut_after, each time it cut.
        self.cuts: list[tuple[int, int]] = []
        #: Server bytes still forwarded before the connection carrying them is closed (cut_replies_after).
        self._reply_cut_left: int | None = None
        self._reset_requested = False
        self._heal_requested = False
        self._closed = False
        self._wake_r, self._wake_w = socket.socketpair()
        self._selector.register(self._wake_r, selectors.EVENT_READ, "wake")
        self._thread = threading.Thread(target=self._run, name=f"proxy-{self.port}", daemon=True)

    @property
    def hosts(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def blackholed(self) -> bool:
        return self._blackholed

    def start(self) -> TcpProxy:
        self._thread.start()
        return self

    def blackhole(self) -> None:
        """From now on drop every byte both ways and answer nothing."""
        with self._lock:
            self._blackholed = True
        self._wake()

    def lose_replies(self) -> None:
        """From now on forward what clients send, and drop every byte the server answers."""
        with self._lock:
            self._replies_lost = True
        self._wake()

    def cut_after(self, forwarded: int) -> None:
        """Forward the next ``forwarded`` bytes clients send, then reset the connection that carried the last."""
        with self._lock:
            self._cut_left = forwarded
        self._wake()

    def cut_replies_after(self, forwarded: int) -> None:
        """Forward the next ``forwarded`` bytes the server answers, then close (FIN) the connection carrying them."""
        with self._lock:
            self._reply_cut_left = forwarded
        self._wake()

    def reset(self) -> None:
        """From now on act as a server that is gone: reset every connection, refuse new ones."""
        with self._lock:
            self._refusing = True
            self._reset_requested = True
        self._wake()

    def heal(self) -> None:
        """Forward again; connections that lost bytes are reset."""
        with self._lock:
            self._blackholed = False
            self._replies_lost = False
            self._refusing = False
            self._heal_requested = True
        self._wake()

    def close(self) -> None:
        self._closed = True
        self._wake()
        self._thread.join(5)
        for pair in self._pairs:
            self._drop(pair)
        with contextlib.suppress(OSError):
            self._listener.close()
        self._wake_r.close()
        self._wake_w.close()

    def __enter__(self) -> TcpProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the loop (one thread) ---------------------------------------------

    def _wake(self) -> None:
        with contextlib.suppress(OSError):
            self._wake_w.send(b"x")

    def _run(self) -> None:
        while not self._closed:
            for key, _ in self._selector.select(timeout=0.5):
                if key.data == "wake":
                    with contextlib.suppress(OSError):
                        self._wake_r.recv(_CHUNK)
                elif key.data is None:
                    self._accept()
                else:
                    self._pump(key.fileobj, key.data)
            with self._lock:
                heal, self._heal_requested = self._heal_requested, False
                reset, self._reset_requested = self._reset_requested, False
            if reset:
                for pair in list(self._pairs):
                    self._drop(pair, rst=True)
            if heal:
                for pair in [p for p in self._pairs if p.tainted]:
                    self._drop(pair)

    def _accept(self) -> None:
        try:
            client, _ = self._listener.accept()
        except OSError:
            return
        if self._refusing:
            _close_with_rst(client)
            return
        upstream = None
        if not self._blackholed:
            try:
                upstream = socket.create_connection(("127.0.0.1", self.target_port), timeout=2)
            except OSError:
                client.close()  # the server is down: refuse, as the server itself would
                return
        pair = _Pair(client, upstream)
        self._pairs.append(pair)
        for sock in pair.sockets():
            sock.setblocking(False)
            self._selector.register(sock, selectors.EVENT_READ, pair)

    def _pump(self, sock: socket.socket, pair: _Pair) -> None:
        try:
            data = sock.recv(_CHUNK)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self._drop(pair)
            return
        peer = pair.peer(sock)
        if self._blackholed or peer is None:
            pair.tainted = True
            if sock is pair.client:
                self.dropped += len(data)
            return
        with self._lock:
            left = self._cut_left if sock is pair.client else None
            if left is not None and len(data) > left:
                self._cut_left = None
        if left is not None:
            if len(data) > left:
                with contextlib.suppress(OSError):
                    peer.setblocking(True)
                    peer.sendall(data[:left])
                self.cuts.append((left, len(data) - left))
                self._drop(pair, rst=True)
                return
            with self._lock:
                self._cut_left = left - len(data)
        if sock is pair.upstream:
            with self._lock:
                reply_left = self._reply_cut_left
                if reply_left is not None and len(data) > reply_left:
                    self._reply_cut_left = None
                elif reply_left is not None:
                    self._reply_cut_left = reply_left - len(data)
            if reply_left is not None and len(data) > reply_left:
                with contextlib.suppress(OSError):
                    peer.setblocking(True)
                    peer.sendall(data[:reply_left])
                self.cuts.append((reply_left, len(data) - reply_left))
                self._drop(pair)
                return
        if self._replies_lost and sock is pair.upstream:
            pair.tainted = True
            self.replies_dropped += len(data)
            return
        try:
            peer.setblocking(True)
            peer.sendall(data)
            peer.setblocking(False)
        except OSError:
            self._drop(pair)

    def _drop(self, pair: _Pair, rst: bool = False) -> None:
        for sock in pair.sockets():
            with contextlib.suppress(KeyError, ValueError, OSError):
                self._selector.unregister(sock)
            if rst:
                _close_with_rst(sock)
            with contextlib.suppress(OSError):
                sock.close()
        if pair in self._pairs:
            self._pairs.remove(pair)


def _close_with_rst(sock: socket.socket) -> None:
    """Close so that the peer sees a reset, not an orderly end of stream."""
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    with contextlib.suppress(OSError):
        sock.close()

"""Replicas on hosts of their own: network namespaces, so a test can lose a host.

A process that dies is seen through its sockets; a host that is lost leaves
nothing to close them, only silence. To make one, each replica runs in a
network namespace the fixture creates, plugged by a veth pair into a bridge
in a "hub" namespace (addresses 10.200.0.0/24 exist only inside those
namespaces). ZooKeeper and Redis stay where the other fixtures started them
(127.0.0.1 of the test's own namespace): the hub reaches them through Unix
sockets, which no network namespace separates, so cutting a replica's cable
at the hub (its veth end set down) cuts it off from ZooKeeper, the broker
and the other replicas at once, as a lost host would be.

The record of what was published goes out of band, straight through a Unix
socket to Redis, so a cut replica's publishes (there should be none) would
still be counted.

Needs root and iproute2 (``ip``); ``python -m tests.support.netns`` runs one relay.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import threading
import uuid
from pathlib import Path

__all__ = ["Network", "available"]

HUB_ADDRESS = "10.200.0.1"
_ROOT = Path(__file__).resolve().parents[2]


def available() -> str | None:
    """None when namespaces can be made here, else why not."""
    if shutil.which("ip") is None:
        return "iproute2 is missing: apt-get install -y iproute2 (make system-deps)"
    if os.geteuid() != 0:
        return "network namespaces need root"
    return None


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=10)


class Network:
    """A hub namespace with ZooKeeper and Redis forwarded into it, and one namespace per host."""

    def __init__(self, workdir: Path, zk_port: int, redis_port: int, hosts: int) -> None:
        self.tag = uuid.uuid4().hex[:6]
        self.workdir = workdir
        self.hub = f"zkbh-{self.tag}"
        self.namespaces = [f"zkbn-{self.tag}-{i}" for i in range(hosts)]
        self._relays: list[subprocess.Popen] = []
        self.zk_sock = str(workdir / "zk.sock")
        self.redis_sock = str(workdir / "redis.sock")
        self._zk_port, self._redis_port = zk_port, redis_port

    # -- what the replicas are given -----------------------------------------

    @property
    def zk_hosts(self) -> str:
        return f"{HUB_ADDRESS}:2181"

    @property
    def broker(self) -> str:
        return f"redis://{HUB_ADDRESS}:6379/0"

    @property
    def record_url(self) -> str:
        return f"unix://{self.redis_sock}?db=0"

    def address(self, host: int) -> str:
        return f"10.200.0.{10 + host}"

    # -- lifecycle -------------------------------------------------------------

    def start(self) -> Network:
        _ip("netns", "add", self.hub)
        _ip("-n", self.hub, "link", "set", "lo", "up")
        _ip("-n", self.hub, "link", "add", "br0", "type", "bridge")
        _ip("-n", self.hub, "addr", "add", f"{HUB_ADDRESS}/24", "dev", "br0")
        _ip("-n", self.hub, "link", "set", "br0", "up")
        for i, ns in enumerate(self.namespaces):
            _ip("netns", "add", ns)
            _ip("-n", ns, "link", "set", "lo", "up")
            _ip("link", "add", "name", self._cable(i), "netns", self.hub, "type", "veth", "peer", "name", "eth0",
                "netns", ns)  # fmt: skip
            _ip("-n", self.hub, "link", "set", self._cable(i), "master", "br0", "up")
            _ip("-n", ns, "addr", "add", f"{self.address(i)}/24", "dev", "eth0")
            _ip("-n", ns, "link", "set", "eth0", "up")
        # Our namespace: Unix socket -> 127.0.0.1; the hub: TCP -> Unix socket.
        self._relay(None, "unix2tcp", self.zk_sock, "127.0.0.1", str(self._zk_port))
        self._relay(None, "unix2tcp", self.redis_sock, "127.0.0.1", str(self._redis_port))
        self._relay(self.hub, "tcp2unix", HUB_ADDRESS, "2181", self.zk_sock)
        self._relay(self.hub, "tcp2unix", HUB_ADDRESS, "6379", self.redis_sock)
        return self

    def _cable(self, host: int) -> str:
        return f"zc{self.tag}{host}"

    def _relay(self, ns: str | None, *args: str) -> None:
        command = [sys.executable, "-m", "tests.support.netns", *args]
        if ns is not None:
            command = ["ip", "netns", "exec", ns, *command]
        process = subprocess.Popen(
            command, cwd=_ROOT, env={**os.environ, "PYTHONPATH": str(_ROOT)}, stdout=subprocess.PIPE, text=True
        )
        if process.stdout.readline().strip() != "ready":
            raise RuntimeError(f"relay {args} did not start")
        self._relays.append(process)

    def command(self, host: int, command: list[str]) -> list[str]:
        """``command`` run inside host ``host``'s namespace (same pid: ip execs it)."""
        return ["ip", "netns", "exec", self.namespaces[host], *command]

    def cut(self, host: int) -> None:
        """Pull host ``host``'s cable at the hub: from now on silence both ways."""
        _ip("-n", self.hub, "link", "set", self._cable(host), "down")

    def heal(self, host: int) -> None:
        _ip("-n", self.hub, "link", "set", self._cable(host), "up")

    def close(self) -> None:
        for process in self._relays:
            process.kill()
            with contextlib.suppress(Exception):
                process.wait(5)
        for ns in [*self.namespaces, self.hub]:
            with contextlib.suppress(Exception):
                _ip("netns", "del", ns)


# -- the relays (one process each) ---------------------------------------------


def _pipe(source: socket.socket, sink: socket.socket) -> None:
    try:
        while True:
            data = source.recv(65536)
            if not data:
                break
            sink.sendall(data)
    except OSError:
        pass
    finally:
        with contextlib.suppress(OSError):
            sink.shutdown(socket.SHUT_WR)


def _serve(listener: socket.socket, connect) -> None:
    print("ready", flush=True)
    while True:
        client, _ = listener.accept()
        try:
            upstream = connect()
        except OSError:
            client.close()
            continue
        for a, b in ((client, upstream), (upstream, client)):
            threading.Thread(target=_pipe, args=(a, b), daemon=True).start()


def main(argv: list[str]) -> None:
    kind = argv[0]
    if kind == "unix2tcp":
        path, host, port = argv[1], argv[2], int(argv[3])
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        listener = socket.socket(socket.AF_UNIX)
        listener.bind(path)
        listener.listen(128)

        def dial() -> socket.socket:
            upstream = socket.create_connection((host, port), timeout=5)
            upstream.settimeout(None)
            return upstream

        _serve(listener, dial)
    elif kind == "tcp2unix":
        host, port, path = argv[1], int(argv[2]), argv[3]
        listener = socket.create_server((host, port), backlog=128)

        def connect() -> socket.socket:
            upstream = socket.socket(socket.AF_UNIX)
            upstream.connect(path)
            return upstream

        _serve(listener, connect)
    else:
        raise SystemExit(f"unknown relay {kind}")


if __name__ == "__main__":
    main(sys.argv[1:])

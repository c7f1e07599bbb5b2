"""The brokers the process tests run on: Redis and RabbitMQ, each one a test can take away.

Redis is a private ``redis-server`` per test (tests/support/servers.py): an
outage stops it. RabbitMQ is the machine's own server on 127.0.0.1:5672
(guest/guest, as on CI), which the tests must never stop or reconfigure. So
each test gets a vhost of its own (created with ``rabbitmqctl``, deleted
afterwards), and the replicas reach it through a TcpProxy: an outage resets
every connection and refuses new ones, as a stopped server would.

A vhost rather than queues of the test's own: Celery declares its queues,
exchanges and reply queues under fixed names (``celery``, ``celery.pidbox``),
and a vhost isolates all of them from every other test and helper on the same
server without renaming anything in the app under test; deleting the vhost
removes whatever the test declared, even after a crash of the test.

A missing or unreachable RabbitMQ fails the test with the commands that
install and start it; it never skips.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import uuid
from contextlib import AbstractContextManager
from types import TracebackType

from tests.support.proxy import TcpProxy
from tests.support.servers import RedisServer

__all__ = ["BROKERS", "RABBITMQ_HINT", "TestBroker", "RedisBroker", "RabbitBroker", "make_broker"]

#: What the broker fixture is parametrised over (py-amqp for ``amqp://``).
BROKERS = ("redis", "amqp")
RABBITMQ_HOST, RABBITMQ_PORT = "127.0.0.1", 5672
RABBITMQ_HINT = (
    "RabbitMQ must run on 127.0.0.1:5672 with the guest user: "
    "`apt-get install -y rabbitmq-server` and start it with `rabbitmq-server -detached`"
)


class TestBroker(AbstractContextManager):
    """A broker for one test: its URL for the replicas, and an outage the test can start and end."""

    __test__ = False  # not a pytest test class
    name: str
    url: str

    def outage(self) -> None:
        """Take the broker away from the replicas (connections fail, new ones are refused)."""
        raise NotImplementedError

    def restore(self) -> None:
        """Give it back."""
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError

    def __exit__(self, kind: type | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.close()


class RedisBroker(TestBroker):
    """A private redis-server; an outage stops it (its queue is lost with it: no persistence)."""

    name = "redis"

    def __init__(self) -> None:
        self.server = RedisServer().start()
        self.url = self.server.url

    def outage(self) -> None:
        self.server.stop()

    def restore(self) -> None:
        self.server.start()

    def close(self) -> None:
        self.server.stop()


class RabbitBroker(TestBroker):
    """A vhost of its own on the machine's RabbitMQ, reached through a proxy the test can reset."""

    name = "amqp"

    def __init__(self, label: str = "test") -> None:
        self._ctl = shutil.which("rabbitmqctl") or shutil.which("rabbitmqctl", path="/usr/sbin:/sbin")
        if self._ctl is None:
            raise RuntimeError(f"rabbitmqctl is not installed: {RABBITMQ_HINT}")
        try:
            socket.create_connection((RABBITMQ_HOST, RABBITMQ_PORT), timeout=5).close()
        except OSError as exc:
            where = f"{RABBITMQ_HOST}:{RABBITMQ_PORT}"
            raise RuntimeError(f"RabbitMQ is not reachable at {where} ({exc}): {RABBITMQ_HINT}") from None
        self.vhost = f"zkbeat-{label[:40]}-{uuid.uuid4().hex[:8]}"
        self._rabbitmqctl("add_vhost", self.vhost)
        try:
            self._rabbitmqctl("set_permissions", "-p", self.vhost, "guest", ".*", ".*", ".*")
        except BaseException:
            self._rabbitmqctl("delete_vhost", self.vhost)
            raise
        self.proxy = TcpProxy(RABBITMQ_PORT).start()
        #: What the replicas use: through the proxy.
        self.url = f"amqp://guest:guest@127.0.0.1:{self.proxy.port}/{self.vhost}"
        #: What the test itself uses to look into the broker, past the proxy.
        self.direct_url = f"amqp://guest:guest@{RABBITMQ_HOST}:{RABBITMQ_PORT}/{self.vhost}"

    def _rabbitmqctl(self, *args: str) -> str:
        done = subprocess.run([self._ctl, "-q", *args], capture_output=True, text=True, timeout=60)
        if done.returncode != 0:
            raise RuntimeError(f"rabbitmqctl {' '.join(args)} failed ({done.returncode}): {done.stderr.strip()}")
        return done.stdout

    def outage(self) -> None:
        self.proxy.reset()

    def restore(self) -> None:
        self.proxy.heal()

    def close(self) -> None:
        try:
            self.proxy.close()
        finally:
            self._rabbitmqctl("delete_vhost", self.vhost)


def make_broker(name: str, label: str = "test") -> TestBroker:
    """The broker called ``name`` (one of BROKERS) for one test; close it afterwards."""
    if name == "redis":
        return RedisBroker()
    if name == "amqp":
        return RabbitBroker(label)
    raise ValueError(f"unknown broker {name!r}: one of {BROKERS}")

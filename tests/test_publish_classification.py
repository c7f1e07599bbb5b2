"""What counts as "sent without an answer": only a publish that was written, never one that was not.

A publish the broker never answered is not sent again (docs/guarantees.md),
so every error taken for one costs that tick. These tests put the leader in
front of real brokers in states where the message was certainly NOT
written, or where the broker did answer, and check that no tick is lost
and none is sent twice:

* py-amqp reads pending frames (``drain_events(timeout=0)``) before it
  writes a publish: a connection RabbitMQ closed or reset while beat was
  idle fails there, before anything is sent.
* redis-py sends a PING health check before a command on a connection idle
  longer than ``health_check_interval`` (kombu's default: 25 s): a PING that
  gets no answer fails before the LPUSH is written.
* Redis answers ``-LOADING`` while it loads its data after a restart: an
  answer (the LPUSH did not run), which redis-py raises as a connection
  error.
* With kombu's ``retry_on_timeout`` transport option redis-py itself sends
  an LPUSH again after its reply timed out.

And the errback zkbeat puts in each publish's retry policy must not replace
the one of ``task_publish_retry_policy``.
"""

from __future__ import annotations

import logging
import socket
import threading
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from tests.support.brokers import RabbitBroker
from tests.support.helpers import Published, every, lead, wait_for
from tests.support.messages import queued_messages
from tests.support.proxy import TcpProxy
from tests.support.servers import RedisServer
from tests.test_rabbitmq import drain
from tests.test_uncertain_publish import MAYBE, uncertain_slots


def run_count(scheduler: Any, entry: str) -> int:
    return scheduler.ledger.load([entry])[entry].state.total_run_count


def redis_slots(port: int) -> list[str]:
    return [message["headers"]["zkbeat-slot"] for message in queued_messages(port, "celery")]


@pytest.fixture
def rabbit(request: pytest.FixtureRequest) -> Iterator[RabbitBroker]:
    with RabbitBroker(request.node.name) as broker:
        yield broker


def close_connections(rabbit: RabbitBroker) -> int:
    """Have RabbitMQ close every connection of the test's vhost (connection.close 320, as on a restart)."""
    listed = rabbit._rabbitmqctl("list_connections", "pid", "vhost")
    pids = [line.split("\t")[0] for line in listed.splitlines() if line.endswith("\t" + rabbit.vhost)]
    for pid in pids:
        rabbit._rabbitmqctl("close_connection", pid, "zkbeat test: broker restart")
    return len(pids)


@pytest.mark.parametrize("how", ["forced-close", "reset"])
def test_rabbitmq_dropping_an_idle_connection_costs_no_tick(
    make_scheduler, rabbit: RabbitBroker, published: Published, caplog: pytest.LogCaptureFixture, how: str
) -> None:
    """Nothing was in flight when the link went: no tick may be counted as "maybe sent" and lost."""
    scheduler = make_scheduler({"tidy": every(0.5)}, broker_url=rabbit.url)
    lead(scheduler)
    wait_for(lambda: scheduler.tick() is not None and published.count("tidy") >= 2, timeout=15)
    with caplog.at_level(logging.INFO, logger="zkbeat"):
        # Between two passes of beat's loop: no publish is in flight.
        if how == "forced-close":
            assert close_connections(rabbit) >= 1
        else:
            rabbit.proxy.reset()
            wait_for(lambda: not rabbit.proxy._pairs, message="the proxy never reset its connections")
            rabbit.proxy.heal()
        before = published.count("tidy")
        wait_for(lambda: scheduler.tick() is not None and published.count("tidy") >= before + 2, timeout=30)
    queued = [h["zkbeat-slot"] for h in drain(rabbit, "celery")]
    assert len(queued) == len(set(queued)), f"a tick was sent twice: {queued}"
    assert uncertain_slots(caplog, "tidy") == [], "a publish that was never written counted as maybe sent"
    assert run_count(scheduler, "tidy") == len(queued), "a tick counted as run is not in the queue"


class LoadingRedis(RedisServer):
    """A redis-server with an RDB file that it loads slowly after each start (``-LOADING`` meanwhile)."""

    def __init__(self, key_load_delay: int) -> None:
        super().__init__()
        self.key_load_delay = key_load_delay

    def _command(self) -> list[str]:
        command = super()._command()
        command[command.index("--save") + 1] = "3600 1"
        return [
            *command,
            "--key-load-delay",
            str(self.key_load_delay),
            "--loading-process-events-interval-bytes",
            "1024",
        ]

    def _ready(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=1) as sock:
                sock.sendall(b"PING\r\n")
                return sock.recv(64).startswith((b"+PONG", b"-LOADING"))
        except OSError:
            return False


def test_a_redis_loading_its_data_after_a_restart_costs_no_tick(
    make_scheduler, published: Published, caplog: pytest.LogCaptureFixture
) -> None:
    """-LOADING is Redis's answer that the LPUSH did not run: the tick stays due and goes out once."""
    # 60,000 keys at 200 µs each: ~12 s of loading, so that a loaded machine (and redis-py's own retries of
    # a -LOADING answer, 6.x and later) still finds the server loading when the probe asks.
    server = LoadingRedis(key_load_delay=200).start()
    try:
        filler = redis.Redis(port=server.port, db=1)
        pipe = filler.pipeline(transaction=False)
        for n in range(60_000):
            pipe.set(f"filler:{n}", "x")
        pipe.execute()
        filler.save()
        filler.close()
        scheduler = make_scheduler({"tidy": every(0.5)}, broker_url=server.url)
        lead(scheduler)
        wait_for(lambda: scheduler.tick() is not None and published.count("tidy") >= 2, timeout=15)
        with caplog.at_level(logging.INFO, logger="zkbeat"):
            server.stop()
            server.start()  # loading: every command but a few is answered -LOADING
            probe = redis.Redis(port=server.port)
            with pytest.raises(redis.exceptions.BusyLoadingError):
                probe.lpush("probe", "x")
            probe.close()
            before = published.count("tidy")
            wait_for(lambda: scheduler.tick() is not None and published.count("tidy") >= before + 2, timeout=60)
        queued = redis_slots(server.port)
        assert len(queued) == len(set(queued)), f"a tick was sent twice: {queued}"
        assert uncertain_slots(caplog, "tidy") == [], "an answered publish (-LOADING) counted as maybe sent"
        # The queue lived through the restart (RDB): every run counted is in it.
        assert run_count(scheduler, "tidy") == len(queued), "a tick counted as run is not in the queue"
    finally:
        server.stop()


def test_a_health_check_without_answer_costs_no_tick(
    make_scheduler, proxied_redis: tuple[RedisServer, TcpProxy], published: Published, caplog: pytest.LogCaptureFixture
) -> None:
    """redis-py's PING before a command on an idle connection fails before the LPUSH is written."""
    server, proxy = proxied_redis
    options = {"socket_timeout": 1, "health_check_interval": 1}
    scheduler = make_scheduler(
        {"tidy": every(2.0)}, broker_url=f"redis://127.0.0.1:{proxy.port}/0", broker_transport_options=options
    )
    lead(scheduler)
    wait_for(lambda: scheduler.tick() is not None and published.count("tidy") >= 2, timeout=20)
    with caplog.at_level(logging.INFO, logger="zkbeat"):
        proxy.lose_replies()  # what the leader sends still arrives
        wait_for(
            lambda: scheduler.tick() is not None and ("could not publish tidy" in caplog.text or MAYBE in caplog.text),
            timeout=60,
            message=lambda: caplog.text,
        )
        proxy.heal()
        before = published.count("tidy")
        wait_for(lambda: scheduler.tick() is not None and published.count("tidy") >= before + 2, timeout=30)
    queued = redis_slots(server.port)
    assert len(queued) == len(set(queued)), f"a tick was sent twice: {queued}"
    # Every request reached Redis: a tick logged as maybe sent that is not in the queue was never written.
    assert set(uncertain_slots(caplog, "tidy")) <= set(queued), "a tick never written was counted as maybe sent"
    assert run_count(scheduler, "tidy") == len(queued)


def busy_script(port: int, seconds: float) -> threading.Thread:
    """Keep Redis busy (a Lua loop) for ``seconds``: it reads nothing meanwhile, then answers everything."""

    def run() -> None:
        client = redis.Redis(port=port)
        script = "local t = redis.call('TIME'); local s = t[1] + t[2] / 1e6; " + (
            f"repeat local n = redis.call('TIME') until n[1] + n[2] / 1e6 - s > {seconds}"
        )
        try:
            client.eval(script, 0)
        finally:
            client.close()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def test_with_retry_on_timeout_a_slow_reply_is_not_sent_twice(
    make_scheduler, published: Published, caplog: pytest.LogCaptureFixture
) -> None:
    """kombu's ``retry_on_timeout`` makes redis-py send an LPUSH again after its reply timed out."""
    server = RedisServer().start()
    try:
        options = {"socket_timeout": 1, "retry_on_timeout": True}
        scheduler = make_scheduler({"tidy": every(0.5)}, broker_url=server.url, broker_transport_options=options)
        lead(scheduler)
        wait_for(lambda: scheduler.tick() is not None and published.count("tidy") >= 2, timeout=15)

        def handled() -> int:
            return published.count("tidy") + len(uncertain_slots(caplog, "tidy"))

        with caplog.at_level(logging.INFO, logger="zkbeat"):
            for _ in range(3):
                # Redis takes the LPUSH, answers after beat's socket timeout: the reply is only slow.
                busy = busy_script(server.port, 1.6)
                wait_for(lambda: _busy(server.port), message="Redis never got busy")
                before = handled()
                wait_for(lambda before=before: scheduler.tick() is not None and handled() > before, timeout=30)
                busy.join(10)
        queued = redis_slots(server.port)
        assert len(queued) == len(set(queued)), f"a tick was sent twice: {queued}"
    finally:
        server.close()


def _busy(port: int) -> bool:
    """True once Redis stops answering (the script runs)."""
    with socket.create_connection(("127.0.0.1", port), timeout=1) as sock:
        sock.sendall(b"PING\r\n")
        sock.settimeout(0.2)
        try:
            return not sock.recv(64)
        except TimeoutError:
            return True


def test_the_apps_publish_retry_errback_still_runs(make_scheduler, published: Published) -> None:
    """zkbeat's errback is chained to the errback of ``task_publish_retry_policy``, not put in its place."""
    server = RedisServer().start()
    seen: list[BaseException] = []
    policy = {"max_retries": 1, "interval_start": 0, "interval_step": 0, "interval_max": 0}
    try:
        scheduler = make_scheduler(
            {"tidy": every(0.5)},
            broker_url=server.url,
            task_publish_retry_policy={**policy, "errback": lambda exc, interval: seen.append(exc)},
        )
        lead(scheduler)
        wait_for(lambda: scheduler.tick() is not None and published.count("tidy") >= 1, timeout=15)
        server.stop()  # refused: nothing sent, so kombu retries, and calls the errback first
        wait_for(lambda: scheduler.tick() is not None and seen, timeout=15, message="the app's errback never ran")
    finally:
        server.close()


def _raised_under(*frames: str) -> BaseException:
    """A connection reset raised under functions of these names, each calling the next (a real traceback)."""
    source = [f"def {outer}():\n    {inner}()\n" for outer, inner in zip(frames, frames[1:])]
    source.append(f"def {frames[-1]}():\n    raise ConnectionResetError(104, 'Connection reset by peer')\n")
    namespace: dict[str, Any] = {}
    exec("".join(source), namespace)
    try:
        namespace[frames[0]]()
    except ConnectionResetError as exc:
        return exc
    raise AssertionError("nothing raised")


def test_only_the_confirm_wait_of_the_publish_itself_is_an_answer_wait() -> None:
    """py-amqp: a reset in the confirm wait may have lost only the ack; one in confirm_select sent no message."""
    from zkbeat.leading.broker import may_have_arrived

    confirm_wait = _raised_under("basic_publish_confirm", "wait", "drain_events", "read_frame")
    confirm_select = _raised_under("basic_publish_confirm", "confirm_select", "send_method", "wait", "read_frame")
    before_the_write = _raised_under("basic_publish_confirm", "_basic_publish", "drain_events", "read_frame")
    assert may_have_arrived(confirm_wait, None)
    assert not may_have_arrived(confirm_select, None)
    assert not may_have_arrived(before_the_write, None)

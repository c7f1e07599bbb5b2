"""A publish whose answer never comes may have reached the broker: it is never sent again.

An in-process leader publishes through a proxy that, at the test's word,
forwards what the leader sends and drops what the broker answers: the
request takes effect while its sender waits in vain (a reply lost on the
way back, a broker stalled after it took the message). On Redis the wait
ends with beat's socket timeout, on RabbitMQ with publisher confirms and a
``confirm_timeout``. Either way the message is in the queue, and sending
the tick again (kombu's publish retry, or writing the claim back so the
tick stays due) would put it there twice under the same task id. So the
tick counts as sent, the log says it may or may not have arrived, and every
slot is in the queue at most once. A publish that fails before anything
was sent (the broker refused the connection) still stays due and goes out
once the broker is back.
"""

from __future__ import annotations

import json
import logging
import re
import subprocess
import threading
from collections.abc import Iterator
from datetime import datetime, timezone
from typing import Any

import pytest

from tests.support.brokers import RabbitBroker
from tests.support.helpers import Published, every, lead, wait_for
from tests.support.messages import queued_messages
from tests.support.proxy import TcpProxy
from tests.support.servers import RedisServer, free_port
from tests.test_cli import zkbeat
from tests.test_metrics import metric
from tests.test_rabbitmq import CONFIRMS, HAS_CONFIRM_TIMEOUT, drain

MAYBE = "may or may not have reached the broker"


class LossyBroker:
    """A broker behind a proxy whose replies a test can lose; ``queued()`` reads the queue past the proxy."""

    def __init__(self, kind: str, label: str) -> None:
        self.kind = kind
        if kind == "redis":
            self.server = RedisServer().start()
            self.proxy = TcpProxy(self.server.port).start()
            self.url = f"redis://127.0.0.1:{self.proxy.port}/0"
            #: Beat's settings: a 1 s socket timeout ends the wait for a lost reply.
            self.conf: dict[str, Any] = {"broker_transport_options": {"socket_timeout": 1}}
            self.options: dict[str, Any] = {}
        else:
            self.rabbit = RabbitBroker(label)
            self.proxy = self.rabbit.proxy
            self.url = self.rabbit.url
            self.conf = dict(CONFIRMS)
            self.options = {"confirm_timeout": 1}

    def queued(self) -> list[str]:
        """The zkbeat-slot header of every message in the default queue, oldest first."""
        if self.kind == "redis":
            return [message["headers"]["zkbeat-slot"] for message in queued_messages(self.server.port, "celery")]
        return [h["zkbeat-slot"] for h in drain(self.rabbit, "celery")]

    def close(self) -> None:
        if self.kind == "redis":
            self.proxy.close()
            self.server.stop()
        else:
            self.rabbit.close()


#: RabbitMQ's wait for a confirm ends only with confirm_timeout (Celery 5.5+);
#: before, a publish whose ack is lost waits until the watchdog steps down.
LOSSY = ["redis", "amqp"] if HAS_CONFIRM_TIMEOUT else ["redis"]


@pytest.fixture(params=LOSSY)
def lossy(request: pytest.FixtureRequest) -> Iterator[LossyBroker]:
    broker = LossyBroker(request.param, request.node.name)
    yield broker
    broker.close()


def uncertain_slots(caplog: pytest.LogCaptureFixture, entry: str) -> list[str]:
    """The slots the log names as sent without an answer."""
    found = []
    for record in caplog.records:
        text = record.getMessage()
        if MAYBE in text and f" {entry} " in text:
            found += re.findall(r"\(slot ([^,)]+)", text)
    return found


def test_a_publish_whose_reply_is_lost_is_in_the_queue_once_and_never_sent_again(
    make_scheduler, lossy: LossyBroker, published: Published, caplog: pytest.LogCaptureFixture
) -> None:
    """The message lands, its answer is lost: the tick counts as sent, logged, and appears once in the queue."""
    scheduler = make_scheduler(
        {"tidy": every(0.5, options=lossy.options)},
        broker_url=lossy.url,
        zkbeat_metrics_port=free_port(),
        zkbeat_metrics_address="127.0.0.1",
        **lossy.conf,
    )
    lead(scheduler)
    wait_for(lambda: scheduler.tick() is not None and published.count("tidy") >= 2, timeout=15)
    with caplog.at_level(logging.INFO, logger="zkbeat"):
        lossy.proxy.lose_replies()
        wait_for(
            lambda: (
                scheduler.tick() is not None
                and (uncertain_slots(caplog, "tidy") or "could not publish tidy" in caplog.text)
            ),
            timeout=60,
            message=lambda: caplog.text,
        )
        lossy.proxy.heal()
        after = published.count("tidy")
        wait_for(lambda: scheduler.tick() is not None and published.count("tidy") >= after + 2, timeout=30)
    assert lossy.proxy.replies_dropped > 0, "no answer was ever lost: the test proved nothing"
    queued = lossy.queued()
    assert len(queued) == len(set(queued)), f"a tick was sent twice: {queued}"
    (uncertain,) = uncertain_slots(caplog, "tidy")
    assert uncertain in queued, "the tick whose answer was lost did reach the broker"
    sent = {h["zkbeat-slot"] for h in published.headers if h["zkbeat-entry"] == "tidy"}
    assert set(queued) == sent | {uncertain}, "every other tick went out, once"
    assert "written back" not in caplog.text
    assert scheduler.election.is_leader
    exported = scheduler.metrics.render().decode()
    assert "zkbeat_publishes_uncertain_total" in exported
    assert metric(exported, "zkbeat_publishes_uncertain_total") == 1


def test_a_publish_refused_before_it_was_sent_stays_due_and_goes_out_once(
    make_scheduler, lossy: LossyBroker, published: Published, caplog: pytest.LogCaptureFixture
) -> None:
    """A broker gone away (reset, then refusing): ticks wait and go out once; only one caught in flight is uncertain."""
    scheduler = make_scheduler({"tidy": every(0.5, options=lossy.options)}, broker_url=lossy.url, **lossy.conf)
    lead(scheduler)
    wait_for(lambda: scheduler.tick() is not None and published.count("tidy") >= 2, timeout=15)
    with caplog.at_level(logging.INFO, logger="zkbeat"):
        lossy.proxy.reset()
        wait_for(
            lambda: (
                scheduler.tick() is not None
                and any(text in caplog.text for text in ("could not publish tidy", "unreachable", MAYBE))
            ),
            timeout=30,
            message=lambda: caplog.text,
        )
        lossy.proxy.heal()
        after = published.count("tidy")
        wait_for(lambda: scheduler.tick() is not None and published.count("tidy") >= after + 2, timeout=30)
    queued = lossy.queued()
    assert len(queued) == len(set(queued)), f"a tick was sent twice: {queued}"
    sent = [h["zkbeat-slot"] for h in published.headers if h["zkbeat-entry"] == "tidy"]
    assert len(sent) == len(set(sent))
    assert set(sent) <= set(queued) <= set(sent) | set(uncertain_slots(caplog, "tidy"))


def test_a_run_now_without_an_answer_exits_3_and_is_not_run_again(
    make_scheduler, lossy: LossyBroker, published: Published, caplog: pytest.LogCaptureFixture
) -> None:
    """`zkbeat trigger` on a link that loses answers: exit 3 (not 1, "still pending"), the run queued once."""
    # Due at once (a last run long ago), then not for an hour: only the run now goes out meanwhile.
    report = every(3600, options=lossy.options, last_run_at=datetime(2020, 1, 1, tzinfo=timezone.utc))
    scheduler = make_scheduler({"report": report}, broker_url=lossy.url, **lossy.conf)
    lead(scheduler)
    wait_for(lambda: scheduler.tick() is not None and published.count("report") >= 1, timeout=15)
    lossy.proxy.lose_replies()
    done: list[subprocess.CompletedProcess] = []
    where = ["--hosts", scheduler.zk_settings.hosts, "--root", scheduler.zk_settings.root]
    asking = threading.Thread(target=lambda: done.append(zkbeat(*where, "trigger", "report", "--json")))
    asking.start()
    with caplog.at_level(logging.INFO, logger="zkbeat"):
        wait_for(
            lambda: scheduler.tick() is not None and not asking.is_alive(), timeout=60, message=lambda: caplog.text
        )
    (result,) = done
    assert result.returncode == 3, (result.returncode, result.stdout, result.stderr)
    assert json.loads(result.stdout)["uncertain"] is True
    assert "never answered" in result.stderr
    lossy.proxy.heal()
    for _ in range(5):
        scheduler.tick()
    manual = [s for s in lossy.queued() if s not in {h["zkbeat-slot"] for h in published.headers}]
    assert len(manual) == 1, f"the run now is in the queue once: {lossy.queued()}"


def test_confirm_timeout_on_a_celery_that_ignores_it_is_warned_once(
    make_scheduler, published: Published, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Celery < 5.5 drops confirm_timeout: the entry still runs, and the log says once what bounds its wait."""
    from zkbeat.leading import publisher

    monkeypatch.setattr(publisher, "HAS_CONFIRM_TIMEOUT", False)  # as on Celery 5.3 and 5.4
    monkeypatch.setattr(publisher, "_warned_confirm_timeout", set())
    scheduler = make_scheduler({"tidy": every(0.2, options={"confirm_timeout": 5})})
    lead(scheduler)
    with caplog.at_level(logging.WARNING, logger="zkbeat"):
        wait_for(lambda: scheduler.tick() is not None and published.count("tidy") >= 3, timeout=15)
    warnings = [r.getMessage() for r in caplog.records if "confirm_timeout" in r.getMessage()]
    assert len(warnings) == 1 and "tidy" in warnings[0] and "zkbeat_stall_timeout" in warnings[0]

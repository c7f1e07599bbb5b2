"""SIGTERM reaches a leader whose broker went silent: it still exits, and soon.

A RabbitMQ that stops reading (a memory or disk alarm blocks publishers; a
link that drops every packet) never answers the close of beat's connection,
and py-amqp waits for that answer without a limit: the process would hang
after its handover, until a supervisor's SIGKILL.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable

import pytest

from tests.support.brokers import RabbitBroker
from tests.support.helpers import wait_for
from tests.support.processes import Cluster

pytestmark = pytest.mark.processes


@pytest.fixture
def rabbit() -> RabbitBroker:
    with RabbitBroker("silent-exit") as broker:
        yield broker


def test_a_leader_whose_broker_went_silent_exits_on_sigterm(
    make_cluster: Callable[..., Cluster], rabbit: RabbitBroker
) -> None:
    """The close of beat's connection waits at most zkbeat.leading.broker.CLOSE_TIMEOUT; the successor leads."""
    cluster = make_cluster(2, broker=rabbit.url).start()
    first = wait_for(lambda: cluster.publishes(), timeout=60, message=lambda: cluster.logs())[0]
    leader = next(r for r in cluster.replicas if r.pid == first.pid)
    wait_for(lambda: len([p for p in cluster.publishes() if p.pid == leader.pid]) >= 3, timeout=20)
    rabbit.proxy.blackhole()
    time.sleep(1.5)  # a pass or two publishes into the silent link
    leader.signal(signal.SIGTERM)
    assert leader.wait(20) == 0
    assert "stopped leading" in leader.log()
    assert "did not answer the close of beat's connection" in leader.log()
    other = next(r for r in cluster.replicas if r is not leader)
    wait_for(other.is_leader_by_log, timeout=10, message=other.log)  # the handover went first

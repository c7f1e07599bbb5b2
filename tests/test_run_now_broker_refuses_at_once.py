"""Run-now requests while the broker refuses at once: read again after RETRY_DELAY, as scheduled ticks wait.

A pass whose run-now requests find no producer (the wait for the broker
gave up: an error kombu does not retry, such as a refused login or a
producer that cannot declare its exchange, comes back at once) left the
requests in the inbox and had it read them again at the next pass, at
once: the leader's loop read the inbox and asked the broker as fast as
both answered, while the scheduled ticks of the same pass waited
RETRY_DELAY. Once the broker is back every request runs once.
"""

from __future__ import annotations

import pytest

from tests.support.helpers import Published, every, lead
from tests.test_claim_parts_run_now import NAMES, BrokerGone, back_and_each_request_run_once, inbox, request_each
from zkbeat.leading import term as term_module


def gone_from_the_start(make_scheduler, monkeypatch: pytest.MonkeyPatch) -> tuple[object, BrokerGone]:
    scheduler = make_scheduler({name: every(3600) for name in NAMES})  # not due for an hour: run-now only
    lead(scheduler)
    scheduler.tick()
    gone = BrokerGone(monkeypatch)  # the wait for the broker gives up at once
    gone.down = gone.went = True
    return scheduler, gone


def test_run_now_requests_that_found_no_producer_are_not_read_again_before_the_retry_delay(
    make_scheduler, published: Published, zk_client, zk_root: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(term_module, "RETRY_DELAY", 3600.0)  # longer than the test: any second try is too soon
    scheduler, gone = gone_from_the_start(make_scheduler, monkeypatch)
    requests = request_each(zk_client, zk_root)
    for _ in range(5):
        scheduler.tick()
    assert gone.waited == [len(requests)], f"the broker was asked for the requests in pass after pass: {gone.waited}"
    assert published.headers == [] and inbox(zk_client, zk_root) == sorted(requests)


def test_run_now_requests_that_found_no_producer_each_run_once_when_the_broker_is_back(
    make_scheduler, published: Published, zk_client, zk_root: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    scheduler, gone = gone_from_the_start(make_scheduler, monkeypatch)
    requests = request_each(zk_client, zk_root)
    scheduler.tick()
    assert gone.waited, "the requests were not tried while the broker was away"
    assert published.headers == [] and inbox(zk_client, zk_root) == sorted(requests)
    back_and_each_request_run_once(scheduler, gone, published, requests, zk_client, zk_root)

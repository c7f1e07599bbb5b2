"""A replica loads kombu's transport for its broker when it joins, not in its first leader's pass.

Importing kombu's Redis transport (and redis-py with it) took tens of
milliseconds of the first pass of a new leader, while every due tick
waited. The replica loads it when it joins the election; it opens no
connection to do so. A broker URL kombu cannot load a transport for (an
unknown scheme, a scheme that is an import path, a transport whose client
library is missing) still fails the leader's first pass exactly as before:
logged as an unexpected error with kombu's own exception, nothing claimed,
stepping down after three passes; joining the election says nothing of it.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import subprocess
import sys
import textwrap
import traceback
from typing import Any

import pytest
from celery import Celery
from kazoo.client import KazooClient

from tests.support.helpers import LogRecords, Published, every, lead, wait_for
from tests.support.processes import ROOT
from tests.support.servers import ZooKeeperServer

_JOIN = """
import json, sys
from celery import Celery
before = "kombu.transport.redis" in sys.modules
app = Celery("transport-early", set_as_current=False)
app.conf.update(broker_url=sys.argv[1], zkbeat_hosts=sys.argv[2], zkbeat_root=sys.argv[3], zkbeat_liveness=False)
import zkbeat
scheduler = zkbeat.Scheduler(app)  # not lazy: Celery's __init__ runs setup_schedule, which joins the election
from kombu.transport import _transport_cache
loaded = "kombu.transport.redis" in sys.modules
joined = {"before": before, "after": loaded, "cached": repr(_transport_cache.get("redis"))}
scheduler.close()
print(json.dumps(joined))
"""


def test_joining_the_election_loads_the_broker_transport_without_connecting(
    zk_server: ZooKeeperServer, zk_root: str
) -> None:
    """After setup the Redis transport is imported and kombu holds its class; nothing dialled the broker's port."""
    with socket.socket() as broker:
        broker.bind(("127.0.0.1", 0))
        broker.listen(8)
        broker.setblocking(False)
        url = f"redis://127.0.0.1:{broker.getsockname()[1]}/0"
        done = subprocess.run(
            [sys.executable, "-c", textwrap.dedent(_JOIN), url, zk_server.hosts, zk_root],
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr
        joined = json.loads(done.stdout.strip().splitlines()[-1])
        assert joined["before"] is False, "zkbeat's import must not load it already (else this proves nothing)"
        assert joined["after"] is True, done.stderr
        assert joined["cached"] == "<class 'kombu.transport.redis.Transport'>"
        with pytest.raises(BlockingIOError):  # no connection is waiting to be accepted: none was opened
            broker.accept()


#: Broker URLs kombu loads no transport for: an unknown scheme, a scheme that is an import path (refused by
#: kombu 5.7, imported as a module before), a transport whose client library (botocore) is not installed.
_BAD_URLS = ["nosuch://localhost//", "a.b://localhost//", "sqs://"]


def _kombu_error(url: str) -> str:
    """The error kombu raises making a connection to ``url``: what beat's connection meets in the pass."""
    app = Celery("kombu-error", set_as_current=False)
    app.conf.broker_url = url
    try:
        app.connection_for_write()
    except (KeyError, ValueError, ImportError) as exc:
        return repr(exc)
    raise AssertionError(f"kombu loads a transport for {url}")


class _Records(LogRecords):
    def said(self, level: int = logging.WARNING) -> list[tuple[str, str, str]]:
        """(logger, level, message) of zkbeat's, Celery's and kombu's records at ``level`` or above."""
        return [
            (r.name, r.levelname, r.getMessage())
            for r in self.records
            if r.levelno >= level and r.name.split(".")[0] in ("zkbeat", "celery", "kombu")
        ]


@pytest.fixture
def records() -> Any:
    handler = _Records()
    root = logging.getLogger()
    root.addHandler(handler)
    level = root.level
    root.setLevel(logging.DEBUG)
    try:
        yield handler
    finally:
        root.setLevel(level)
        root.removeHandler(handler)


@pytest.mark.parametrize("url", _BAD_URLS)
def test_a_broker_url_kombu_cannot_load_fails_the_first_pass_as_before(
    url: str, make_scheduler: Any, published: Published, zk_client: KazooClient, zk_root: str, records: _Records
) -> None:
    """Joining logs nothing of it; each pass fails making beat's connection (an unexpected error), then steps down."""
    scheduler = make_scheduler({"tidy": every(0.2)}, broker_url=url)
    lead(scheduler)
    assert records.said() == [], "joining the election says nothing of the broker"
    assert "connection" not in scheduler.__dict__
    expected = _kombu_error(url)
    epoch = scheduler.election.epoch

    def errors() -> list[logging.LogRecord]:
        return [r for r in records.records if r.name == "zkbeat.scheduler" and r.levelno >= logging.ERROR]

    wait_for(lambda: scheduler.tick() is not None and len(errors()) >= 3, timeout=30)
    first_three = errors()[:3]
    assert [r.getMessage() for r in first_three] == [
        f"zkbeat: unexpected error while leading (epoch {epoch}); starting the term afresh in 1s",
        f"zkbeat: unexpected error while leading (epoch {epoch}); starting the term afresh in 1s",
        f"zkbeat: unexpected error while leading (epoch {epoch}), 3 passes in a row; stepping down",
    ]
    for record in first_three:
        assert record.exc_info is not None and repr(record.exc_info[1]) == expected
        # Raised making beat's connection in the pass (Publisher.producer), not kept from the join.
        frames = [frame.name for frame in traceback.extract_tb(record.exc_info[2])]
        assert "producer" in frames and "beat_connection" in frames, " ".join(frames)
        assert frames.index("producer") < frames.index("beat_connection") < frames.index("connection_for_write")
    # Before the first error, no warning (of the join, kombu's or Celery's): the error is the first word of it.
    assert records.said()[0] == ("zkbeat.scheduler", "ERROR", first_three[0].getMessage())
    assert published.rows == []
    assert zk_client.exists(f"{zk_root}/v1/entries/tidy") is None, "nothing was claimed"

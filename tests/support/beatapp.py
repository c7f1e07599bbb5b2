"""The Celery app the process tests run under ``celery beat``.

Everything comes from the environment so each test can start replicas of the
same "image" with its own ZooKeeper root, schedule and broker. Every publish
is recorded to Redis from ``after_task_publish`` (it fires only once the
message was handed to the broker), which is what the tests count.
"""

from __future__ import annotations

import faulthandler
import json
import logging
import os
import signal
import threading
import time
from datetime import timedelta

from celery import Celery
from celery.schedules import crontab, schedule
from celery.signals import before_task_publish

from tests.support.processes import record_publishes


class RaisingSchedule(schedule):
    """A schedule whose is_due always raises."""

    def is_due(self, last_run_at):
        raise ValueError("this schedule cannot say when it is due")


# "watching the liveness of <candidate>": a test that kills a replica waits for
# its follower's line first; before the follower has verified that connection,
# only the session would see the kill.
logging.getLogger("zkbeat.coordination.liveness").setLevel(logging.DEBUG)
# Any other logger a test reads at DEBUG, e.g. ["kazoo.client.zkbeat"].
for _logger in json.loads(os.environ.get("ZKBEAT_TEST_DEBUG_LOGGERS", "[]")):
    logging.getLogger(_logger).setLevel(logging.DEBUG)

# SIGWINCH (ignored by default): every thread's stack to the log, for a test
# whose replica does not exit when it should (tests.support.processes.Replica.wait).
faulthandler.register(signal.SIGWINCH, all_threads=True)

app = Celery("beatapp")
app.conf.update(
    broker_url=os.environ["ZKBEAT_TEST_BROKER"],
    broker_connection_retry_on_startup=True,
    zkbeat_root=os.environ["ZKBEAT_TEST_ROOT"],
    zkbeat_session_timeout=float(os.environ.get("ZKBEAT_TEST_SESSION_TIMEOUT", "2")),
    zkbeat_identity=os.environ.get("ZKBEAT_TEST_IDENTITY"),
    beat_max_loop_interval=float(os.environ.get("ZKBEAT_TEST_MAX_INTERVAL", "5")),
    beat_schedule={
        name: {
            "task": "beatapp.record",
            "schedule": timedelta(seconds=seconds),
            "args": (name,),
            # e.g. {"zkbeat_misfire_grace_time": 2} for one entry only
            "options": json.loads(os.environ.get("ZKBEAT_TEST_ENTRY_OPTIONS", "{}")).get(name, {}),
        }
        for name, seconds in json.loads(os.environ.get("ZKBEAT_TEST_SCHEDULE", "{}")).items()
    },
)
# Entries whose schedule raises (a user's custom schedule with a bug): the
# rest of the schedule must keep running.
for _name in json.loads(os.environ.get("ZKBEAT_TEST_RAISING", "[]")):
    app.conf.beat_schedule[_name] = {"task": "beatapp.record", "schedule": RaisingSchedule(1.0), "args": (_name,)}
# Crontab entries, {name: crontab's keyword arguments}, in the app's timezone (ZKBEAT_TEST_CONF may set it).
for _name, _fields in json.loads(os.environ.get("ZKBEAT_TEST_CRONTAB", "{}")).items():
    app.conf.beat_schedule[_name] = {"task": "beatapp.record", "schedule": crontab(**_fields), "args": (_name,)}
# A replica of another zkbeat layout, as a rolling upgrade mixes them: it
# announces that layout and refuses to lead where a newer one is (this
# release's refusal, played as an older or newer release's).
if os.environ.get("ZKBEAT_TEST_LAYOUT"):
    import zkbeat.coordination.peers
    import zkbeat.leading.replica

    zkbeat.coordination.peers.LAYOUT = zkbeat.leading.replica.LAYOUT = int(os.environ["ZKBEAT_TEST_LAYOUT"])
if os.environ.get("ZKBEAT_TEST_LAYOUT_RECHECK"):
    import zkbeat.leading.leadership

    zkbeat.leading.leadership.LAYOUT_RECHECK = float(os.environ["ZKBEAT_TEST_LAYOUT_RECHECK"])
# How long a run-now request for an entry this replica's schedule lacks is kept (zkbeat.ledger.controls).
if os.environ.get("ZKBEAT_TEST_TRIGGER_PATIENCE"):
    import zkbeat.leading.term

    zkbeat.leading.term.UNKNOWN_ENTRY_PATIENCE = float(os.environ["ZKBEAT_TEST_TRIGGER_PATIENCE"])
# Any other Celery setting a test needs, e.g. {"task_create_missing_queues": false}.
app.conf.update(json.loads(os.environ.get("ZKBEAT_TEST_CONF", "{}")))
if os.environ.get("ZKBEAT_TEST_METRICS_PORT"):
    app.conf.zkbeat_metrics_port = int(os.environ["ZKBEAT_TEST_METRICS_PORT"])
    app.conf.zkbeat_metrics_address = "127.0.0.1"
if os.environ.get("ZKBEAT_TEST_MISFIRE") is not None:
    app.conf.zkbeat_misfire_grace_time = float(os.environ["ZKBEAT_TEST_MISFIRE"])

# The record may live in another Redis than the broker, so that a test can
# stop the broker and still count what was published around the outage.
record_publishes(
    os.environ.get("ZKBEAT_TEST_RECORD_URL") or os.environ["ZKBEAT_TEST_BROKER"],
    os.environ.get("ZKBEAT_TEST_RECORD_KEY", "zkbeat-test:publishes"),
    os.environ.get("ZKBEAT_TEST_IDENTITY"),
)
_sigterm_on_publish = [os.environ.get("ZKBEAT_TEST_SIGTERM_ON_PUBLISH") == "1"]


@app.task(name="beatapp.record")
def record(name: str) -> str:
    return name


@before_task_publish.connect
def _sigterm_mid_publish(headers=None, **kwargs) -> None:
    """Test hook: land a SIGTERM after the ledger commit, before the send."""
    if _sigterm_on_publish[0] and headers and headers.get("zkbeat-entry"):
        _sigterm_on_publish[0] = False
        os.kill(os.getpid(), signal.SIGTERM)


def _close_liveness_socket(signum, frame) -> None:
    """Test hook (SIGUSR1): close this replica's liveness socket while the process lives on."""
    import gc

    from zkbeat.coordination.liveness import Beacon

    for beacon in [o for o in gc.get_objects() if isinstance(o, Beacon)]:
        beacon.close()


signal.signal(signal.SIGUSR1, _close_liveness_socket)


class _StalledWake:
    """Stands in for kazoo's wake-up socket: the main thread's next send there stalls until a signal cuts it.

    kazoo's ``_call`` queues a request, then sends one byte on this socket to
    wake its connection thread, inside a bare ``except:`` that turns anything
    raised there into ConnectionClosedError. A shutdown signal whose handler
    raises SystemExit while the main thread is in that send is swallowed so.
    The send stalls only on the main thread and outside zkbeat's held
    stretches (zkbeat.leading._signals, whose recorder raises nothing); other
    threads' wake-ups pass through. Once cut, the real socket is back and
    gets the byte, so that kazoo's queue and its wake-ups still agree.
    """

    def __init__(self, connection, real) -> None:
        self.connection = connection
        self.real = real

    def send(self, data: bytes) -> int:
        held = getattr(signal.getsignal(signal.SIGTERM), "__module__", None) == "zkbeat.leading._signals"
        if threading.current_thread() is not threading.main_thread() or held:
            return self.real.send(data)
        self.connection._write_sock = self.real
        try:
            logging.getLogger("beatapp").warning("zkbeat-test: stalled in kazoo's wake-up send")
            while True:
                time.sleep(60)
        finally:
            self.real.send(data)

    def __getattr__(self, name: str):
        return getattr(self.real, name)


def _stall_next_kazoo_call(signum, frame) -> None:
    """Test hook (SIGUSR2): the main thread's next kazoo call stalls in its wake-up send (see _StalledWake)."""
    import gc

    from kazoo.client import KazooClient

    for client in [o for o in gc.get_objects() if isinstance(o, KazooClient)]:
        connection = client._connection
        if connection._write_sock is not None and not isinstance(connection._write_sock, _StalledWake):
            connection._write_sock = _StalledWake(connection, connection._write_sock)


signal.signal(signal.SIGUSR2, _stall_next_kazoo_call)

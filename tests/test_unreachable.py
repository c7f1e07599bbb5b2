"""A ZooKeeper that cannot be reached is named by zkbeat, every so often, instead of kazoo twice a second."""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.helpers import LogRecords, wait_for
from tests.support.processes import ROOT
from tests.support.servers import RedisServer, free_port
from zkbeat.coordination import _zookeeper
from zkbeat.coordination._zookeeper import REPORT_AFTER, REPORT_EVERY, Unreachable, _ClientLog

#: kazoo's lines of one connection attempt, as they read in a replica's log.
KAZOO_ATTEMPT = re.compile(r"(Connecting to |Connection dropped: |Connection time-out: |Transition to CONNECTING)")
UNREACHABLE = "zkbeat: cannot reach ZooKeeper"


@pytest.mark.processes
def test_beat_names_zkbeat_hosts_while_zookeeper_is_unreachable_and_keeps_kazoos_attempts_at_debug(
    redis_server: RedisServer, zk_root: str, tmp_path: Path
) -> None:
    """Beat on a closed port warns naming zkbeat_hosts, the host tried and how long; kazoo's attempts stay at DEBUG."""
    hosts = f"127.0.0.1:{free_port()}"  # nothing listens there: every attempt is refused
    log_path = tmp_path / "beat.log"
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "ZKBEAT_HOSTS": hosts,
        "ZKBEAT_TEST_BROKER": redis_server.url,
        "ZKBEAT_TEST_ROOT": zk_root,
        "ZKBEAT_TEST_SCHEDULE": json.dumps({"alpha": 1}),
        "ZKBEAT_TEST_IDENTITY": "lost-replica",
        # What kazoo says is kept, one level down: shown here because this logger is at DEBUG.
        "ZKBEAT_TEST_DEBUG_LOGGERS": json.dumps(["kazoo.client.zkbeat"]),
    }
    with open(log_path, "ab") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "tests.support.beatapp", "beat", "--scheduler", "zkbeat.Scheduler",
             "--loglevel", "INFO"],
            cwd=ROOT, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    try:
        wait_for(lambda: UNREACHABLE in log_path.read_text(), timeout=60, message=lambda: log_path.read_text())
        # Let a few more attempts happen: each is a kazoo line at DEBUG, none at INFO or WARNING.
        wait_for(lambda: len(_attempt_lines(log_path.read_text(), "DEBUG")) >= 10, timeout=60)
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    text = log_path.read_text()
    warning = next(line for line in text.splitlines() if UNREACHABLE in line)
    assert "WARNING" in warning, warning
    assert f"zkbeat_hosts='{hosts}'" in warning and f"tried {hosts}" in warning, warning
    assert re.search(r"for \d+s", warning) and "Connection refused" in warning, warning
    assert _attempt_lines(text, "INFO") == [] and _attempt_lines(text, "WARNING") == [], text
    attempts = len(_attempt_lines(text, "DEBUG"))
    warnings = text.count(UNREACHABLE)
    assert warnings < attempts / 5, f"{warnings} zkbeat warnings for {attempts} attempts:\n{text}"


def _attempt_lines(text: str, level: str) -> list[str]:
    return [line for line in text.splitlines() if f"{level}/" in line and KAZOO_ATTEMPT.search(line)]


@pytest.fixture
def records() -> LogRecords:
    handler = LogRecords()
    for name in ("zkbeat-test-kazoo", _zookeeper.logger.name):
        logging.getLogger(name).addHandler(handler)
        logging.getLogger(name).setLevel(logging.DEBUG)
    yield handler
    for name in ("zkbeat-test-kazoo", _zookeeper.logger.name):
        logging.getLogger(name).removeHandler(handler)
        logging.getLogger(name).setLevel(logging.NOTSET)


def test_kazoos_attempt_lines_go_down_to_debug_and_its_other_warnings_keep_their_level(records: LogRecords) -> None:
    """Through a zkbeat client's logger, kazoo's attempt lines are DEBUG; an expired session is still a WARNING."""
    log = _ClientLog(logging.getLogger("zkbeat-test-kazoo"), None)
    log.info("Connecting to %s(%s):%s, use_ssl: %r", "127.0.0.1", "127.0.0.1", 1, False)
    log.warning("Connection dropped: %s", "socket connection error: Connection refused")
    log.warning("Session has expired")
    log.warning("AUTH_FAILED closing: %s", "bad credentials")
    levels = [(r.getMessage().split(":")[0].split(" to ")[0], r.levelname) for r in records.records]
    assert levels == [
        ("Connecting", "DEBUG"),
        ("Connection dropped", "DEBUG"),
        ("Session has expired", "WARNING"),
        ("AUTH_FAILED closing", "WARNING"),
    ]


def test_an_outage_is_reported_after_a_short_while_then_every_report_interval(records: LogRecords) -> None:
    """Failed attempts warn after REPORT_AFTER s without ZooKeeper, then each REPORT_EVERY s; its return is logged."""
    now = [100.0]
    unreachable = Unreachable("zk1:2181,zk2:2181", clock=lambda: now[0])
    log = _ClientLog(logging.getLogger("zkbeat-test-kazoo"), unreachable)

    def attempt(host: str, seconds: float) -> None:
        now[0] += seconds
        log.info("Connecting to %s(%s):%s, use_ssl: %r", host, "10.0.0.1", 2181, False)
        log.warning("Connection dropped: %s", "socket connection error: Connection refused")

    attempt("zk1", 1)  # a member down while the next one may answer: no outage yet
    assert unreachable.warnings == 0
    while unreachable.warnings == 0:
        attempt("zk2", 1)
    assert now[0] - 100 == REPORT_AFTER
    ours = [r.getMessage() for r in records.records if r.name == _zookeeper.logger.name]
    assert ours[-1].startswith(
        f"zkbeat: cannot reach ZooKeeper for {REPORT_AFTER:.0f}s at zkbeat_hosts='zk1:2181,zk2:2181'"
    ), ours
    assert "tried zk1:2181, zk2:2181; last error: socket connection error: Connection refused" in ours[-1], ours
    for _ in range(int(REPORT_EVERY) - 1):
        attempt("zk1", 1)
    assert unreachable.warnings == 1
    attempt("zk1", 1)
    assert unreachable.warnings == 2
    now[0] += 1
    unreachable.state("CONNECTED")
    last = [r for r in records.records if r.name == _zookeeper.logger.name][-1]
    assert last.levelname == "INFO" and "ZooKeeper answers again" in last.getMessage(), last.getMessage()
    attempt("zk1", 100)  # an attempt that fails while connected (a dropped connection) starts nothing by itself
    assert unreachable.warnings == 2

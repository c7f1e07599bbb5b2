"""The log lines of a scripted failover, checked against the table of docs/operating.md.

Three real replicas live through a pause and a resume, ``zkbeat step-down``,
a SIGTERM and a kill -9. Each event must print the line the table gives, at
its level, on the replica that saw it; and every line they print on
``zkbeat.events``, and every WARNING of zkbeat's (the liveness socket's
lines aside: how-it-works.md describes those), must be a row of the table.
"""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from kazoo.client import KazooClient

from tests.support.faults import candidates, wait_until_watched
from tests.support.helpers import every, lead, wait_for
from tests.support.processes import ROOT, Cluster, Replica
from tests.support.servers import RedisServer, ZooKeeperServer, expire_session_quietly
from zkbeat.ledger import controls

pytestmark = pytest.mark.processes

DOC = ROOT / "docs" / "operating.md"
#: Each replica logs "[LEVEL logger] message", so a line says which logger and level it came on.
LOG_FORMAT = "[%(levelname)s %(name)s] %(message)s"
_LINE = re.compile(r"^\[(?P<level>[A-Z]+) (?P<logger>[\w.]+)\] (?P<message>.*)$")
#: The logger of the liveness socket's lines: documented in how-it-works.md, not in the table.
LIVENESS = "zkbeat.coordination.liveness"


@dataclass(frozen=True)
class Row:
    event: str
    level: str
    pattern: re.Pattern[str]


def table() -> dict[str, Row]:
    """The rows of the log-line table in docs/operating.md, by event."""
    text = DOC.read_text(encoding="utf-8")
    start = text.index("<!-- log lines: tests/test_log_lines.py reads this table -->")
    rows = {}
    for line in text[start:].splitlines()[3:]:
        if not line.startswith("|"):
            break
        event, level, shown = (cell.strip() for cell in line.strip("|").split(" | "))
        template = re.match(r"`([^`]+)`", shown)
        assert template, f"no line in backquotes in the row {line!r}"
        rows[event] = Row(event, level, _regex(template.group(1)))
    return rows


def _regex(template: str) -> re.Pattern[str]:
    """A row's line as a regular expression: ``<anything>`` matches any text, the rest itself."""
    parts = re.split(r"(<[^<>]+>)", template)
    return re.compile("".join(".+?" if part.startswith("<") else re.escape(part) for part in parts))


@dataclass(frozen=True)
class Line:
    replica: str
    level: str
    logger: str
    message: str


def lines(replica: Replica) -> list[Line]:
    found = []
    for text in replica.log().splitlines():
        match = _LINE.match(text)
        if match:
            found.append(Line(replica.identity, match["level"], match["logger"], match["message"]))
    return found


def printed(replica: Replica, row: Row) -> list[Line]:
    """The lines of ``replica`` that are ``row``, at its level."""
    return [line for line in lines(replica) if line.level == row.level and row.pattern.fullmatch(line.message)]


def expect(replica: Replica, row: Row, containing: str = "", timeout: float = 60) -> Line:
    """Wait for ``replica`` to print ``row`` (a line that also holds ``containing``).

    The wait may span the replica's start: 10-20 s on a loaded machine.
    """
    return wait_for(
        lambda: next((line for line in printed(replica, row) if containing in line.message), None),
        timeout=timeout,
        message=lambda: (
            f"{replica.identity} never printed {row.event!r} ({row.level}) with {containing!r}:\n"
            + replica.log()[-4000:]
        ),
    )


def zkbeat_command(*args: str, hosts: str, root: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "zkbeat", "--hosts", hosts, "--root", root, *args],
        env={**os.environ, "PYTHONPATH": str(ROOT)}, cwd=ROOT, capture_output=True, text=True, timeout=60,
    )  # fmt: skip


def epoch_of(client: KazooClient, root: str, identity: str) -> int:
    name = next(name for name, data, _ in candidates(client, root) if data.get("identity") == identity)
    return int(name.rsplit("-", 1)[1])


def test_a_scripted_failover_prints_the_lines_of_the_table(
    zk_server: ZooKeeperServer, redis_server: RedisServer, zk_client: KazooClient, zk_root: str, tmp_path: Path
) -> None:
    """Start, pause/resume, step-down, SIGTERM, kill -9: each prints its documented line, and nothing undocumented."""
    rows = table()
    conf = {"ZKBEAT_TEST_CONF": json.dumps({"worker_log_format": LOG_FORMAT})}
    cluster = Cluster(
        3, zk_hosts=zk_server.hosts, broker=redis_server.url, root=zk_root, schedule={"alpha": 1, "beta": 1},
        log_dir=tmp_path, session_timeout=10, extra_env=conf,
    )  # fmt: skip
    first, second, third = cluster.replicas
    try:
        # Start: the first leads a root nobody led; the others say whom they follow.
        first.start()
        expect(first, rows["first leader of a root"], "as replica-0;")
        epoch0 = epoch_of(zk_client, zk_root, "replica-0")
        second.start()
        expect(second, rows["a follower sees who leads"], f"following replica-0 (epoch {epoch0}) as replica-1")
        third.start()
        expect(third, rows["a follower sees who leads"], f"following replica-0 (epoch {epoch0}) as replica-2")

        # Pause and resume: said once each, at INFO, and no "changed underneath" WARNING.
        wait_for(lambda: zk_client.exists(f"{zk_root}/v1/entries/alpha"), timeout=30)
        controls.pause(zk_client, zk_root, "alpha", by="ops@test", note="migration")
        expect(first, rows["an entry paused"], "alpha is paused (by ops@test")
        controls.resume(zk_client, zk_root, "alpha")
        expect(first, rows["an entry resumed"], "resumed alpha (paused by ops@test")

        # zkbeat step-down: the leader says who asked; its successor says whom it took over from, and why.
        done = zkbeat_command("step-down", hosts=zk_server.hosts, root=zk_root)
        assert done.returncode == 0, done.stderr
        expect(first, rows["the leader asked to step down"], f"(epoch {epoch0})")
        took = expect(second, rows["takeover after a step-down"], f"after replica-0 (epoch {epoch0}) left")
        assert "stepped down on request by " in took.message
        expect(first, rows["a follower sees who leads"], "following replica-1")
        epoch1 = epoch_of(zk_client, zk_root, "replica-1")

        # SIGTERM: a handover, at INFO.
        second.signal(signal.SIGTERM)
        second.wait()
        expect(third, rows["takeover after a stop"], f"after replica-1 (epoch {epoch1}) left (SIGTERM)")
        epoch2 = epoch_of(zk_client, zk_root, "replica-2")

        # kill -9: a crash, at WARNING, once its follower watches its liveness socket.
        wait_until_watched(zk_client, zk_root, third.pid, first.log)
        third.signal(signal.SIGKILL)
        third.wait()
        expect(first, rows["takeover after a crash"], f"after replica-2 (epoch {epoch2}) left (crashed)")
    finally:
        cluster.stop()

    # Every line on zkbeat.events, and every WARNING of zkbeat's, is a row of the table, at the row's level.
    undocumented = []
    for replica in cluster.replicas:
        for line in lines(replica):
            ours = line.logger == "zkbeat.events" or (
                line.logger.startswith("zkbeat") and line.logger != LIVENESS and line.level in ("WARNING", "ERROR")
            )
            if ours and not any(
                row.level == line.level and row.pattern.fullmatch(line.message) for row in rows.values()
            ):
                undocumented.append(f"{line.replica}: {line.level} {line.logger}: {line.message}")
    assert undocumented == [], "lines the table of docs/operating.md does not hold:\n" + "\n".join(undocumented)
    # A resume is an operator's act, not a conflict: no alarm for it.
    assert not [line for r in cluster.replicas for line in lines(r) if "changed underneath" in line.message]


def test_the_table_reads_as_the_test_expects() -> None:
    """Every row of the table has an event, a level and a line, and the events this test names are there."""
    rows = table()
    assert len(rows) >= 20
    assert {row.level for row in rows.values()} <= {"INFO", "WARNING", "ERROR"}
    for event in (
        "first leader of a root",
        "takeover after a stop",
        "takeover after a step-down",
        "takeover after a crash",
        "a follower sees who leads",
        "the leader asked to step down",
        "an entry paused",
        "an entry resumed",
    ):
        assert event in rows, event


def leader_and_follower(make_scheduler):
    """Two in-process replicas without liveness sockets: "first" leads a term, "second" stands behind it."""
    first = make_scheduler({"often": every(0.2)}, identity="first", zkbeat_liveness=False)
    lead(first)
    wait_for(lambda: first.tick() is not None and first.term is not None, timeout=15)
    second = make_scheduler({"often": every(0.2)}, identity="second", zkbeat_liveness=False)
    # Once its client connected: before its connection thread runs, kazoo answers "Connection has been closed".
    wait_for(lambda: second.zk_client.connected and len(second.election.candidates()) == 2, timeout=15)
    return first, second


def test_a_lost_session_and_a_failing_step_down_are_taken_over_at_warning(
    make_scheduler, zk_server: ZooKeeperServer, caplog: pytest.LogCaptureFixture
) -> None:
    """A leader whose session ended, or that stepped down as something failed: its successor logs a WARNING."""
    rows = table()
    first, second = leader_and_follower(make_scheduler)

    def took_over(scheduler, row: Row, containing: str) -> None:
        def found() -> bool:
            scheduler.tick()
            return any(
                r.name == "zkbeat.events" and r.levelname == row.level and row.pattern.fullmatch(r.getMessage())
                and containing in r.getMessage()
                for r in caplog.records
            )  # fmt: skip

        wait_for(found, timeout=30, message=lambda: "\n".join(r.getMessage() for r in caplog.records))

    with caplog.at_level(logging.INFO, logger="zkbeat"):
        epoch = first.election.epoch
        expire_session_quietly(*first.zk_client.client_id, zk_server.hosts)
        took_over(second, rows["takeover after a lost session"], f"as second after first (epoch {epoch}) left")
        # The replica whose session ended says so itself, at WARNING, naming itself and the epoch it led.
        lost = [r for r in caplog.records if rows["session lost"].pattern.fullmatch(r.getMessage())]
        assert [(r.levelname, f"(first, epoch {epoch})" in r.getMessage()) for r in lost] == [("WARNING", True)], [
            r.getMessage() for r in caplog.records
        ]
        wait_for(lambda: first.tick() is not None and len(first.election.candidates()) == 2, timeout=30)
        epoch = second.election.epoch
        second.election.step_down(reason="its beat loop stalled past zkbeat_stall_timeout", failed=True)
        took_over(first, rows["takeover after a failing leader stepped down"], f"after second (epoch {epoch}) left")
    stepping = [r for r in caplog.records if r.getMessage().startswith("zkbeat: stepping down")]
    assert [r.levelname for r in stepping] == ["INFO"] and rows["the leader steps down itself"].pattern.fullmatch(
        stepping[0].getMessage()
    ), [r.getMessage() for r in stepping]


def test_a_candidate_deleted_from_outside_is_said_at_warning_and_the_replica_rejoins(
    make_scheduler, zk_client: KazooClient, caplog: pytest.LogCaptureFixture
) -> None:
    """docs/operating.md's row "a candidate deleted by someone else": a leader whose candidate znode someone
    deletes by hand (no step-down request, no departure note) says so once at WARNING on zkbeat.events, with
    its epoch, and joins the line again at the back; the replica behind it takes over."""
    rows = table()
    first, second = leader_and_follower(make_scheduler)
    epoch, candidate = first.election.epoch, first.election.candidate
    with caplog.at_level(logging.INFO, logger="zkbeat"):
        zk_client.delete(candidate)

        def said() -> list[logging.LogRecord]:
            first.tick()
            second.tick()
            return [r for r in caplog.records if rows["a candidate deleted by someone else"].pattern.fullmatch(
                r.getMessage())]  # fmt: skip

        deleted = wait_for(said, timeout=30, message=lambda: "\n".join(r.getMessage() for r in caplog.records))
        wait_for(lambda: second.tick() is not None and second.election.is_leader, timeout=30)
        wait_for(lambda: first.tick() is not None and len(first.election.candidates()) == 2, timeout=30)
    assert [(r.name, r.levelname) for r in deleted] == [("zkbeat.events", "WARNING")], [r.getMessage() for r in deleted]
    assert f"(epoch {epoch})" in deleted[0].getMessage()
    assert not first.election.is_leader and first.election.candidate != candidate

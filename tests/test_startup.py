"""What a new user meets when beat starts: a misspelt setting is named, a bad one ends beat on one line.

The settings come from a real app's configuration (``tests.support.beatapp``
under ``celery beat``, or an app configured as Django's ``CELERY``
namespace does it), never from a dict handed to the scheduler.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from celery import Celery

import zkbeat
from tests.support.helpers import wait_for
from tests.support.processes import ROOT
from tests.support.servers import RedisServer, ZooKeeperServer

#: The replicas' Celery app: everything it holds comes from the environment.
APP = "tests.support.beatapp"


class DjangoStyleSettings:
    """A Django settings module as ``config_from_object(..., namespace="CELERY")`` reads it."""

    CELERY_BROKER_URL = "memory://"
    CELERY_ZKBEAT_SESION_TIMEOUT = 5  # the typo: read as nothing, silently, before
    CELERY_ZKBEAT_IDENTITY = "django-replica"
    CELERY_ZKBEAT_ROOOT = "/zkbeat/typo"
    CELERY_BEAT_MAX_LOOP_INTERVAL = 0.5


def beatapp_env(zk_server: ZooKeeperServer, redis_server: RedisServer, zk_root: str, **conf: Any) -> dict[str, str]:
    """The environment under which ``-A tests.support.beatapp`` is an app with ``conf`` on top."""
    import json

    return {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "ZKBEAT_HOSTS": zk_server.hosts,
        "ZKBEAT_TEST_BROKER": redis_server.url,
        "ZKBEAT_TEST_ROOT": zk_root,
        "ZKBEAT_TEST_SCHEDULE": json.dumps({"alpha": 1}),
        "ZKBEAT_TEST_CONF": json.dumps(conf),
    }


@pytest.fixture
def scheduler_of() -> Iterator[Any]:
    """``scheduler_of(app)``: a zkbeat.Scheduler on ``app`` with its schedule set up; closed afterwards."""
    made: list[Any] = []

    def make(app: Celery) -> Any:
        scheduler = zkbeat.Scheduler(app)
        made.append(scheduler)
        scheduler.setup_schedule()
        return scheduler

    yield make
    for scheduler in made:
        scheduler.close()


def warnings_of(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name.startswith("zkbeat") and r.levelno == logging.WARNING]


def test_a_misspelt_setting_warns_at_start_up_with_the_closest_name(
    scheduler_of: Any, zk_server: ZooKeeperServer, zk_root: str, caplog: pytest.LogCaptureFixture
) -> None:
    """``zkbeat_sesion_timeout`` and ``ZKBEAT_HOSTS`` (read only under a namespace) warn naming the setting meant."""
    app = Celery("typo-app", set_as_current=False)
    app.conf.update(
        broker_url="memory://",
        zkbeat_hosts=zk_server.hosts,
        zkbeat_root=zk_root,
        zkbeat_sesion_timeout=5,
        ZKBEAT_HOSTS="zk1:2181",
        zkbeat_liveness=False,
        beat_max_loop_interval=0.5,
    )
    with caplog.at_level(logging.WARNING, logger="zkbeat"):
        scheduler_of(app)
    warned = warnings_of(caplog)
    assert any("zkbeat_sesion_timeout" in line and "did you mean zkbeat_session_timeout?" in line for line in warned), (
        warned
    )
    assert any("ZKBEAT_HOSTS" in line and "did you mean zkbeat_hosts?" in line for line in warned), warned
    assert not any("zkbeat_hosts " in line or "zkbeat_root" in line for line in warned), warned


def test_a_misspelt_django_setting_warns_in_its_own_spelling(
    scheduler_of: Any, zk_server: ZooKeeperServer, zk_root: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Under Django's CELERY namespace a typo is named as written, with the CELERY_ZKBEAT_* name it should have."""
    app = Celery("django-app", set_as_current=False)
    app.config_from_object(DjangoStyleSettings, namespace="CELERY")
    app.conf.update(CELERY_ZKBEAT_HOSTS=zk_server.hosts, CELERY_ZKBEAT_ROOT=zk_root, CELERY_ZKBEAT_LIVENESS=False)
    with caplog.at_level(logging.WARNING, logger="zkbeat"):
        scheduler = scheduler_of(app)
    assert scheduler.zk_settings.identity == "django-replica"  # the correct ones are read as before
    warned = warnings_of(caplog)
    assert any(
        "CELERY_ZKBEAT_SESION_TIMEOUT" in line and "did you mean CELERY_ZKBEAT_SESSION_TIMEOUT?" in line
        for line in warned
    ), warned
    assert any("CELERY_ZKBEAT_ROOOT" in line and "did you mean CELERY_ZKBEAT_ROOT?" in line for line in warned), warned
    assert not any("CELERY_ZKBEAT_IDENTITY" in line or "CELERY_ZKBEAT_HOSTS" in line for line in warned), warned


def test_correct_settings_in_every_spelling_warn_of_nothing(
    scheduler_of: Any, zk_server: ZooKeeperServer, zk_root: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Every setting zkbeat reads, lower-case in a plain app and CELERY_ZKBEAT_* under a namespace, warns of nothing."""

    class Everything:
        CELERY_BROKER_URL = "memory://"
        CELERY_ZKBEAT_HOSTS = zk_server.hosts
        CELERY_ZKBEAT_ROOT = zk_root
        CELERY_ZKBEAT_SESSION_TIMEOUT = 4
        CELERY_ZKBEAT_LIVENESS = False
        CELERY_ZKBEAT_CATCHUP = "once"
        CELERY_ZKBEAT_STALL_TIMEOUT = 30

    app = Celery("all-good", set_as_current=False)
    app.config_from_object(Everything, namespace="CELERY")
    with caplog.at_level(logging.WARNING, logger="zkbeat"):
        scheduler_of(app)
    assert not [line for line in warnings_of(caplog) if "setting" in line], warnings_of(caplog)


def test_celery_beat_at_its_default_log_level_names_a_typo_and_says_it_took_over(
    zk_server: ZooKeeperServer, redis_server: RedisServer, zk_root: str, tmp_path: Path
) -> None:
    """``celery beat`` (no -l: WARNING) warns of the typo with the setting meant, and says it became leader."""
    log_path = tmp_path / "beat.log"
    env = beatapp_env(zk_server, redis_server, zk_root, zkbeat_sesion_timeout=5)
    with open(log_path, "ab") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", APP, "beat", "--scheduler", "zkbeat.Scheduler"],
            cwd=ROOT, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    try:
        wait_for(lambda: "did you mean zkbeat_session_timeout?" in log_path.read_text(), timeout=60,
                 message=lambda: log_path.read_text())  # fmt: skip
        assert process.poll() is None, log_path.read_text()
        line = next(line for line in log_path.read_text().splitlines() if "zkbeat_sesion_timeout" in line)
        assert "WARNING" in line, line
        # Leadership is an event an operator follows: shown at INFO on zkbeat.events even at beat's default level.
        wait_for(lambda: "zkbeat: became leader (epoch " in log_path.read_text(), timeout=60,
                 message=lambda: log_path.read_text())  # fmt: skip
        assert "INFO" in next(line for line in log_path.read_text().splitlines() if "became leader" in line)
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def test_a_bad_setting_ends_celery_beat_on_one_line_with_exit_status_1(
    zk_server: ZooKeeperServer, redis_server: RedisServer, zk_root: str
) -> None:
    """A bad ``zkbeat_session_timeout`` ends ``celery beat``: status 1, one line with setting, value, expectation."""
    env = beatapp_env(zk_server, redis_server, zk_root, zkbeat_session_timeout="ten")
    result = subprocess.run(
        [sys.executable, "-m", "celery", "-A", APP, "beat", "--scheduler", "zkbeat.Scheduler"],
        cwd=ROOT, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 1, (result.stdout, result.stderr)
    assert "Traceback" not in result.stderr + result.stdout, result.stderr
    lines = result.stderr.strip().splitlines()
    assert lines == ["zkbeat: zkbeat_session_timeout='ten': expected a number of seconds > 0"], result.stderr


@pytest.mark.parametrize("as_celery_subcommand", [False, True], ids=["zkbeat", "celery zkbeat"])
def test_a_bad_setting_ends_the_zkbeat_command_on_the_same_line(
    zk_server: ZooKeeperServer, redis_server: RedisServer, zk_root: str, as_celery_subcommand: bool
) -> None:
    """``zkbeat -A app status`` and ``celery -A app zkbeat status`` print beat's line and exit 2 ("cannot ask")."""
    env = beatapp_env(zk_server, redis_server, zk_root, zkbeat_session_timeout="ten")
    command = ["-m", "celery", "-A", APP, "zkbeat", "status"] if as_celery_subcommand else ["-m", "zkbeat", "-A", APP]
    if not as_celery_subcommand:
        command.append("status")
    result = subprocess.run(
        [sys.executable, *command], cwd=ROOT, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True,
        timeout=120,
    )  # fmt: skip
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert "Traceback" not in result.stderr + result.stdout, result.stderr
    lines = result.stderr.strip().splitlines()
    assert lines == ["zkbeat: zkbeat_session_timeout='ten': expected a number of seconds > 0"], result.stderr


def test_a_metrics_port_in_use_ends_celery_beat_on_one_line_naming_the_setting_before_it_joins(
    zk_server: ZooKeeperServer, redis_server: RedisServer, zk_root: str
) -> None:
    """Two replicas on one host with one ``zkbeat_metrics_port``: the second ends at start-up, status 1, on one line
    naming the setting and the address, before it joins the election (no candidate of it is left to lead with no
    /healthz to probe)."""
    import socket

    from kazoo.client import KazooClient

    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    port = taken.getsockname()[1]
    try:
        env = beatapp_env(
            zk_server, redis_server, zk_root, zkbeat_metrics_port=port, zkbeat_metrics_address="127.0.0.1"
        )
        result = subprocess.run(
            [sys.executable, "-m", "celery", "-A", APP, "beat", "--scheduler", "zkbeat.Scheduler"],
            cwd=ROOT, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
    finally:
        taken.close()
    assert result.returncode == 1, (result.stdout, result.stderr)
    assert "Traceback" not in result.stderr + result.stdout, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"zkbeat: zkbeat_metrics_port={port}: "), result.stderr
    assert f"127.0.0.1:{port}" in lines[0], lines[0]
    client = KazooClient(zk_server.hosts)
    client.start(10)
    try:
        joined = client.exists(f"{zk_root}/v1/election")
        candidates = client.get_children(f"{zk_root}/v1/election") if joined else []
    finally:
        client.stop()
        client.close()
    assert candidates == [], f"it joined the election before it failed: {candidates}"

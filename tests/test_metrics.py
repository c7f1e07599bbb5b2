"""Prometheus metrics and /healthz of an in-process replica on real servers."""

from __future__ import annotations

import json
import sys
import urllib.error
import urllib.request
from datetime import timedelta

import pytest
from celery import Celery

from tests.support.helpers import wait_for
from tests.support.servers import RedisServer, ZooKeeperServer, free_port
from zkbeat import ConfigurationError, Scheduler


def get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def make_app(zk_hosts: str, broker: str, root: str, port: int | None) -> Celery:
    app = Celery("zkbeat-metrics", set_as_current=False)
    app.conf.update(
        broker_url=broker,
        zkbeat_hosts=zk_hosts,
        zkbeat_root=root,
        zkbeat_session_timeout=4,
        zkbeat_identity="metrics-test",
        zkbeat_metrics_port=port,
        zkbeat_metrics_address="127.0.0.1",
        beat_max_loop_interval=0.5,
        beat_schedule={"tidy": {"task": "zkbeat.test", "schedule": timedelta(seconds=0.2)}},
    )
    return app


def metric(text: str, name: str) -> float:
    """The value of the first sample line starting with ``name``."""
    for line in text.splitlines():
        if line.startswith(name) and not line.startswith("#"):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} not exported")


def test_leader_exports_metrics_and_health(
    zk_server_private: ZooKeeperServer, redis_server: RedisServer, zk_root: str
) -> None:
    """A leading replica reports is_leader 1, committed claims and publishes; /healthz turns 503 when ZooKeeper goes."""
    port = free_port()
    scheduler = Scheduler(make_app(zk_server_private.hosts, redis_server.url, zk_root, port))
    try:
        assert scheduler.election.wait_for_leadership(timeout=15)
        wait_for(lambda: scheduler.tick() is not None and scheduler.metrics.last_publish is not None, timeout=10)
        status, text = get(port, "/metrics")
        assert status == 200
        assert metric(text, 'zkbeat_is_leader{identity="metrics-test"}') == 1
        assert metric(text, "zkbeat_publishes_total") >= 1
        assert metric(text, 'zkbeat_claims_total{identity="metrics-test",result="committed"}') >= 1
        assert metric(text, 'zkbeat_zookeeper_state{identity="metrics-test",state="CONNECTED"}') == 1
        assert metric(text, "zkbeat_seconds_since_last_publish") >= 0
        assert metric(text, "zkbeat_leadership_changes_total") == 1

        status, body = get(port, "/healthz")
        health = json.loads(body)
        assert status == 200 and health["is_leader"] is True and health["epoch"] == scheduler.election.epoch

        zk_server_private.stop()
        wait_for(lambda: get(port, "/healthz")[0] == 503, timeout=15)
        scheduler.tick()
        _, text = get(port, "/metrics")
        assert metric(text, 'zkbeat_is_leader{identity="metrics-test"}') == 0
        assert metric(text, 'zkbeat_zookeeper_state{identity="metrics-test",state="SUSPENDED"}') == 1
    finally:
        scheduler.close()


def test_metrics_are_off_by_default(zk_server: ZooKeeperServer, redis_server: RedisServer, zk_root: str) -> None:
    """Without zkbeat_metrics_port nothing listens and the replica still tracks its health."""
    scheduler = Scheduler(make_app(zk_server.hosts, redis_server.url, zk_root, None))
    try:
        assert scheduler.election.wait_for_leadership(timeout=15)
        assert scheduler.metrics.port is None
        wait_for(lambda: scheduler.metrics.health()[0], timeout=10)
    finally:
        scheduler.close()


def test_metrics_port_without_prometheus_client_names_the_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    """Asking for metrics without the extra installed fails at start-up, naming zkbeat_metrics_port."""
    monkeypatch.setitem(sys.modules, "prometheus_client", None)
    with pytest.raises(ConfigurationError, match="zkbeat_metrics_port.*zkbeat\\[metrics\\]"):
        Scheduler(make_app("127.0.0.1:2181", "memory://", "/x", free_port()), lazy=True)


class _NeverLoaded(Scheduler):
    """A host scheduler whose schedule never loads (a DatabaseScheduler whose database is down)."""

    def schedule_loaded(self) -> bool:
        return False


def test_a_leader_whose_schedule_has_not_loaded_is_not_leader_in_metrics_or_healthz(
    zk_server: ZooKeeperServer, redis_server: RedisServer, zk_root: str
) -> None:
    """zkbeat_is_leader and /healthz's is_leader follow the announcement `zkbeat health` counts: a replica that
    holds the lead while its schedule has not loaded is not announced and says 0 and false, so ZkbeatNoLeader
    (max is_leader == 0) fires while each replica in turn holds the lead without a schedule."""
    from tests.test_cli import zkbeat

    port = free_port()
    app = make_app(zk_server.hosts, redis_server.url, zk_root, port)
    app.conf.update(zkbeat_identity="unloaded", zkbeat_stall_timeout=120)
    scheduler = _NeverLoaded(app)
    scheduler.wait_in_tick = False
    try:
        assert scheduler.election.wait_for_leadership(timeout=15)
        for _ in range(3):
            scheduler.tick()
        health = zkbeat("--hosts", zk_server.hosts, "--root", zk_root, "health")
        assert health.returncode != 0, health.stdout  # not announced: the cluster has no leader
        _, text = get(port, "/metrics")
        _, body = get(port, "/healthz")
        assert metric(text, 'zkbeat_is_leader{identity="unloaded"}') == 0
        assert metric(text, "zkbeat_leadership_changes_total") == 0
        assert json.loads(body)["is_leader"] is False, body
    finally:
        scheduler.close()

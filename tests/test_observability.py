"""Grafana's dashboard and the Prometheus alert rules under docker/: every metric they use is exported by a
real replica, promtool accepts the rules (and their unit tests), and the gauges added for them move."""

from __future__ import annotations

import json
import re
import subprocess
import urllib.request
from collections.abc import Callable
from datetime import timedelta

import pytest
from celery import Celery
from kazoo.client import KazooClient

from tests.support.helpers import lead, wait_for
from tests.support.processes import ROOT, Cluster
from tests.support.servers import RedisServer, ZooKeeperServer, free_port, require_binary
from zkbeat import Scheduler

DASHBOARD = ROOT / "docker" / "grafana" / "zkbeat-dashboard.json"
RULES = ROOT / "docker" / "prometheus" / "zkbeat-alerts.yml"
RULE_TESTS = ROOT / "docker" / "prometheus" / "zkbeat-alerts-test.yml"
PROMTOOL_HINT = "apt-get install -y prometheus (it brings promtool)"


def used_metrics() -> set[str]:
    """Every zkbeat_* name in the dashboard's and the rules' queries."""
    exprs = [target["expr"] for panel in json.loads(DASHBOARD.read_text())["panels"] for target in panel["targets"]]
    exprs += re.findall(r"^\s*expr:\s*(.+)$", RULES.read_text(), flags=re.M)
    return {name for expr in exprs for name in re.findall(r"\bzkbeat_[a-z_]+\b", expr)}


def exported(text: str) -> set[str]:
    """Every series name a /metrics page holds or declares (a labelled metric with no child yet is declared)."""
    names = set()
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split()[:4]
            names |= {name, f"{name}_total"} if kind == "counter" else {name}
        elif line and not line.startswith("#"):
            names.add(re.split(r"[{ ]", line, maxsplit=1)[0])
    return names


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as answer:  # noqa: S310 - loopback
        return answer.read().decode()


def value(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name) and not line.startswith("#"):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} not exported")


@pytest.mark.processes
def test_every_metric_the_dashboard_and_the_rules_use_is_exported(make_cluster: Callable[..., Cluster]) -> None:
    """A running celery beat replica's /metrics has every metric Grafana's dashboard and the alert rules query."""
    port = free_port()
    cluster = make_cluster(1, schedule={"tick": 0.5}, extra_env={"ZKBEAT_TEST_METRICS_PORT": str(port)})
    cluster.start()
    wait_for(lambda: len(cluster.publishes()) >= 4, timeout=60, message=cluster.logs)  # a start under load
    text = scrape(port)
    names = exported(text)
    used = used_metrics()
    assert {"zkbeat_is_leader", "zkbeat_entries_overdue", "zkbeat_refusing_to_lead"} <= used
    assert sorted(used - names) == [], f"used but not exported; exported: {sorted(names)}"
    # A healthy leader: nothing overdue, nothing left out, not refusing. Overdue is read at the scrape: a tick
    # of 0.5 s held up half a second on a loaded machine counts for that moment, so a scrape must show 0 soon.
    wait_for(lambda: value(scrape(port), "zkbeat_entries_overdue") == 0, timeout=30,
             message=lambda: f"a healthy leader's tick stays overdue\n{cluster.logs()}")  # fmt: skip
    assert value(text, "zkbeat_entries_left_out") == 0
    assert value(text, "zkbeat_refusing_to_lead") == 0


def test_the_alert_rules_pass_promtool() -> None:
    """promtool accepts the rules, and their unit tests (alerts fire on their series, and only then) pass."""
    promtool = require_binary("promtool", PROMTOOL_HINT)
    checked = subprocess.run([promtool, "check", "rules", str(RULES)], capture_output=True, text=True, timeout=60)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    tested = subprocess.run(
        [promtool, "test", "rules", RULE_TESTS.name], capture_output=True, text=True, timeout=60, cwd=RULE_TESTS.parent
    )
    assert tested.returncode == 0, tested.stdout + tested.stderr


def _app(zk_hosts: str, broker: str, root: str, port: int, every: float = 0.3) -> Celery:
    app = Celery("zkbeat-observability", set_as_current=False)
    app.conf.update(
        broker_url=broker,
        zkbeat_hosts=zk_hosts,
        zkbeat_root=root,
        zkbeat_session_timeout=4,
        zkbeat_identity="observed",
        zkbeat_metrics_port=port,
        zkbeat_metrics_address="127.0.0.1",
        beat_max_loop_interval=0.3,
        beat_schedule={"tidy": {"task": "zkbeat.test", "schedule": timedelta(seconds=every)}},
    )
    return app


def test_an_entry_the_broker_cannot_take_counts_as_overdue(
    zk_server: ZooKeeperServer, redis_server: RedisServer, zk_root: str
) -> None:
    """With the broker gone, an entry a period late and unpublished counts in zkbeat_entries_overdue; 0 once back."""
    port = free_port()
    dead = f"redis://127.0.0.1:{free_port()}/0"
    scheduler = Scheduler(_app(zk_server.hosts, dead, zk_root, port))
    try:
        lead(scheduler)
        wait_for(
            lambda: scheduler.tick() is not None and value(scrape(port), "zkbeat_entries_overdue") >= 1, timeout=20
        )
        assert value(scrape(port), "zkbeat_publishes_total") == 0
    finally:
        scheduler.close()
    healthy = Scheduler(_app(zk_server.hosts, redis_server.url, zk_root, free_port()))
    try:
        lead(healthy)
        wait_for(lambda: healthy.tick() is not None and healthy.metrics.last_publish is not None, timeout=20)
        for _ in range(5):
            healthy.tick()
        assert healthy.metrics.overdue() == 0
    finally:
        healthy.close()


def test_an_entry_paused_while_the_broker_is_down_stops_counting_as_overdue(
    zk_server: ZooKeeperServer, zk_root: str, zk_client: KazooClient
) -> None:
    """A leader learns of a pause through a claim and claims nothing while the broker is down: it re-reads the
    overdue entries' ledger state instead, so an entry paused during the outage leaves zkbeat_entries_overdue
    ("a paused entry never counts") at once, not when the outage ends."""
    from zkbeat.ledger import controls

    port = free_port()
    dead = f"redis://127.0.0.1:{free_port()}/0"
    scheduler = Scheduler(_app(zk_server.hosts, dead, zk_root, port))
    try:
        lead(scheduler)
        wait_for(
            lambda: scheduler.tick() is not None and value(scrape(port), "zkbeat_entries_overdue") >= 1, timeout=30
        )
        controls.pause(zk_client, zk_root, "tidy", "operator", scheduled=True, force=True)
        for _ in range(3):
            scheduler.tick()
        assert value(scrape(port), "zkbeat_entries_overdue") == 0, "a paused entry counts as overdue"
    finally:
        scheduler.close()


def test_a_replica_that_refuses_to_lead_says_so(
    zk_server: ZooKeeperServer, redis_server: RedisServer, zk_root: str, zk_client: KazooClient
) -> None:
    """A replica that finds a newer zkbeat layout in its root refuses to lead, and zkbeat_refusing_to_lead is 1."""
    zk_client.ensure_path(f"{zk_root}/v9")
    port = free_port()
    scheduler = Scheduler(_app(zk_server.hosts, redis_server.url, zk_root, port))
    try:
        lead(scheduler)
        wait_for(
            lambda: scheduler.tick() is not None and value(scrape(port), "zkbeat_refusing_to_lead") == 1, timeout=20
        )
        assert scheduler.metrics.last_publish is None
    finally:
        scheduler.close()

"""The dashboard's pause and run-now buttons go through the same checks as ``zkbeat pause`` and ``trigger``:
in front of replicas of the previous release (layout 1) they refuse with 409, naming each replica and its
version, and write nothing; an entry of the app's schedule that has never run can be paused and resumed."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from kazoo.client import KazooClient

from tests.support.browser import Dashboard, http
from tests.support.helpers import wait_for
from tests.support.processes import Cluster
from tests.test_controls_upgrade import previous_release  # noqa: F401 - the fixture
from tests.test_dashboard import SECRET, start  # noqa: F401 - the fixture
from tests.test_layout_guard import SCHEDULE, old_cluster  # noqa: F401 - the fixture
from zkbeat.ledger.store import Ledger, decode_state

pytestmark = pytest.mark.processes


@pytest.fixture
def old_dashboard(old_cluster: Cluster, tmp_path: Path) -> Iterator[Dashboard]:  # noqa: F811 - the fixture
    dashboard = Dashboard(dict(old_cluster.env), tmp_path, secret=SECRET)

    def serving() -> bool:
        assert dashboard.alive, dashboard.log()
        try:
            return http(f"{dashboard.url}/api/state")[0] == 200
        except OSError:
            return False

    wait_for(serving, timeout=60, message=dashboard.log)  # a start on a loaded machine
    yield dashboard
    dashboard.stop()


def test_the_buttons_refuse_in_front_of_layout_1_replicas_and_write_nothing(
    old_cluster: Cluster,  # noqa: F811 - the fixture
    old_dashboard: Dashboard,
    zk_client: KazooClient,
    zk_root: str,
) -> None:
    """Pause and run now answer 409 naming every replica in line with its version and layout; no marker,
    no request is written, and every entry keeps publishing."""
    for action, fields in (("pause", {"entry": "entry-0", "note": "upgrade"}), ("run", {"entry": "entry-1"})):
        status, body = old_dashboard.post(action, fields, secret=SECRET)
        assert status == 409, (action, status, body)
        for replica in old_cluster.replicas:
            assert f"{replica.identity} (zkbeat 0.1.0, layout 1)" in body["error"], body
        assert f"{zk_root}/v2" in body["error"]
    assert zk_client.exists(f"{zk_root}/v2") is None
    assert zk_client.exists(f"{zk_root}/v1/triggers") is None
    moment = time.time()
    wait_for(lambda: {p.entry for p in old_cluster.publishes() if p.at > moment + 2} == set(SCHEDULE), timeout=30,
             message=old_cluster.logs)  # fmt: skip
    assert "refusing to lead" not in old_cluster.logs()


def test_an_entry_that_never_ran_can_be_paused_and_resumed_from_the_dashboard(
    start: Callable[..., tuple[Cluster, Dashboard]],  # noqa: F811 - the fixture
    zk_client: KazooClient,
) -> None:
    """Entry "hourly" (in the schedule, never run: no ledger state) is paused as `zkbeat pause` does, then resumed."""
    cluster, dashboard = start()
    path = Ledger(zk_client, cluster.root).entry_path("hourly")
    assert zk_client.exists(path) is None, "the entry has run already: the test proves nothing"
    status, body = dashboard.post("pause", {"entry": "hourly", "note": "not yet"}, secret=SECRET)
    assert status == 200 and body["changed"] is True, (status, body)
    state = decode_state(zk_client.get(path)[0])
    assert state.paused is not None and state.paused.note == "not yet"
    status, body = dashboard.post("resume", {"entry": "hourly"}, secret=SECRET)
    assert status == 200 and body["changed"] is True, (status, body)
    assert decode_state(zk_client.get(path)[0]).paused is None
    assert [p for p in cluster.publishes() if p.entry == "hourly"] == []

"""A run-now request while zkbeat.DatabaseScheduler's read of the schedule
failed (in-process, real PostgreSQL, ZooKeeper and Redis; the database made
unreachable for real): the leader keeps it pending, saying why, and runs it
once the read succeeds; it never refuses a request for an entry it only
failed to read."""

from __future__ import annotations

from kazoo.client import KazooClient

from tests.support.djangosupport import ON_THE_DATABASE, database_unreachable, interval_task, pump
from tests.support.helpers import Published, lead
from zkbeat.leading import term as term_module
from zkbeat.ledger import controls

pytestmark = ON_THE_DATABASE


def test_a_request_waits_while_the_schedule_failed_to_load_and_runs_once_it_loads(
    make_scheduler, zk_client: KazooClient, zk_root: str, published: Published, monkeypatch
) -> None:
    """The database is unreachable at takeover: the request (older than any patience) stays pending with a
    note; once the database answers it runs exactly once."""
    interval_task("canary", 3600)
    monkeypatch.setattr(term_module, "UNKNOWN_ENTRY_PATIENCE", 0.0)
    scheduler = make_scheduler()
    with database_unreachable():
        lead(scheduler)
        request = controls.request_trigger(zk_client, zk_root, "canary", "ops@bastion", scheduled=True)
        name = request.rsplit("/", 1)[1]
        outcome = held(scheduler, zk_client, zk_root, name, "canary")
        assert outcome["state"] == "pending" and "kept until a leader's schedule has it" in outcome["held"]["why"]
        for _ in range(5):
            scheduler.tick()
        assert zk_client.exists(request) is not None, "a request was dropped while the schedule could not be read"

    pump(scheduler, lambda: any(h.get("zkbeat-manual") == name for h in published.headers))
    for _ in range(5):
        scheduler.tick()
    assert [h.get("zkbeat-manual") for h in published.headers if h.get("zkbeat-manual")] == [name]


def test_a_request_for_a_task_added_while_the_database_is_down_waits_for_it(
    make_scheduler, zk_client: KazooClient, zk_root: str, published: Published, monkeypatch
) -> None:
    """The schedule loaded, then a task was added and the database went away before the leader read it: a
    request for that task is kept pending ("not loaded"), never refused, and runs once the read succeeds."""
    interval_task("steady", 3600)
    monkeypatch.setattr(term_module, "UNKNOWN_ENTRY_PATIENCE", 0.0)
    scheduler = make_scheduler()
    lead(scheduler)
    pump(scheduler, lambda: "steady" in scheduler.schedule)
    interval_task("canary", 3600)
    with database_unreachable():
        request = controls.request_trigger(zk_client, zk_root, "canary", "ops@bastion", scheduled=True)
        name = request.rsplit("/", 1)[1]
        outcome = held(scheduler, zk_client, zk_root, name, "canary")
        assert outcome["state"] == "pending" and "not loaded" in outcome["held"]["why"], outcome
        for _ in range(5):
            scheduler.tick()
        assert zk_client.exists(request) is not None, "a request was dropped while the schedule could not be read"
        assert scheduler.leading

    pump(scheduler, lambda: any(h.get("zkbeat-manual") == name for h in published.headers))
    for _ in range(5):
        scheduler.tick()
    assert [h.get("zkbeat-manual") for h in published.headers if h.get("zkbeat-manual")] == [name]


def held(scheduler, zk_client: KazooClient, zk_root: str, name: str, entry: str) -> dict:
    """Tick until the request's outcome says why it is held; that outcome."""
    return pump(scheduler, lambda: (o := controls.request_outcome(zk_client, zk_root, name, entry))
                .get("held") and o)  # fmt: skip

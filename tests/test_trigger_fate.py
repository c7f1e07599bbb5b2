"""What a leader does with a run-now request it cannot run, in-process against
real ZooKeeper and Redis: a request for an entry its schedule lacks waits
(with a note saying why) and is refused with a reason only after
UNKNOWN_ENTRY_PATIENCE, never while the schedule is empty; a trigger inbox
zkbeat may not list stops no scheduled entry."""

from __future__ import annotations

import logging

from kazoo.client import KazooClient
from kazoo.security import OPEN_ACL_UNSAFE, make_digest_acl

from tests.support.helpers import Published, every, lead, wait_for
from zkbeat.leading import term as term_module
from zkbeat.ledger import controls


def pump(scheduler, until, timeout: float = 15, message=None):
    """Run the scheduler's loop until ``until()`` holds."""

    def step():
        scheduler.tick()
        return until()

    return wait_for(step, timeout=timeout, interval=0.02, message=message)


def held_note(client: KazooClient, root: str, name: str, entry: str) -> dict | None:
    outcome = controls.request_outcome(client, root, name, entry)
    assert outcome["state"] == "pending", outcome
    return outcome.get("held")


def test_a_request_for_an_entry_the_leader_lacks_waits_then_is_refused_with_its_reason(
    make_scheduler, zk_client: KazooClient, zk_root: str, published: Published, monkeypatch
) -> None:
    """Mid-rollout (the entry is not in this leader's beat_schedule): pending with a note, then refused with a
    receipt that says why, and never published."""
    scheduler = make_scheduler({"tidy": every(0.2)})
    lead(scheduler)
    pump(scheduler, lambda: published.count("tidy") >= 1)
    request = controls.request_trigger(zk_client, zk_root, "coming-soon", "ops@bastion", scheduled=True)
    name = request.rsplit("/", 1)[1]
    note = pump(scheduler, lambda: held_note(zk_client, zk_root, name, "coming-soon"))
    assert "not in this leader's schedule" in note["why"] and "then refused" in note["why"], note
    assert note["epoch"] == scheduler.election.epoch and note["by"] == scheduler.zk_settings.identity
    count = published.count("tidy")
    pump(scheduler, lambda: published.count("tidy") >= count + 3)
    assert zk_client.exists(request) is not None, "the request was dropped before its patience ran out"

    monkeypatch.setattr(term_module, "UNKNOWN_ENTRY_PATIENCE", 0.0)  # the request is now older than that
    outcome = pump(scheduler, lambda: (o := controls.request_outcome(zk_client, zk_root, name, "coming-soon"))
                   ["state"] != "pending" and o)  # fmt: skip
    assert outcome["state"] == "refused", outcome
    assert "'coming-soon' is not in the leader's schedule" in outcome["reason"]
    assert zk_client.exists(request) is None
    assert published.count("coming-soon") == 0


def test_an_empty_schedule_keeps_every_request_for_a_leader_that_has_the_entry(
    make_scheduler, zk_client: KazooClient, zk_root: str, published: Published, monkeypatch
) -> None:
    """A leader with no entries at all never refuses a request (however old); the next leader that has the
    entry runs it once."""
    monkeypatch.setattr(term_module, "UNKNOWN_ENTRY_PATIENCE", 0.0)
    empty = make_scheduler({}, identity="empty")
    lead(empty)
    request = controls.request_trigger(zk_client, zk_root, "tidy", "ops@bastion", scheduled=True)
    name = request.rsplit("/", 1)[1]
    note = pump(empty, lambda: held_note(zk_client, zk_root, name, "tidy"))
    assert "schedule is empty" in note["why"], note
    for _ in range(5):
        empty.tick()
    assert zk_client.exists(request) is not None

    full = make_scheduler({"tidy": every(3600)}, identity="full")
    empty.close()
    pump(full, lambda: any(h.get("zkbeat-manual") == name for h in published.headers))
    for _ in range(5):
        full.tick()
    assert [h.get("zkbeat-manual") for h in published.headers] == [name]
    assert controls.request_outcome(zk_client, zk_root, name, "tidy")["state"] == "published"


def test_a_trigger_inbox_zkbeat_may_not_list_stops_no_entry(
    make_scheduler, zk_server, zk_root: str, published: Published, caplog
) -> None:
    """<root>/v1/triggers made first by another ZooKeeper user, readable by it alone: logged once; the schedule runs."""
    stranger = KazooClient(zk_server.hosts, auth_data=[("digest", "stranger:pw")])
    stranger.start(timeout=15)
    try:
        stranger.ensure_path(f"{zk_root}/v1")
        stranger.create(f"{zk_root}/v1/triggers", b"", acl=[make_digest_acl("stranger", "pw", all=True)])
        scheduler = make_scheduler({"tidy": every(0.2)})
        lead(scheduler)
        with caplog.at_level(logging.INFO, logger="zkbeat"):
            pump(scheduler, lambda: published.count("tidy") >= 5)
        lines = [r.getMessage() for r in caplog.records if "may not list the run-now requests" in r.getMessage()]
        assert len(lines) == 1 and f"{zk_root}/v1/triggers" in lines[0]
        assert scheduler.election.is_leader
        assert not [r for r in caplog.records if "stepping down" in r.getMessage()]
    finally:
        stranger.stop()
        stranger.close()


def test_a_trigger_inbox_it_may_not_list_is_tried_again_and_requests_run_once_granted(
    make_scheduler, zk_server, zk_client: KazooClient, zk_root: str, published: Published, caplog, monkeypatch
) -> None:
    """The leader lists a denied triggers/ again every DENIED_RECHECK seconds (30, as documented; shortened here):
    once its owner grants access, a request made there runs, once, without a restart or a new leader."""
    assert controls.DENIED_RECHECK == 30.0
    monkeypatch.setattr(controls, "DENIED_RECHECK", 0.5)
    stranger = KazooClient(zk_server.hosts, auth_data=[("digest", "stranger:pw")])
    stranger.start(timeout=15)
    try:
        stranger.ensure_path(f"{zk_root}/v1")
        triggers = stranger.create(f"{zk_root}/v1/triggers", b"", acl=[make_digest_acl("stranger", "pw", all=True)])
        scheduler = make_scheduler({"tidy": every(0.2), "later": every(3600)})
        lead(scheduler)
        epoch = scheduler.election.epoch
        with caplog.at_level(logging.INFO, logger="zkbeat"):
            pump(scheduler, lambda: published.count("tidy") >= 3)
            stranger.set_acls(triggers, OPEN_ACL_UNSAFE)
            request = controls.request_trigger(zk_client, zk_root, "later", "ops@bastion", scheduled=True)
            pump(scheduler, lambda: published.count("later") >= 1, message=lambda: caplog.text)
            count = published.count("tidy")
            pump(scheduler, lambda: published.count("tidy") >= count + 5)
        assert published.count("later") == 1
        assert [h.get("zkbeat-manual") for h in published.headers if h["zkbeat-entry"] == "later"] == [
            request.rsplit("/", 1)[1]
        ]
        lines = [r.getMessage() for r in caplog.records if "may not list the run-now requests" in r.getMessage()]
        assert len(lines) == 1, lines
        assert scheduler.election.epoch == epoch, "the request ran under another leader"
    finally:
        stranger.stop()
        stranger.close()

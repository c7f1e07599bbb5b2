"""A pass claims its ticks in parts, the next part's claim on its way while this part's messages go out.

Whatever happens to a part (ZooKeeper fences it, a signal cuts the pass
short while the next part's claim is in flight, the broker goes away), no
tick is published twice, none is lost, and a part after one that failed is
never claimed.
"""

from __future__ import annotations

import inspect
import sys
from datetime import datetime, timedelta, timezone

import pytest
from celery.signals import before_task_publish
from kazoo.exceptions import ConnectionLoss

from tests.support.helpers import Published, every, intercept_claims, lead, stop_intercepting, wait_for
from tests.support.signals import Terminated
from zkbeat.leading import publisher as publisher_module
from zkbeat.leading import term as term_module
from zkbeat.leading.heap_pass import MAX_BATCH
from zkbeat.ledger import clock
from zkbeat.ledger.store import Claim, EntryState, Ledger
from zkbeat.ops.metrics import Metrics

PART = 4
NAMES = [f"e{i}" for i in range(10)]  # parts of 4, 4 and 2


@pytest.fixture
def due_at_once(monkeypatch: pytest.MonkeyPatch) -> dict:
    """Ten hourly entries, all due now; a pass claims them in parts of four."""
    monkeypatch.setattr(term_module, "CLAIM_PART", PART)
    long_ago = datetime.now(timezone.utc) - timedelta(hours=2)
    return {name: every(3600, last_run_at=long_ago) for name in NAMES}


def leader_of(make_scheduler, schedule: dict):
    """A replica of ``schedule``, once it leads."""
    scheduler = make_scheduler(schedule)
    lead(scheduler)
    return scheduler


def claims_sent(ledger, monkeypatch: pytest.MonkeyPatch) -> list:
    """Record each claim as it is sent to ZooKeeper (the names in it) in the list returned, as ("claim", names)."""
    events: list = []
    real = ledger.start_claim

    def start_claim(claims, fence):
        events.append(("claim", [claim.name for claim in claims]))
        return real(claims, fence)

    monkeypatch.setattr(ledger, "start_claim", start_claim)
    return events


def versions(zk_client, ledger, names: list[str]) -> dict[str, int | None]:
    found = {}
    for name in names:
        stat = zk_client.exists(ledger.entry_path(name))
        found[name] = None if stat is None else stat.version
    return found


def once_each(published: Published) -> None:
    """Every entry published exactly once."""
    assert sorted(published.entries()) == NAMES, f"published: {sorted(published.entries())}"


def the_next_leader_publishes_the_rest_once(make_scheduler, schedule: dict, published: Published) -> None:
    """A second replica leads (the first was closed) and publishes what is left: every entry once in all."""
    second = make_scheduler(schedule, identity="second")
    lead(second)
    wait_for(lambda: second.tick() is not None and len(published.headers) >= len(NAMES), timeout=15)
    once_each(published)


def test_the_next_part_is_claimed_before_this_part_is_published(
    make_scheduler, published: Published, due_at_once: dict, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Claim of part two sent, then part one's messages: the publishes do not wait for ZooKeeper's next answer."""
    scheduler = leader_of(make_scheduler, due_at_once)
    events = claims_sent(scheduler.ledger, monkeypatch)

    def on_publish(headers=None, **kwargs) -> None:
        events.append(("publish", (headers or {}).get("zkbeat-entry")))

    before_task_publish.connect(on_publish, weak=False)
    try:
        wait_for(lambda: scheduler.tick() is not None and len(published.headers) >= len(NAMES), timeout=15)
    finally:
        before_task_publish.disconnect(on_publish)
    once_each(published)
    claims = [names for kind, names in events if kind == "claim"]
    assert [len(names) for names in claims] == [4, 4, 2], claims
    first_publish = next(index for index, (kind, _) in enumerate(events) if kind == "publish")
    second_claim = [index for index, (kind, _) in enumerate(events) if kind == "claim"][1]
    assert second_claim < first_publish, f"part two was claimed only after part one went out: {events}"
    assert [name for kind, name in events[first_publish : first_publish + 4] if kind == "publish"] == claims[0]
    # Part three is sent only once part one's messages are out: one part claimed ahead, never two (at most 500 at risk).
    third_claim = [index for index, (kind, _) in enumerate(events) if kind == "claim"][2]
    last_of_part_one = max(
        index for index, (kind, name) in enumerate(events) if kind == "publish" and name in claims[0]
    )
    assert last_of_part_one < third_claim, f"part three was claimed before part one went out: {events}"


def test_a_part_fenced_off_stops_the_pass_and_the_next_leader_publishes_the_rest_once(
    make_scheduler, published: Published, due_at_once: dict, zk_client, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Leadership lost between parts: part one goes out, part two is refused, part three is never claimed."""
    first = leader_of(make_scheduler, due_at_once)
    ledger = first.ledger
    sent: list[list[str]] = []

    def claim(claims, fence):
        sent.append([c.name for c in claims])
        if len(sent) == 2:
            zk_client.delete(fence)  # this replica's candidate: it leads no more
        return real(claims, fence)

    real = intercept_claims(ledger, monkeypatch, claim)
    wait_for(lambda: first.tick() is not None and len(sent) >= 2, timeout=15)
    assert sorted(published.entries()) == sorted(sent[0]), "part one was not published (alone)"
    assert len(sent) == 2, f"a part after the fenced one was claimed: {sent}"
    untouched = [name for name in NAMES if name not in sent[0] and name not in sent[1]]
    assert versions(zk_client, ledger, untouched) == dict.fromkeys(untouched), "part three's entries were written"
    assert versions(zk_client, ledger, sent[1]) == dict.fromkeys(sent[1]), "the fenced part left writes behind"
    first.close()

    the_next_leader_publishes_the_rest_once(make_scheduler, due_at_once, published)


def test_a_signal_while_the_next_part_is_claimed_leaves_nothing_lost_or_twice(
    make_scheduler, published: Published, due_at_once: dict, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SIGTERM (past its hold limit) as part one went out, part two's claim on its way: close() writes part two back."""
    first = leader_of(make_scheduler, due_at_once)
    events = claims_sent(first.ledger, monkeypatch)
    real_publish_many = publisher_module.Publisher.publish_many

    def publish_then_terminated(self, sends, producer, writing):
        real_publish_many(self, sends, producer, writing)
        raise Terminated  # what beat's SIGTERM handler raises once the hold limit is past

    monkeypatch.setattr(publisher_module.Publisher, "publish_many", publish_then_terminated)
    with pytest.raises(Terminated):
        wait_for(lambda: first.tick() is not None and False, timeout=15)
    claims = [names for kind, names in events if kind == "claim"]
    assert [len(names) for names in claims] == [4, 4], claims
    assert sorted(published.entries()) == sorted(claims[0])
    in_flight = claims[1]
    # Part two's claim was on its way when the signal came: it committed, and is pending. Read
    # through the leader's own session: ZooKeeper answers a session's requests in the order it
    # sent them, so this read comes after that claim (another session may read before it lands).
    landed = versions(first.ledger.client, first.ledger, in_flight)
    assert landed == dict.fromkeys(in_flight, 0), landed
    assert first.term is not None and sorted(first.term.pending) == sorted(in_flight)
    monkeypatch.setattr(publisher_module.Publisher, "publish_many", real_publish_many)
    first.close()  # writes part two back: its ticks stay due

    the_next_leader_publishes_the_rest_once(make_scheduler, due_at_once, published)


def test_a_broker_gone_at_a_part_leaves_the_parts_after_the_next_unclaimed_and_publishes_all_once_it_is_back(
    make_scheduler, published: Published, due_at_once: dict, zk_client, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The broker fails part one: it and part two (claimed meanwhile) are written back, part three never claimed."""
    scheduler = leader_of(make_scheduler, due_at_once)
    events = claims_sent(scheduler.ledger, monkeypatch)
    real_publish_many = publisher_module.Publisher.publish_many
    calls: list[int] = []

    def broker_gone(self, sends, producer, writing):
        calls.append(len(sends))
        self.broker_down = True  # what a send that finds the broker gone leaves behind
        return [False] * len(sends)

    monkeypatch.setattr(publisher_module.Publisher, "publish_many", broker_gone)
    wait_for(lambda: scheduler.tick() is not None and len(calls) >= 1, timeout=15)
    claims = [names for kind, names in events if kind == "claim"]
    first, second = claims[0], claims[1]
    assert [len(first), len(second)] == [4, 4], claims
    third = [name for name in NAMES if name not in first and name not in second]
    # after the two parts, only their write-back: never part three
    assert all(set(names) <= set(first) | set(second) for names in claims[2:]), f"part three was claimed: {claims}"
    assert versions(zk_client, scheduler.ledger, third) == dict.fromkeys(third)
    assert published.headers == []
    assert scheduler.term is not None and scheduler.term.pending == {}, "the claimed parts were not written back"

    monkeypatch.setattr(publisher_module.Publisher, "publish_many", real_publish_many)
    wait_for(lambda: scheduler.tick() is not None and len(published.headers) >= len(NAMES), timeout=15)
    once_each(published)


def test_a_signal_just_after_a_parts_answer_leaves_its_ticks_pending_not_lost(
    make_scheduler, published: Published, due_at_once: dict, zk_client, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SIGTERM (past its hold limit) the moment part one's answer is in, before the pass notes what committed.

    Beat's handler raises between any two lines of the loop. Part one
    committed: its ticks are pending (close() writes them back), never
    recorded as run and left unpublished.
    """
    first = leader_of(make_scheduler, due_at_once)
    code = term_module.Term._claim_and_publish.__code__
    source, start = inspect.getsourcelines(term_module.Term._claim_and_publish)
    line = start + next(i for i, text in enumerate(source) if "result.committed.update(part_result.committed)" in text)
    fired: list[int] = []

    def local(frame, event, arg):
        if event == "line" and frame.f_lineno == line and not fired:
            fired.append(line)
            raise Terminated  # what beat's SIGTERM handler raises once the hold limit is past
        return local

    def calls(frame, event, arg):
        return local if frame.f_code is code else None

    sys.settrace(calls)
    try:
        with pytest.raises(Terminated):
            wait_for(lambda: first.tick() is not None and False, timeout=15)
    finally:
        sys.settrace(None)
    assert fired and published.headers == []
    claimed = [name for name, version in versions(zk_client, first.ledger, NAMES).items() if version is not None]
    assert claimed, "part one's claim did not commit"
    assert first.term is not None and set(claimed) <= set(first.term.pending), (
        f"committed but neither published nor pending: {sorted(set(claimed) - set(first.term.pending))}"
    )
    first.close()

    the_next_leader_publishes_the_rest_once(make_scheduler, due_at_once, published)


def test_the_clock_offset_is_not_measured_across_the_sends_of_the_part_before(
    make_scheduler, published: Published, zk_client, zk_root: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A part's answer read only after the part before went out does not count the sends as clock skew.

    The leader measures its clock against ZooKeeper's from each claim's
    commit time and its clock when it reads the answer. Part two's answer
    is read after part one's messages went out, which here take 30 s by
    this replica's clock (shifted, so the test waits for nothing); the
    offset must not grow by them: it decides which ledger times are trusted
    and estimates ZooKeeper's time of a claim that only created znodes.
    """
    monkeypatch.setattr(term_module, "CLAIM_PART", PART)
    names = NAMES[: 2 * PART]  # two parts
    long_ago = datetime.now(timezone.utc) - timedelta(hours=2)
    ledger = Ledger(zk_client, zk_root)
    ledger.ensure()
    # Known to the ledger already: the claims write over them, and ZooKeeper's answer carries its time.
    assert ledger.claim([Claim(name, EntryState(last_run_at=long_ago)) for name in names], None).error is None
    scheduler = make_scheduler({name: every(3600, last_run_at=long_ago) for name in names})
    lead(scheduler)
    shift = [0.0]

    class Shifted(datetime):
        @classmethod
        def now(cls, tz=None):  # type: ignore[override]
            return datetime.now(tz) + timedelta(seconds=shift[0])

    monkeypatch.setattr(term_module, "datetime", Shifted)
    real_publish_many = publisher_module.Publisher.publish_many

    def slow_sends(self, sends, producer, writing):
        sent = real_publish_many(self, sends, producer, writing)
        shift[0] += 30.0  # the sends of this part took 30 s
        return sent

    monkeypatch.setattr(publisher_module.Publisher, "publish_many", slow_sends)
    wait_for(lambda: scheduler.tick() is not None and len(published.headers) >= len(names), timeout=15)
    assert sorted(published.entries()) == names
    term = scheduler.term
    assert term is not None
    assert abs(term.clock_offset) < clock.LEDGER_TOLERANCE, f"measured offset {term.clock_offset:.1f}s"


def test_the_fenced_claims_counted_are_the_failed_part_s_not_the_parts_never_sent(
    make_scheduler, published: Published, due_at_once: dict, zk_client, monkeypatch: pytest.MonkeyPatch
) -> None:
    """zkbeat_claims_total: part one counted committed, part two (fenced) fenced, part three (never sent) nowhere.

    As the CHANGELOG says: the claims of the part that failed, not the ticks after it.
    """
    first = leader_of(make_scheduler, due_at_once)
    counted: list[tuple[str, int]] = []
    real_claims = Metrics.claims

    def claims(self, result: str, count: int = 1) -> None:
        counted.append((result, count))
        real_claims(self, result, count)

    monkeypatch.setattr(Metrics, "claims", claims)
    sent: list[list[str]] = []

    def claim(claims, fence):
        sent.append([c.name for c in claims])
        if len(sent) == 2:
            zk_client.delete(fence)
        return real(claims, fence)

    real = intercept_claims(first.ledger, monkeypatch, claim)
    wait_for(lambda: first.tick() is not None and len(sent) >= 2, timeout=15)
    assert [len(names) for names in sent] == [PART, PART], sent
    totals: dict[str, int] = {}
    for result, count in counted:
        totals[result] = totals.get(result, 0) + count
    assert totals == {"committed": PART, "fenced": PART}, counted


def test_a_part_that_conflicts_stops_the_parts_after_it_and_each_entry_is_published_once(
    make_scheduler, published: Published, due_at_once: dict, zk_client, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Someone writes an entry of part two while part one goes out: part two conflicts, part three is not claimed
    in that pass, and the next passes publish parts two and three, each entry once."""
    scheduler = leader_of(make_scheduler, due_at_once)
    ledger = scheduler.ledger
    sent: list[list[str]] = []

    def claim(claims, fence):
        sent.append([c.name for c in claims])
        if len(sent) == 2:  # a stranger's write: same data, a new version
            path = ledger.entry_path(claims[0].name)
            data, _ = zk_client.get(path) if zk_client.exists(path) else (b"", None)
            if data:
                zk_client.set(path, data)
            else:
                zk_client.create(path, b"", makepath=True)
        return real(claims, fence)

    real = intercept_claims(ledger, monkeypatch, claim)
    wait_for(lambda: scheduler.tick() is not None and len(sent) >= 2, timeout=15)
    assert sorted(published.entries()) == sorted(sent[0]), "only part one goes out in the pass that conflicted"
    third = [name for name in NAMES if name not in sent[0] and name not in sent[1]]
    assert versions(zk_client, ledger, third) == dict.fromkeys(third), "part three was claimed after a conflict"
    wait_for(lambda: scheduler.tick() is not None and len(published.headers) >= len(NAMES), timeout=15)
    once_each(published)


def test_a_part_whose_reply_is_lost_stops_the_parts_after_it_and_each_entry_is_published_once(
    make_scheduler, published: Published, due_at_once: dict, zk_client, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Part two commits but its reply is lost: part three is not claimed in that pass, and the leader (its term
    begun again) settles part two against the ledger and publishes every entry once, none twice."""
    scheduler = leader_of(make_scheduler, due_at_once)
    ledger = scheduler.ledger
    sent: list[list[str]] = []

    def claim(claims, fence):
        sent.append([c.name for c in claims])
        result = real(claims, fence)
        if len(sent) == 2:
            stop_intercepting(ledger, monkeypatch)
            raise ConnectionLoss("reply lost")
        return result

    real = intercept_claims(ledger, monkeypatch, claim)
    wait_for(lambda: scheduler.tick() is not None and len(sent) >= 2, timeout=15)
    assert sorted(published.entries()) == sorted(sent[0])
    assert all(version == 0 for version in versions(zk_client, ledger, sent[1]).values()), "part two did not commit"
    third = [name for name in NAMES if name not in sent[0] and name not in sent[1]]
    assert versions(zk_client, ledger, third) == dict.fromkeys(third), "part three was claimed after a lost reply"
    wait_for(lambda: scheduler.tick() is not None and len(published.headers) >= len(NAMES), timeout=20)
    once_each(published)


def test_a_pass_takes_at_most_max_batch_due_entries_and_comes_straight_back_for_the_rest(
    make_scheduler, published: Published
) -> None:
    """README and guarantees.md: "a batch is at most 1,000 entries due together" (MAX_BATCH), the bound of what a
    kill -9 mid-batch can cost. 1,200 entries due at once: one pass publishes 1,000 and asks beat to come straight
    back (a wait of 0), the next the other 200; every entry once."""
    long_ago = datetime.now(timezone.utc) - timedelta(hours=2)
    names = [f"b{i:04d}" for i in range(MAX_BATCH + 200)]
    scheduler = leader_of(make_scheduler, {name: every(3600, last_run_at=long_ago) for name in names})
    passes: list[tuple[int, float | None]] = []

    def all_sent() -> bool:
        before = len(published.headers)
        wait = scheduler.tick()
        if len(published.headers) > before:
            passes.append((len(published.headers) - before, wait))
        return len(published.headers) >= len(names)

    wait_for(all_sent, timeout=120, message=lambda: f"passes so far: {passes}")
    assert [count for count, _ in passes] == [MAX_BATCH, 200], passes
    assert passes[0][1] == 0, "a full batch must bring beat straight back for the rest"
    assert sorted(published.entries()) == names

"""Small helpers shared by tests.  Tests poll for conditions; they never sleep."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection, Iterator
from contextlib import contextmanager
from datetime import timedelta
from functools import partial
from typing import Any, TypeVar

from celery.signals import after_task_publish

from zkbeat.coordination.shards import shard_of
from zkbeat.ledger.store import ClaimInFlight

T = TypeVar("T")


def wait_for(
    predicate: Callable[[], T],
    timeout: float = 10,
    interval: float = 0.02,
    message: str | Callable[[], str] | None = None,
    *,
    raise_on_timeout: bool = True,
) -> T | None:
    """Poll ``predicate`` until it returns something truthy, and return that.

    Raises AssertionError with ``message`` (a string, or a callable evaluated
    at failure time so it can describe the latest state) after ``timeout``
    seconds.  Exceptions raised by the predicate propagate immediately.
    With ``raise_on_timeout=False`` it returns None at the deadline instead:
    the bench records a trial that timed out rather than failing the run.
    """
    deadline = time.monotonic() + timeout
    while True:
        result = predicate()
        if result:
            return result
        if time.monotonic() >= deadline:
            if not raise_on_timeout:
                return None
            text = message() if callable(message) else message
            what = text or getattr(predicate, "__name__", repr(predicate))
            raise AssertionError(f"timed out after {timeout}s: {what}")
        time.sleep(interval)


def every(seconds: float, *args: Any, options: dict | None = None, **fields: Any) -> dict:
    """A ``beat_schedule`` entry of the test task every ``seconds``.

    ``args`` are the task's arguments, ``options`` its message options (such
    as ``zkbeat_misfire_grace_time``), and any other field (``last_run_at``,
    ``kwargs``, ...) goes into the entry as given.
    """
    return {
        "task": "zkbeat.test",
        "schedule": timedelta(seconds=seconds),
        "args": args,
        "options": options or {},
        **fields,
    }


class Published:
    """Messages handed to the broker by this process (after_task_publish).

    ``headers`` holds each message's headers and ``args`` its positional
    arguments, in publish order; ``rows`` pairs them as (entry, slot, args).
    """

    def __init__(self) -> None:
        self.headers: list[dict] = []
        self.args: list[list] = []
        after_task_publish.connect(self._record, weak=False)

    def _record(self, headers=None, body=None, **kwargs) -> None:
        self.headers.append(dict(headers or {}))
        self.args.append(list(body[0]) if isinstance(body, (tuple, list)) and body else [])

    def entries(self) -> list[str]:
        return [h.get("zkbeat-entry") for h in self.headers]

    @property
    def rows(self) -> list[tuple[str, str, list]]:
        """(entry, slot, args) of every message, in publish order."""
        return [(h.get("zkbeat-entry"), h.get("zkbeat-slot"), a) for h, a in zip(self.headers, self.args)]

    def of(self, entry: str) -> list[tuple[str, str, list]]:
        return [row for row in self.rows if row[0] == entry]

    def count(self, entry: str) -> int:
        return self.entries().count(entry)

    def close(self) -> None:
        after_task_publish.disconnect(self._record)


def lead(scheduler: Any, timeout: float = 15) -> None:
    """Wait until an in-process zkbeat scheduler leads."""
    assert scheduler.election.wait_for_leadership(timeout=timeout), "never became leader"


def lead_until_published(
    scheduler: Any, published: Published, names: Collection[str], times: int = 1, timeout: float = 60
) -> None:
    """Wait until ``scheduler`` leads, then run its ticks until each of ``names`` was published ``times`` times."""
    lead(scheduler)
    wait_for(
        lambda: scheduler.tick() is not None and all(published.count(name) >= times for name in names),
        timeout=timeout,
        message=lambda: f"published fewer than {times} times: {sorted(n for n in names if published.count(n) < times)}",
    )


@contextmanager
def connected(signal: Any, receiver: Callable[..., Any]) -> Iterator[None]:
    """Run the block with ``receiver`` connected (strongly) to a Celery ``signal``, and disconnect it after."""
    signal.connect(receiver, weak=False)
    try:
        yield
    finally:
        signal.disconnect(receiver)


class _Answer:
    """A claim in flight whose answer is worked out when the leader waits for it (see :func:`intercept_claims`)."""

    def __init__(self, claims: Any, answer: Callable[[], Any]) -> None:
        self.claims = claims
        self._answer = answer

    def result(self) -> Any:
        return self._answer()


def intercept_claims(ledger: Any, monkeypatch: Any, claim: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
    """Answer every claim on ``ledger`` with ``claim(claims, fence)``; returns the real claim for it to call.

    A leader sends its claims with ``Ledger.start_claim`` and waits with
    ``result()`` (``Ledger.claim`` does both), so ``claim`` runs when the
    answer is waited for: it may write first, commit with the real claim,
    raise in place of the reply. ``monkeypatch.undo()`` or
    :func:`stop_intercepting` puts the ledger back.
    """

    def real(claims: Any, fence: Any) -> Any:
        return ClaimInFlight(ledger, claims, fence).result()

    monkeypatch.setattr(ledger, "start_claim", lambda claims, fence: _Answer(claims, lambda: claim(claims, fence)))
    return real


def stop_intercepting(ledger: Any, monkeypatch: Any) -> None:
    """Claims on ``ledger`` go to ZooKeeper as usual again (after :func:`intercept_claims`)."""
    monkeypatch.setattr(ledger, "start_claim", partial(ClaimInFlight, ledger))


def fail_next_claim(
    scheduler: Any, monkeypatch: Any, error: BaseException, commit: bool = True, tried: list | None = None
) -> list:
    """Make the scheduler's next claim raise ``error`` in place of its reply, after (or without) committing it.

    Returns the list the committed slots are put in; ``tried`` gets the
    claimed entries' names when the failure happens. Later claims run as usual.
    """
    ledger = scheduler.ledger
    committed: list = []

    def claim(claims: Any, fence: Any) -> Any:
        stop_intercepting(ledger, monkeypatch)
        if tried is not None:
            tried.extend(c.name for c in claims)
        if commit:
            result = real(claims, fence)
            committed.extend(c.state.slot for c in claims if c.name in result.committed)
        raise error

    real = intercept_claims(ledger, monkeypatch, claim)
    return committed


def names_in_every_shard(root: str, shards: int, per_shard: int = 1, prefix: str = "e") -> list[str]:
    """``per_shard`` entry names of each of ``shards`` shards under ``root`` (shard 0's first, then 1's, ...).

    Roots are random per test, so a fixed handful of names leaves some shard
    empty in a few runs of a hundred: a test that needs every shard asks for
    names that fill each.
    """
    found: dict[int, list[str]] = {k: [] for k in range(shards)}
    n = 0
    while any(len(names) < per_shard for names in found.values()):
        name = f"{prefix}{n}"
        names = found[shard_of(root, name, shards)]
        if len(names) < per_shard:
            names.append(name)
        n += 1
    return [name for k in range(shards) for name in found[k]]


class LogRecords(logging.Handler):
    """Keeps every record handed to it, at any level (add it to the loggers a test watches)."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def early_answers(
    scheduler: Any, published: Published, monkeypatch: Any, answer_takes: float = 0.0, publishes: int = 150
) -> list[tuple[str, float]]:
    """Run ``scheduler`` as beat runs it (a tick, then a sleep of what it returned) until ``publishes`` publishes;
    return the "not yet" answers of entries its passes took off the heap (name, wait). ``answer_takes``: each
    is_due answer takes that long, as a crontab's or a database row's does; the heap is built again under it."""
    early: list[tuple[str, float]] = []
    scanning = [False]
    asked = scheduler.ask
    scan = scheduler._scan

    def scan_counted(heap):
        scanning[0] = True
        try:
            return scan(heap)
        finally:
            scanning[0] = False

    def asked_counted(entry):
        answer = asked(entry)
        if answer_takes:
            time.sleep(answer_takes)
        if scanning[0] and not answer[0]:
            early.append((entry.name, answer[1]))
        return answer

    monkeypatch.setattr(scheduler, "_scan", scan_counted)
    monkeypatch.setattr(scheduler, "ask", asked_counted)
    if answer_takes:
        scheduler.invalidate_heap()  # built again under the slow answers: its first placements count too
    deadline = time.monotonic() + 30
    while len(published.headers) < publishes and time.monotonic() < deadline:
        time.sleep(min(scheduler.tick() or 0, 1.0))
    assert len(published.headers) >= publishes, "the entries were not published"
    return early

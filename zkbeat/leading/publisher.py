"""Handing claimed ticks to the broker: wait for it, send, and say what became of each send.

One per term. It keeps the broker's state for the term (``broker_down``:
once a send failed for want of the broker, the rest of a batch is not
tried) and decides for each failed send whether the tick stays due (nothing
was sent), counts as run though its message may not have arrived (it was
sent and no answer came: never sent again), or counts as run because the
broker can never take it (as celery beat does).
"""

from __future__ import annotations

import copy
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

import celery
from celery import beat

from ..ledger.controls import TriggerInbox, TriggerRequest
from ..ticking.ticks import manual_task_id, message_options
from .batch_publish import BatchSender, Send, can_batch, publish_many
from .broker import guard_retries, is_broker_error, may_have_arrived, wait_for_broker

if TYPE_CHECKING:
    from ..conf import Settings
    from .host import BeatBroker

__all__ = ["Publisher", "BROKER_WAIT", "MAYBE_ARRIVED"]

logger = logging.getLogger(__name__)

#: Longest a leader waits inside kombu's retry policy for the broker per pass
#: (bounded by beat's max interval), so beat's loop still turns while it is down.
BROKER_WAIT = 5.0
#: What the log says of a publish that got no answer.
MAYBE_ARRIVED = "may or may not have reached the broker"


#: Celery and kombu pass a message's ``confirm_timeout`` on from 5.5; before, it is ignored.
HAS_CONFIRM_TIMEOUT = tuple(celery.VERSION[:2]) >= (5, 5)
_warned_confirm_timeout: set[str] = set()


def _warn_confirm_timeout(name: str) -> None:
    if name in _warned_confirm_timeout:
        return
    _warned_confirm_timeout.add(name)
    logger.warning(
        "zkbeat: %s sets confirm_timeout, which Celery %s ignores (it takes effect from Celery 5.5): a publish "
        "whose confirm never comes waits until zkbeat_stall_timeout steps this replica down",
        name,
        celery.__version__,
    )


def _copy(entry: beat.ScheduleEntry) -> beat.ScheduleEntry:
    """A shallow copy of ``entry`` to send with its own options; the live entry and its schedule untouched.

    ``copy.copy`` of Celery's ScheduleEntry goes through ``__reduce__``,
    which leaves out ``app``: the copy's ``__init__`` then sets the shared
    schedule object's app to None, and from then on the live entry reads
    ``current_app``'s clock and settings instead of beat's own app's.
    A class with its own ``__copy__`` (django-celery-beat's) knows best.
    """
    if hasattr(type(entry), "__copy__"):
        return copy.copy(entry)
    clone = object.__new__(type(entry))
    clone.__dict__.update(entry.__dict__)
    return clone


@dataclass
class Publisher:
    """The broker side of one term: see the module docstring."""

    #: Beat's way to the broker (zkbeat.leading.host).
    broker: BeatBroker
    settings: Settings
    #: zkbeat.ops.metrics.Metrics.
    metrics: Any
    #: Beat's longest wait: bounds the wait for the broker.
    max_interval: float
    epoch: int
    #: Run-now requests, to write each one's receipt for ``zkbeat trigger``.
    triggers: TriggerInbox | None = None
    broker_down: bool = False
    #: Monotonic start of the send or connection that found the broker unreachable,
    #: while it stays so (None while it answers): zkbeat.coordination.broker_handover counts from it.
    down_since: float | None = None
    #: Message shapes prepared for the Redis batch path (zkbeat.leading.batch_publish), kept for the term.
    batch: BatchSender | None = None

    @property
    def identity(self) -> str:
        return self.settings.identity

    def producer(self, waiting: int) -> Any:
        """Beat's producer once kombu has (re)connected to the broker; None if it is down.

        The wait runs under kombu's retry policy (zkbeat.leading.broker), at most
        BROKER_WAIT seconds per pass, before anything is claimed: ticks that
        come due meanwhile stay due, unclaimed, and go out once it is back.
        """
        broker = self.broker
        started = time.monotonic()
        error = wait_for_broker(broker.connection(), min(self.max_interval, BROKER_WAIT))
        producer = None
        if error is None:
            try:
                producer = broker.producer()
            except Exception as exc:  # noqa: BLE001 - a broker outage must not end beat
                error = exc
        if error is not None:
            if not self.broker_down:
                logger.error(
                    "zkbeat: broker unreachable (%r); %d due ticks wait, unclaimed, while kombu reconnects (%s)",
                    error,
                    waiting,
                    self.identity,
                )
            self._unreachable(started)
            broker.forget()
            return None
        if self.broker_down:
            logger.info("zkbeat: broker reachable again; publishing what came due (%s)", self.identity)
            self.broker_down = False
        self.down_since = None
        return producer

    def _unreachable(self, started: float) -> None:
        """The broker could not be reached by what began at ``started`` (monotonic)."""
        self.broker_down = True
        if self.down_since is None:
            self.down_since = started

    def publish(
        self, entry: beat.ScheduleEntry, slot: datetime, producer: Any, request: TriggerRequest | None = None
    ) -> bool:
        """Send one claimed tick. False only when the broker was unreachable and nothing was sent.

        Then the caller withdraws the claim and the tick stays due. A publish
        that failed while waiting for the broker's answer may have arrived:
        it counts as sent and is never sent again (at most once; the log
        names it). A message the broker can never take (a queue that does
        not exist, arguments that do not serialise, a refusal) is logged and
        the tick counts as run, as celery beat itself does: trying it again
        every second would fail the same way forever, and must not hold back
        the rest.
        """
        broker = self.broker
        started = time.monotonic()
        slot_text = slot.isoformat()
        manual = request.name if request is not None else None
        logger.info(
            "Scheduler: Sending %s task %s (%s) slot %s epoch %s",
            f"triggered ({manual} by {request.by})" if request is not None else "due",
            entry.name,
            entry.task,
            slot_text,
            self.epoch,
        )
        try:
            sending = _copy(entry)
            options = message_options(entry, self.settings.root, slot, self.epoch, manual)
            if "confirm_timeout" in options and not HAS_CONFIRM_TIMEOUT:
                _warn_confirm_timeout(entry.name)
            sending.options = guard_retries(options, producer.connection, broker.app.conf.task_publish_retry_policy)
            broker.apply_async(sending, producer=producer, advance=False)
        except Exception as exc:  # noqa: BLE001 - a broker error must not end beat
            if may_have_arrived(exc, broker.made_connection()):
                self.metrics.publish_uncertain()
                logger.error(
                    "zkbeat: the publish of %s (slot %s, task id %s) got no answer (%r): it %s, and is not "
                    "sent again (at most once); look for that task id in the queue or the worker's log",
                    entry.name,
                    slot_text,
                    options["task_id"],
                    exc,
                    MAYBE_ARRIVED,
                )
                self._unreachable(started)
                broker.forget()
                self.receipt(entry, request, uncertain=True)
                return True
            self.metrics.publish_error()
            if is_broker_error(exc, broker.made_connection()):
                logger.error("zkbeat: could not publish %s (slot %s): %r", entry.name, slot_text, exc)
                self._unreachable(started)
                broker.forget()
                return False
            logger.error(
                "zkbeat: %s (slot %s) cannot be sent and is dropped, as celery beat would: %r",
                entry.name,
                slot_text,
                exc,
            )
            return True
        self.metrics.published()
        self.receipt(entry, request)
        return True

    def publish_many(
        self, sends: list[Send], producer: Any, writing: Callable[[Sequence[int]], None]
    ) -> list[bool] | None:
        """Send claimed ticks together where the broker allows it (zkbeat.leading.batch_publish); None: one at a time.

        Each result means what :meth:`publish`'s does. ``writing(indices)``
        is told which sends may reach the broker from then on.
        """
        if not sends or not can_batch(self.broker.app, producer):
            return None
        if self.batch is None:
            self.batch = BatchSender(self.broker.app)
        return publish_many(self, self.batch, sends, producer, writing)

    def receipt(self, entry: beat.ScheduleEntry, request: TriggerRequest | None, uncertain: bool = False) -> None:
        """Tell a waiting ``zkbeat trigger`` that its run went out (or got no answer)."""
        if request is None or self.triggers is None:
            return
        task_id = manual_task_id(self.settings.root, entry.name, request.name)
        try:
            self.triggers.receipt(request, task_id, self.epoch, uncertain=uncertain)
        except Exception as exc:  # noqa: BLE001 - the run is out; only the receipt is missing
            logger.warning("zkbeat: %s was published but its receipt could not be written: %r", request.path, exc)

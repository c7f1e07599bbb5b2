"""What the admin shows of zkbeat for a page of periodic task rows: one batched read per page.

A page of the change list reads, for all its rows at once: their ledger
znodes (one multiRead, zkbeat.ledger.store.Ledger.load) and the election line (one
listing and pipelined gets, zkbeat.ops.status.read_election), to name the replica
behind each epoch while it is still in line. Nothing is read per row. The
next run is the one a leader would publish at (zkbeat.ops.dashboard.describe),
from the ledger's last run unless the row vouches for a newer one, as the
leader decides (zkbeat.contrib.django.keeps_own_run).

If ZooKeeper cannot be reached, or answers with an error, every row of the
page is unavailable (``Page.error``) and one warning is logged for the page.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from kazoo.exceptions import KazooException, ZookeeperError
from kazoo.handlers.threading import KazooTimeoutError

from ...coordination.layout import LAYOUT_DIR
from ...ledger.store import EntryState, Ledger
from ...ops.dashboard import describe
from ...ops.status import read_election
from .. import _rows
from ..django import ModelEntry, copy_row, keeps_own_run
from . import zookeeper

__all__ = ["RowView", "Page", "read_page", "ZOOKEEPER_ERRORS"]

logger = logging.getLogger(__name__)

#: What a failed read raises: each makes the page's zkbeat columns "unavailable".
ZOOKEEPER_ERRORS = (zookeeper.Unavailable, KazooException, ZookeeperError, KazooTimeoutError)


@dataclass
class RowView:
    """zkbeat's facts about one row (times are aware datetimes in UTC)."""

    name: str
    #: The ledger has a znode for the row, and zkbeat can read it.
    in_ledger: bool = False
    #: The ledger's znode holds data zkbeat cannot read.
    unreadable: bool = False
    state: EntryState | None = None
    #: Who led under the last run's epoch, if that replica is still in line.
    by: str | None = None
    #: The last run as zkbeat.ops.dashboard.describe.last_run says it (slot, published_at, epoch, kind, ...).
    last_run: dict[str, Any] | None = None
    #: When a leader would publish the row next (None: unknown, or it never will).
    next_at: datetime | None = None
    #: Why there is no next run ("disabled", "one-off ran", "unknown"), else None.
    no_next: str | None = None


@dataclass
class Page:
    """The rows of one page (name -> RowView), or ``error`` (and every row unavailable)."""

    rows: dict[str, RowView]
    error: str | None = None

    def get(self, name: str) -> RowView | None:
        return None if self.error else self.rows.get(name)


def read_page(models: list[Any]) -> Page:
    """zkbeat's view of ``models`` (PeriodicTask rows); never raises for ZooKeeper: see the module docstring."""
    try:
        found = zookeeper.settings()
        client = zookeeper.client(found)
        records = Ledger(client, found.root, timeout=found.session_timeout).load([m.name for m in models])
        owners = _owners(client, found.root)
    except ZOOKEEPER_ERRORS as exc:
        why = str(exc) or type(exc).__name__
        logger.warning("zkbeat admin: zkbeat's columns are unavailable on this page: %s", why)
        return Page(rows={}, error=why)
    app = zookeeper.celery_app()
    now = datetime.now(timezone.utc)
    rows = {}
    for model in models:
        record = records.get(model.name)
        view = RowView(name=model.name, in_ledger=record is not None and record.state is not None)
        view.unreadable = record is not None and record.state is None
        view.state = record.state if record is not None else None
        entry = _entry(model, app)
        if view.state is not None:
            view.last_run = describe.last_run(view.state, entry, found.root, found.jitter)
            view.by = owners.get(view.state.epoch) if view.state.epoch is not None else None
        _plan(view, model, entry, found, now)
        rows[model.name] = view
    return Page(rows=rows)


def _owners(client: Any, root: str) -> dict[int, str]:
    """Epoch -> identity of each candidate in line (a candidate's sequence is the epoch it leads under)."""
    line, _ = read_election(client, f"{root.rstrip('/')}/{LAYOUT_DIR}/election")
    return {c.sequence: c.identity for c in line if c.identity}


def _entry(model: Any, app: Any) -> Any | None:
    """The row as the leader would schedule it; None if it cannot be one (the leader leaves it out too).

    Built from a copy: django-celery-beat's entry fills in the row's
    ``last_run_at`` in place, and the page shows the row as stored.
    """
    if _rows.unfit(model) is not None:
        return None
    try:
        return ModelEntry(copy_row(model), app=app)
    except Exception:  # noqa: BLE001 - a row django-celery-beat cannot build shows no next run
        return None


def _plan(view: RowView, model: Any, entry: Any | None, found: Any, now: datetime) -> None:
    """The row's next run, or why it has none."""
    if not model.enabled:
        view.no_next = "disabled"
        return
    if model.one_off and model.total_run_count:
        view.no_next = "one-off ran"
        return
    if entry is None:
        view.no_next = "unknown"
        return
    state = view.state
    if state is not None and keeps_own_run(entry, state):
        state = None  # the leader keeps the row's own run: plan from it, as the leader does
    try:
        fires = describe.next_fires(entry, state, found.root, found.jitter, now, count=1)
    except Exception:  # noqa: BLE001 - a schedule that raises shows no next run
        fires = []
    if not fires:
        view.no_next = "unknown"
        return
    view.next_at = datetime.fromisoformat(fires[0]["at"])

"""Claims whose commit was never confirmed, and claims written back so their ticks stay due.

A claim whose reply was lost with the ZooKeeper connection may have landed.
It is kept as a :class:`PendingClaim` with the state it wrote and the state
before it, so that whoever reads the ledger next can tell: the claim's own
state means it landed (publish it, or write the old state back); the old
version means it did not; anything else means another leader ran the entry
since. Writing back is a compare-and-set at the version the claim gave the
znode, so it never overwrites anyone else's run.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime

from celery import beat

from .controls import TriggerRequest
from .store import ABSENT, Claim, EntryState, Ledger, LedgerRecord

__all__ = ["PendingClaim", "report_unlanded", "write_back", "release"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class PendingClaim:
    """A claim whose commit was never confirmed, with what it takes to settle it."""

    name: str
    priority: int
    #: The entry as it was before the claim (what stays due if it did not land).
    entry: beat.ScheduleEntry
    #: The entry as the claim advanced it (what the schedule holds once it ran).
    next_entry: beat.ScheduleEntry
    slot: datetime
    epoch: int
    #: What the claim wrote, and the znode version it was written over.
    state: EntryState
    previous_version: int
    #: The ledger state before the claim, written back to withdraw it.
    previous: EntryState
    #: The trigger request a run-now claim consumed (zkbeat.ledger.controls).
    request: TriggerRequest | None = None


def report_unlanded(claim: PendingClaim, record: LedgerRecord | None) -> None:
    """Say what became of a pending claim the ledger does not hold (any more)."""
    name, slot = claim.name, claim.slot.isoformat()
    state = record.state if record is not None else None
    if (record.version if record is not None else ABSENT) == claim.previous_version:
        logger.info("zkbeat: the claim of %s at %s did not commit; the tick is still due", name, slot)
    elif state == claim.previous:
        logger.info("zkbeat: the claim of %s at %s was written back; the tick is still due", name, slot)
    else:
        logger.warning(
            "zkbeat: the claim of %s at %s was never confirmed, and the ledger has moved on (slot %s, epoch "
            "%s): if that claim had landed, its tick was not published",
            name,
            slot,
            state.slot.isoformat() if state is not None and state.slot else "unknown",
            state.epoch if state is not None else "unknown",
        )


def write_back(
    ledger: Ledger, claims: list[PendingClaim], fence: str | None, versions: dict[str, int]
) -> dict[str, int]:
    """Write each claim's pre-claim state over it, in one transaction, so its tick stays due.

    Compare-and-set at ``versions`` (the version our claim gave the znode):
    if anyone wrote the entry since, nothing is overwritten. A run-now's
    request is put back with it. Returns the new version of each claim
    written back; the others stay pending (logged), for a later term or
    close() to write back.
    """
    writes = [
        Claim(c.name, c.previous, versions[c.name], restore=(c.request.path, c.request.raw) if c.request else None)
        for c in claims
    ]
    try:
        result = ledger.claim(writes, fence)
        error: BaseException | None = result.error
        committed = result.committed
    except Exception as exc:  # noqa: BLE001 - reported below; they stay pending
        error, committed = exc, dict(getattr(exc, "committed", {}))
    for claim in claims:
        if claim.name in committed:
            logger.info(
                "zkbeat: the claim of %s at %s was not sent; it is written back, so the tick stays due",
                claim.name,
                claim.slot.isoformat(),
            )
    if error is not None:
        logger.error(
            "zkbeat: ticks recorded as run but not published could not be written back (%r): %s; they stay "
            "pending, and are written back when this replica leads again or stops",
            error,
            ", ".join(f"{c.name} at {c.slot.isoformat()}" for c in claims if c.name not in committed),
        )
    return committed


def release(ledger: Ledger, claims: list[PendingClaim]) -> list[PendingClaim]:
    """Write back the pending claims that landed, without leading (at close(), or while following).

    Needs no fence: the compare-and-set at the version our claim wrote
    succeeds only if nobody has written the entry since, and a leader that
    read our claim then conflicts and re-reads. Returns the claims still
    pending (ZooKeeper could not be asked, or did not answer).
    """
    if not claims:
        return []
    ledger.sync()
    records = ledger.load([claim.name for claim in claims])
    landed, versions = [], {}
    for claim in claims:
        record = records.get(claim.name)
        if record is not None and record.state == claim.state:
            landed.append(claim)
            versions[claim.name] = record.version
        else:
            report_unlanded(claim, record)
    if not landed:
        return []
    written = write_back(ledger, landed, None, versions)
    return [claim for claim in landed if claim.name not in written]

"""The ZooKeeper layout version: one number, and the directory its data lives in.

Everything a release writes lives under ``<root>/v1``; a rolling upgrade
that mixes releases compares layout numbers (see peers.py).

Layout 2 keeps layout 1's tree and adds to it: an entry's ledger znode may
hold a pause (``paused``) and the last trigger run (``manual``), and
``<root>/v1/triggers`` holds run-now requests (zkbeat.ledger.controls). A layout-1
replica would ignore both: it would publish a paused entry and overwrite the
pause with its claim, and it never consumes a trigger. So a layout-2 replica
announces ``"layout": 2`` in its candidate, and every command that writes
such state first creates ``<root>/v2`` (an empty marker): a layout-1 replica
that sees either refuses to lead. Such a command refuses unless a layout-2
candidate is in line or the marker exists already (``--force`` overrides:
zkbeat.ledger.controls.check_layout), so that a newer command never stops a
cluster of older replicas. After a rollback to layout 1, resume every entry
(a resume never creates the marker), and delete ``<root>/v2`` so that the
older replicas lead again.

A field an older release may ignore needs no new layout. ``recent`` (an
entry's last runs, zkbeat.ledger.history) is one: a release that does not know it
reads the fields it knows and nothing else, and its claim drops it, which
costs the schedule nothing (the history starts again at the next claim of
a release that keeps it). State whose neglect would publish what must not
be published (a pause) or never run what was asked (a trigger) takes a
layout and its marker.
"""

from __future__ import annotations

__all__ = ["LAYOUT", "LAYOUT_DIR", "MARKER_DIR"]

#: This release's layout number.
LAYOUT = 2
#: The root child that holds the data: layout 2 extends layout 1's tree in place.
LAYOUT_DIR = "v1"
#: The root child that marks a root whose data only layout 2 reads right.
MARKER_DIR = f"v{LAYOUT}"

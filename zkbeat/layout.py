"""The ZooKeeper layout version: one number, the one source for every path.

Everything a release writes lives under ``<root>/v<LAYOUT>``; a rolling
upgrade that mixes releases compares these numbers (see peers.py).
"""

from __future__ import annotations

__all__ = ["LAYOUT", "LAYOUT_DIR"]

#: This release's layout number.
LAYOUT = 1
#: The root child that holds this layout: ``<root>/v1``.
LAYOUT_DIR = f"v{LAYOUT}"

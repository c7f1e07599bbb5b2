"""``bench.app`` with ``zkbeat_shards`` from ``BENCH_SHARDS`` (bench/shards.py).

A module of its own so that the shared app, which every other scenario
runs, stays as it is: the sharded processes differ by this one setting.
"""

from __future__ import annotations

import os

from bench.app import app

app.conf.zkbeat_shards = int(os.environ.get("BENCH_SHARDS", "1"))

__all__ = ["app"]

"""`make bench` at least starts: every scenario module imports and the command parses its options.

The bench runs for twenty minutes and is never part of `make test`; this
keeps a refactor of the test helpers it shares from breaking it unseen.
"""

from __future__ import annotations

import importlib
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest

import bench

ROOT = Path(__file__).resolve().parent.parent


def test_every_bench_module_imports() -> None:
    """Each module of bench/ imports (the apps the benchmarked processes run are left out: they need
    the BENCH_* environment, and the Django one configures Django for the whole process)."""
    names = [
        info.name for info in pkgutil.iter_modules(bench.__path__) if info.name not in ("app", "djangoapp", "shardsapp")
    ]
    assert {"crash", "hung", "burst", "handover", "database", "shards"} <= set(names)
    for name in names:
        importlib.import_module(f"bench.{name}")


def test_python_m_bench_help_lists_every_scenario() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "bench", "--help"], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    for scenario in ("burst", "crash", "handover", "hung", "punctuality", "steady", "swarm", "database", "shards"):
        assert scenario in done.stdout


def test_the_burst_s_flavour_option_always_keeps_zkbeat_and_refuses_unknown_names() -> None:
    """BENCH_BURST_FLAVOURS names the schedulers besides zkbeat: the burst's rows and its takeover need zkbeat's
    run (without it the bench crashed after minutes of bursts), and a misspelt name is refused, not run as none."""
    from bench.burst import _flavours
    from bench.cluster import FLAVOURS, PLAIN, ZKBEAT

    assert _flavours(None) == FLAVOURS
    assert _flavours("zkbeat") == (ZKBEAT,)
    assert _flavours(PLAIN.key) == (ZKBEAT, PLAIN)
    with pytest.raises(ValueError, match="zkbaet"):
        _flavours("zkbaet")

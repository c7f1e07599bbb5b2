"""zkbeat: run celery beat as many replicas; each periodic task still runs once per tick."""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"

from .coordination.election import LeaderElection  # noqa: E402
from .exceptions import (  # noqa: E402
    ClaimConflictError,
    ConfigurationError,
    FencedError,
    LedgerError,
    ZkBeatError,
)
from .scheduler import Scheduler  # noqa: E402

__all__ = [
    "Scheduler",
    "DatabaseScheduler",
    "LeaderElection",
    "ZkBeatError",
    "ConfigurationError",
    "LedgerError",
    "FencedError",
    "ClaimConflictError",
    "__version__",
]


def __getattr__(name: str) -> Any:
    # Importing zkbeat must not import Django: DatabaseScheduler loads lazily.
    if name == "DatabaseScheduler":
        from .contrib.django import DatabaseScheduler

        return DatabaseScheduler
    raise AttributeError(f"module 'zkbeat' has no attribute {name!r}")

"""zkbeat's errors: one root class, a few named subclasses (kazoo's shape)."""

from __future__ import annotations

__all__ = [
    "ZkBeatError",
    "ConfigurationError",
    "LedgerError",
    "FencedError",
    "ClaimConflictError",
    "ClaimRefusedError",
]


class ZkBeatError(Exception):
    """Root of every error zkbeat raises on purpose."""


class ConfigurationError(ZkBeatError, ValueError):
    """A ``zkbeat_*`` setting has a value zkbeat cannot use.

    The message always names the setting and the bad value, so beat fails at
    start-up with something an operator can act on.
    """

    def __init__(self, setting: str, value: object, reason: str) -> None:
        self.setting = setting
        self.value = value
        self.reason = reason
        super().__init__(f"{setting}={_shown(value)}: {reason}")


def _shown(value: object) -> str:
    """``repr(value)``, or a stand-in when repr itself fails.

    repr of an int over 4300 digits raises ValueError (CPython's limit on
    int-to-str conversion); the error about a bad setting must still be one.
    """
    try:
        return repr(value)
    except Exception:  # noqa: BLE001 - any failing __repr__, not only huge ints
        return f"<{type(value).__name__} that cannot be shown>"


class LedgerError(ZkBeatError):
    """The run ledger refused a claim; nothing in it was published."""


class FencedError(LedgerError):
    """The claim's fence failed: this replica's candidate znode is gone.

    It is no longer the leader (session expired, stepped down, or deleted from
    outside), whatever its local state still says.
    """


class ClaimConflictError(LedgerError):
    """An entry's znode changed since it was read: someone else wrote it.

    Carries the entry names whose version check failed, so the caller can
    re-read exactly those.
    """

    def __init__(self, names: list[str]) -> None:
        self.names = names
        super().__init__(f"ledger entries changed underneath us: {', '.join(names)}")


class ClaimRefusedError(LedgerError):
    """ZooKeeper refused the write of one entry outright (NoAuth: someone else's ACL on it).

    Carries the entry's name and ZooKeeper's error; nothing of that
    transaction committed.
    """

    def __init__(self, name: str, cause: Exception) -> None:
        self.names = [name]
        self.cause = cause
        super().__init__(f"ZooKeeper refused the claim of entry {name!r} ({type(cause).__name__})")

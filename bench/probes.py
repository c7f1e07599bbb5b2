"""What the benchmark reads from outside the processes: /proc and ZooKeeper.

CPU and memory come from ``/proc/<pid>`` (all threads, user + system), so
zkbeat's kazoo threads count against it. ZooKeeper's own view comes from its
four-letter commands: ``srvr`` (the last zxid: every write transaction takes
one), ``cons`` (packets per session) and ``wchc`` (watches per session).
"""

from __future__ import annotations

import os
import re

from tests.support.servers import four_letter

_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process and all its threads so far."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    # fields[0] is the state (3rd field of stat): utime, stime are 14th, 15th.
    return (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def last_zxid(port: int) -> int:
    for line in four_letter(port, "srvr").splitlines():
        if line.startswith("Zxid:"):
            return int(line.split()[1], 16)
    raise RuntimeError("no Zxid in srvr output")


_CONNECTION = re.compile(r"\((.*)\)\s*$")


def sessions(port: int) -> dict[int, dict[str, str]]:
    """``cons``: each client session's counters (recved, sent, lop, ...) by session id."""
    found = {}
    for line in four_letter(port, "cons").splitlines():
        match = _CONNECTION.search(line)
        if not match:
            continue
        fields = dict(part.split("=", 1) for part in match.group(1).split(",") if "=" in part)
        if "sid" in fields:
            found[int(fields["sid"], 16)] = fields
    return found


def watches_by_session(port: int) -> dict[int, list[str]]:
    """``wchc``: the paths each session watches."""
    found: dict[int, list[str]] = {}
    current = None
    for line in four_letter(port, "wchc").splitlines():
        if line.startswith("0x"):
            current = int(line.strip(), 16)
            found[current] = []
        elif line.strip() and current is not None:
            found[current].append(line.strip())
    return found

"""How fast two CPU-bound Python processes run side by side on this machine, against one alone.

The shards scenario's ratios are read against it: with 2 shards on 2
cores, the two leaders run side by side, each at about this fraction of
the speed one leader has alone. Cores that share a physical core or a
memory bus, or another tenant's load, show here. The work is the kind a
leader does per publish: JSON, string formatting and dict copies.
"""

from __future__ import annotations

import statistics
import subprocess
import sys

#: Python run by each process: prints the seconds its loop took (its own clock, not the start-up).
WORK = """
import json, time
message = {"id": "7f9c", "task": "zkbench.noop", "args": ["row-00001"], "headers": {"lang": "py", "retries": 0}}
started = time.perf_counter()
for i in range(ROUNDS):
    copied = dict(message, id=f"{i:032x}")
    text = json.dumps(copied)
    line = f"Scheduler: Sending due task {copied['args'][0]} ({copied['task']}) {len(text)}"
print(time.perf_counter() - started)
"""

#: Loop rounds: about a second of one core here.
ROUNDS = 300_000


def _together(count: int) -> list[float]:
    """Start ``count`` processes at once; each one's seconds."""
    code = WORK.replace("ROUNDS", str(ROUNDS))
    procs = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True) for _ in range(count)]
    return [float(proc.communicate(timeout=120)[0]) for proc in procs]


def alone_seconds(trials: int = 3) -> float:
    """One process's seconds for the work alone, median of ``trials``: this machine's pace on the day.

    The absolute rows (the burst's seconds) move with it: the same code on
    the same machine ran its burst in 1.8 s one evening and 3.4 s two days
    later, when this work took 1.35 s (ROUNDS was sized to about a second
    when it was written).
    """
    return statistics.median(_together(1)[0] for _ in range(trials))


def side_by_side_speed(trials: int = 3) -> float:
    """Each of two processes' speed side by side ÷ one's speed alone (1.0: two full cores), median of ``trials``."""
    speeds = []
    for _ in range(trials):
        alone = _together(1)[0]
        pair = _together(2)
        speeds.append(alone / max(pair))
    return statistics.median(speeds)


if __name__ == "__main__":
    print(f"the work alone: {alone_seconds():.3f} s")
    print(f"two processes side by side, each at {side_by_side_speed():.2f} of one alone's speed")

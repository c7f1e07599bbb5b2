"""A hung leader: its broker link black-holed, so its publish blocks; how soon does another replica publish?

One replica talks to Redis through a TCP proxy (tests/proxy.py) and is made
leader first; two more talk to Redis directly. Right after the leader
published, the proxy starts dropping every byte both ways: the leader's next
publish waits for a reply that never comes. zkbeat's watchdog steps it down
after ``zkbeat_stall_timeout`` (10 s here); redbeat (tuned) keeps its lock in
the same Redis, over the same link, so its lock expires after 5 s.
"""

from __future__ import annotations

import math
import time

from bench.cluster import REDBEAT_TUNED, ZKBEAT, Flavour
from bench.context import Bench, first_publish_by_other, wait_leader_publishing, wait_settled, wait_started
from bench.stats import Row, Sample
from tests.support.helpers import wait_for
from tests.support.proxy import TcpProxy

ENTRIES = [{"name": "tick", "every": 1}]
STALL = 10.0


def _trials(bench: Bench, flavour: Flavour, trials: int, **env: str) -> dict[str, Sample]:
    """Seconds from the cut, and from the moment the leader's publish blocked, to another replica's publish."""
    cap = STALL + 30
    result = {"cut": Sample(cap=cap), "blocked": Sample(cap=cap)}
    for trial in range(trials):
        proxy = TcpProxy(bench.redis.port).start()
        try:
            with bench.run(flavour, ENTRIES, **env) as run:
                direct = run.env["BENCH_BROKER"]
                run.env["BENCH_BROKER"] = f"redis://127.0.0.1:{proxy.port}/0"
                hung = run.add()
                run.env["BENCH_BROKER"] = direct
                wait_started([hung])
                if wait_leader_publishing(run, "tick", 0) is None:
                    result["cut"].note = result["blocked"].note = "the proxied replica never published"
                    break
                for _ in range(flavour.replicas - 1):
                    wait_settled(run.add())
                found = wait_leader_publishing(run, "tick", time.time())
                if found is None or found[0] is not hung:
                    result["cut"].note = result["blocked"].note = "the proxied replica did not stay leader"
                    break
                t0 = time.time()
                proxy.blackhole()
                publish = wait_for(lambda pid=hung.pid, t=t0: first_publish_by_other(run, pid, t), cap, 0.005)
                # The bench records a publish as beat hands it to kombu, so the
                # one that blocked is on record: the hang began there.
                blocked = next((p.at for p in run.publishes() if p.pid == hung.pid and p.at > t0), None)
                result["cut"].values.append(publish.at - t0 if publish else math.inf)
                if blocked is None:
                    # redbeat's loop blocks on its lock in the same Redis before any publish.
                    result["blocked"].note = "no publish blocked (its loop blocked on something else first)"
                else:
                    result["blocked"].values.append(publish.at - blocked if publish else math.inf)
                bench.say(f"  {flavour.key} hung leader {trial + 1}/{trials}: another replica published "
                          f"{result['cut'].values[-1]:.3f} s after the cut, "
                          f"{publish.at - blocked if publish and blocked else math.inf:.3f} s after the publish "
                          "blocked")  # fmt: skip
        finally:
            proxy.close()
    return result


def run(bench: Bench) -> list[Row]:
    trials = 1 if bench.quick else 3
    bench.say(f"hung: the leader's broker link black-holed x{trials}, zkbeat_stall_timeout {STALL:g} s")
    zk = _trials(bench, ZKBEAT, trials, BENCH_STALL_TIMEOUT=str(STALL))
    tuned = _trials(bench, REDBEAT_TUNED, trials)
    scenario = f"leader hung (broker link black-holed), zkbeat_stall_timeout {STALL:g} s"
    return [
        Row(
            scenario,
            "another replica publishes, after the leader's publish blocked",
            "s",
            {"zkbeat": zk["blocked"], "redbeat_tuned": tuned["blocked"]},
            target=f"≤ stall timeout + 1 s ({STALL + 1:g} s)",
            check=lambda row: row.values["zkbeat"].p99 <= STALL + 1,
            digits=3,
        ),
        Row(
            scenario,
            "another replica publishes, after the cut (the next tick comes due up to 1 s later)",
            "s",
            {"zkbeat": zk["cut"], "redbeat_tuned": tuned["cut"]},
            digits=3,
        ),
    ]

"""A leader cut off from the broker, not from ZooKeeper: how soon does a replica that reaches it publish?

One replica talks to Redis through a TCP proxy (tests/support/proxy.py) and
is made leader first; two more talk to Redis directly. Right after the
leader published, the proxy starts dropping every byte both ways: the
leader waits out its reply timeout (10 s), then fails to reconnect. After
``zkbeat_broker_handover_timeout`` (15 s, the default) it asks the others,
the next replica answers, its own probe fails once more (3 s), and it
hands over. The stall timeout is raised to 60 s here so that the
watchdog (``bench/hung.py``) does not step in first.
"""

from __future__ import annotations

import math
import time

from bench.cluster import ZKBEAT
from bench.context import Bench, first_publish_by_other, wait_leader_publishing, wait_settled, wait_started
from bench.stats import Row, Sample
from tests.support.helpers import wait_for
from tests.support.proxy import TcpProxy
from zkbeat.conf import DEFAULT_BROKER_HANDOVER_TIMEOUT

ENTRIES = [{"name": "tick", "every": 1}]
HANDOVER = DEFAULT_BROKER_HANDOVER_TIMEOUT
STALL = 60.0


def _trials(bench: Bench, trials: int) -> Sample:
    """Seconds from the cut to another replica's first publish.

    The cut comes right after the leader published, often before Redis's
    answer to that publish went back: the leader's wait for it is what
    begins the count (zkbeat_broker_handover_timeout runs from the start of
    the send that failed).
    """
    cap = HANDOVER + 40
    result = Sample(cap=cap)
    for trial in range(trials):
        proxy = TcpProxy(bench.redis.port).start()
        try:
            env = {"BENCH_STALL_TIMEOUT": str(STALL), "BENCH_BROKER_HANDOVER": str(HANDOVER)}
            with bench.run(ZKBEAT, ENTRIES, **env) as run:
                direct = run.env["BENCH_BROKER"]
                run.env["BENCH_BROKER"] = f"redis://127.0.0.1:{proxy.port}/0"
                cut = run.add()
                run.env["BENCH_BROKER"] = direct
                wait_started([cut])
                if wait_leader_publishing(run, "tick", 0) is None:
                    result.note = "the proxied replica never published"
                    break
                for _ in range(ZKBEAT.replicas - 1):
                    wait_settled(run.add())
                found = wait_leader_publishing(run, "tick", time.time())
                if found is None or found[0] is not cut:
                    result.note = "the proxied replica did not stay leader"
                    break
                t0 = time.time()
                proxy.blackhole()
                publish = wait_for(lambda pid=cut.pid, t=t0: first_publish_by_other(run, pid, t), cap, 0.005,
                                   raise_on_timeout=False)  # fmt: skip
                result.values.append(publish.at - t0 if publish else math.inf)
                bench.say(f"  zkbeat broker partition {trial + 1}/{trials}: another replica published "
                          f"{result.values[-1]:.3f} s after the cut")  # fmt: skip
        finally:
            proxy.close()
    return result


def run(bench: Bench) -> list[Row]:
    trials = 1 if bench.quick else 3
    bench.say(f"partition: the leader's broker link black-holed x{trials}, handover timeout {HANDOVER:g} s")
    sample = _trials(bench, trials)
    # The timeout, then the leader's own probe (at most 3 s) and the new leader's first pass.
    limit = HANDOVER + 6
    return [
        Row(
            f"leader cut off from the broker only, zkbeat_broker_handover_timeout {HANDOVER:g} s",
            "another replica publishes, after the cut",
            "s",
            {"zkbeat": sample},
            target=f"≤ handover timeout + 6 s ({limit:g} s)",
            check=lambda row: row.values["zkbeat"].p99 <= limit,
            digits=3,
        ),
    ]

"""`make demo BROKER=<url>` (README.md, docs/quickstart.md): the demo on a broker the user runs, without Redis.

The whole story (a kill -9, a SIGTERM, the table) takes a minute and more, so
these check the parts the broker changes: make hands BROKER to the demo, the
demo takes it as its broker, and then starts no Redis while a replica of the
example project publishes through RabbitMQ (a vhost of the test's own) to the
demo's worker, which runs the job.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from demo.run import options
from tests.support.brokers import RabbitBroker
from tests.support.processes import ROOT

pytestmark = pytest.mark.processes

URL = "amqp://guest:guest@127.0.0.1:5672//"

#: The demo's set-up with one replica, until the worker ran a job the replica published; then its cleanup.
SCRIPT = """
import json, sys
from pathlib import Path
from demo.run import Demo

demo = Demo(1, sys.argv[1], Path(sys.argv[2]))
try:
    env = demo.start_servers()
    demo.prepare_project(env)
    demo.start_processes(env)
    demo.watch(lambda: demo.leader, 90, "a leader")
    published = demo.watch(lambda: next((e for e in demo.events if e.kind == "publish"), None), 60, "a publish")
    from jobs.models import JobRun

    ran = JobRun.objects.filter(periodic_task=published.entry)
    demo.watch(lambda: ran.exists(), 60, f"the worker's run of {published.entry}")
    result = {"servers": [type(server).__name__ for server in demo.servers], "entry": published.entry,
              "ran": sorted(set(JobRun.objects.values_list("periodic_task", flat=True)))}
finally:
    demo.cleanup()
print(json.dumps(result))
"""


def test_make_demo_hands_broker_to_the_demo(monkeypatch: pytest.MonkeyPatch) -> None:
    """`make demo BROKER=<url>` runs `python -m demo` with BROKER set, which the demo takes as its broker;
    without BROKER (make sets it empty) the demo starts its own Redis; --broker wins."""
    dry = subprocess.run(["make", "-n", "demo", f"BROKER={URL}"], cwd=ROOT, capture_output=True, text=True,
                         timeout=60)  # fmt: skip
    assert dry.returncode == 0, dry.stderr
    assert re.search(rf"^BROKER='{re.escape(URL)}' \S+/python -m demo$", dry.stdout, re.MULTILINE), dry.stdout
    monkeypatch.setenv("BROKER", URL)
    assert options([]).broker == URL
    assert options(["--broker", "redis://127.0.0.1:6390/0"]).broker == "redis://127.0.0.1:6390/0"
    monkeypatch.setenv("BROKER", "")
    assert options([]).broker is None


def test_the_demo_runs_on_rabbitmq_without_starting_redis(tmp_path: Path) -> None:
    """With a broker named, the demo starts ZooKeeper only; its replica publishes through RabbitMQ and the
    worker runs the job."""
    with RabbitBroker("demo") as rabbit:
        done = subprocess.run(
            [sys.executable, "-c", SCRIPT, rabbit.url, str(tmp_path)],
            env={**os.environ, "PYTHONPATH": str(ROOT)}, cwd=ROOT, capture_output=True, text=True, timeout=240,
        )  # fmt: skip
        logs = "\n".join(f"--- {log.name}\n{log.read_text(errors='replace')[-3000:]}" for log in tmp_path.glob("*.log"))
        assert done.returncode == 0, done.stdout + done.stderr + logs
        result = json.loads(done.stdout.splitlines()[-1])
        assert result["servers"] == ["ZooKeeperServer"], result
        assert result["entry"] in result["ran"], result
        assert f"the broker at amqp://guest:***@127.0.0.1:{rabbit.proxy.port}/{rabbit.vhost}" in done.stdout
        assert f"127.0.0.1:{rabbit.proxy.port}/{rabbit.vhost}" in (tmp_path / "worker.log").read_text()

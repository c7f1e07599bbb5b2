"""The package as a user gets it: the wheel built, checked, installed into a
fresh virtualenv outside the source tree, and run there against real servers.

Nothing here imports zkbeat from the repository: every zkbeat, celery and
python below is the fresh virtualenv's, run from a directory outside the tree.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tarfile
import uuid
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis

from tests.support.helpers import wait_for
from tests.support.servers import RedisServer, ZooKeeperServer

pytestmark = pytest.mark.processes

ROOT = Path(__file__).resolve().parent.parent

#: A whole project as small as it gets: one task, one entry every second.
TINY_APP = """\
from celery import Celery

app = Celery("tinyapp", broker={broker!r})
app.conf.update(
    zkbeat_hosts={hosts!r},
    zkbeat_root={root!r},
    task_default_queue={queue!r},
    beat_schedule={{"tick": {{"task": "tinyapp.tick", "schedule": 1.0}}}},
)


@app.task
def tick():
    return "tick"
"""


@dataclass
class Installed:
    """A virtualenv holding the built wheel, and a directory outside the tree to run it from."""

    venv: Path
    workdir: Path
    dist: Path

    def bin(self, name: str) -> str:
        return str(self.venv / "bin" / name)

    def env(self) -> dict[str, str]:
        # Nothing may lead back to the source tree or the suite's own venv.
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
        env["PATH"] = f"{self.venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
        env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
        return env

    def run(self, *command: str, timeout: float = 120) -> subprocess.CompletedProcess:
        return subprocess.run(
            list(command), cwd=self.workdir, env=self.env(), capture_output=True, text=True, timeout=timeout
        )


def _check(result: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    assert result.returncode == 0, f"{result.args} exited {result.returncode}\n{result.stdout}\n{result.stderr}"
    return result


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Installed:
    """Build sdist and wheel, check both, install the wheel with its dependencies into a fresh venv."""
    base = tmp_path_factory.mktemp("package")
    assert ROOT not in base.parents, "the install must live outside the source tree"
    dist = base / "dist"
    _check(
        subprocess.run(
            [sys.executable, "-m", "build", "--outdir", str(dist), str(ROOT)],
            capture_output=True,
            text=True,
            timeout=600,
        )
    )
    _check(
        subprocess.run(
            [sys.executable, "-m", "twine", "check", "--strict", *map(str, dist.iterdir())],
            capture_output=True,
            text=True,
            timeout=120,
        )
    )
    venv = base / "venv"
    _check(subprocess.run([sys.executable, "-m", "venv", str(venv)], capture_output=True, text=True, timeout=300))
    workdir = base / "work"
    workdir.mkdir()
    target = Installed(venv=venv, workdir=workdir, dist=dist)
    (wheel,) = dist.glob("zkbeat-*.whl")
    _check(target.run(target.bin("python"), "-m", "pip", "install", "-q", f"{wheel}[redis]", timeout=600))
    return target


@pytest.fixture
def tiny_app(installed: Installed, zk_server: ZooKeeperServer, redis_server: RedisServer, zk_root: str) -> str:
    """tinyapp.py in the work directory, on this test's own ZooKeeper root and queue; returns the queue."""
    queue = f"pkg-{uuid.uuid4().hex[:8]}"
    source = TINY_APP.format(broker=redis_server.url, hosts=zk_server.hosts, root=zk_root, queue=queue)
    (installed.workdir / "tinyapp.py").write_text(source)
    return queue


@pytest.fixture
def beat(installed: Installed, tiny_app: str) -> Iterator[subprocess.Popen]:
    """``celery -A tinyapp beat --scheduler zkbeat`` from the installed venv, stopped with SIGTERM afterwards."""
    log = open(installed.workdir / "beat.log", "ab")  # noqa: SIM115 - closed below, after the process
    process = subprocess.Popen(
        [installed.bin("celery"), "-A", "tinyapp", "beat", "--scheduler", "zkbeat", "-l", "info"],
        cwd=installed.workdir, env=installed.env(), stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
        start_new_session=True,
    )  # fmt: skip
    try:
        yield process
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        log.close()


def test_sdist_and_wheel_hold_the_package_license_and_no_tests(installed: Installed) -> None:
    """The sdist carries LICENSE and CHANGELOG.md and no tests (they need the repository), the wheel its license."""
    (sdist,) = installed.dist.glob("zkbeat-*.tar.gz")
    with tarfile.open(sdist) as archive:
        names = {name.split("/", 1)[1] for name in archive.getnames() if "/" in name}
    assert {"LICENSE", "CHANGELOG.md", "README.md", "zkbeat/__main__.py", "zkbeat/py.typed"} <= names
    assert not [name for name in names if name.startswith("tests")]
    (wheel,) = installed.dist.glob("zkbeat-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        wheel_names = archive.namelist()
    assert any(name.endswith("licenses/LICENSE") for name in wheel_names)
    # The dashboard's page is package data: without it `zkbeat dashboard` serves nothing.
    static = {f"zkbeat/ops/dashboard/static/{name}" for name in ("index.html", "app.js", "app.css")}
    assert static <= set(wheel_names) and static <= names
    # So is the Django admin app's cluster page template.
    template = "zkbeat/contrib/admin/templates/admin/zkbeat_admin/cluster.html"
    assert template in wheel_names and template in names
    assert not [name for name in wheel_names if name.startswith("tests/")]


def test_installed_wheel_is_the_zkbeat_that_runs(installed: Installed) -> None:
    """From outside the tree, ``import zkbeat`` finds the venv's copy, not the repository's."""
    found = _check(installed.run(installed.bin("python"), "-c", "import zkbeat; print(zkbeat.__file__)")).stdout
    path = Path(found.strip()).resolve()
    assert installed.venv.resolve() in path.parents
    assert ROOT not in path.parents


def test_zkbeat_command_and_python_m_zkbeat_answer_help(installed: Installed) -> None:
    """``zkbeat --help`` and ``python -m zkbeat --help`` both show the zkbeat command and its subcommands."""
    for command in ([installed.bin("zkbeat")], [installed.bin("python"), "-m", "zkbeat"]):
        out = _check(installed.run(*command, "--help")).stdout
        assert out.startswith("Usage: zkbeat "), out
        for sub in ("status", "step-down", "health"):
            assert sub in out
        version = _check(installed.run(*command, "--version")).stdout
        assert version.strip().startswith("zkbeat, version "), version


def test_installed_beat_publishes_through_zkbeat(
    installed: Installed, tiny_app: str, beat: subprocess.Popen, redis_server: RedisServer
) -> None:
    """The installed ``celery beat --scheduler zkbeat`` leads and publishes a fenced tick that zkbeat status sees."""
    queue = tiny_app
    broker = redis.Redis.from_url(redis_server.url)
    log_path = installed.workdir / "beat.log"

    def published() -> list[dict]:
        assert beat.poll() is None, f"beat exited {beat.returncode}:\n{log_path.read_text()}"
        return [json.loads(raw) for raw in broker.lrange(queue, 0, -1)]

    try:
        messages = wait_for(published, timeout=60, message=lambda: log_path.read_text())
        headers = messages[0]["headers"]
        assert headers["zkbeat-entry"] == "tick"
        assert isinstance(headers["zkbeat-epoch"], int)
        assert "became leader" in log_path.read_text()

        status = _check(installed.run(installed.bin("zkbeat"), "-A", "tinyapp", "status", "--json"))
        found = json.loads(status.stdout)
        assert found["leader"]["pid"] == beat.pid
        assert [entry["name"] for entry in found["entries"]] == ["tick"]
    finally:
        broker.delete(queue)
        broker.close()

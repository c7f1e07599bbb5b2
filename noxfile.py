"""The version matrix: every dependency version zkbeat claims, tested (`make matrix`).

Each session pins one dependency at one version and keeps the others at
their newest, plus one session with every floor at once; the floors in
setup.cfg are exactly the versions the ``floors`` session runs. A session
runs the in-process tests of what it varies and one real failover of
``celery beat`` processes (the ``*_SELECTION`` lists below), not the whole
suite: the main environment (``make test``) runs everything on the newest
versions.

Versions are exact pins (the newest patch of each minor), so a new upstream
release changes nothing here until someone adds it. Celery pins the kombu it
works with loosely (5.3 and 5.4 accept any kombu below 6), so each Celery
minor runs with the kombu minor released beside it.

Every Python ``python_requires`` admits is tested: 3.11 in every session
above, and 3.12 and 3.13 each in one session (``python-3.12``,
``python-3.13``) that runs the in-process tests of the core and one real
failover with the newest Celery and kazoo (what changes between Pythons is
the interpreter, not the dependencies' pins). The interpreters come from
pyenv's versions folder (``$PYENV_ROOT``, else ``~/.pyenv``) when it has
them: its ``python3.12`` shim only works where pyenv's global version names
3.12, and neither nox nor uv looks past a shim that fails. Elsewhere the
version is looked up as usual (``PATH``); nothing is downloaded
(``UV_PYTHON_DOWNLOADS=never``), and a missing interpreter fails the session.

``python noxfile.py`` prints the table of the last run (session, result,
time) from ``.nox/matrix.json``, which each session appends to.

``make matrix`` runs the sessions side by side, each as its own ``nox -s``
process: so a session's results are appended under a lock, and its install
(which rewrites ``zkbeat.egg-info`` in the tree) takes turns with the others'.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import sys
import time
from pathlib import Path

import nox

nox.options.default_venv_backend = "uv"
nox.options.error_on_missing_interpreters = True
# A fresh clone has no interpreter download to fall back on: fail with uv's message instead.
os.environ.setdefault("UV_PYTHON_DOWNLOADS", "never")

PYTHON = "3.11"
#: The newer Pythons ``python_requires`` admits, each in one session with the newest pins.
NEWER_PYTHONS = ("3.12", "3.13")
RESULTS = Path(__file__).parent / ".nox" / "matrix.json"

#: The in-process tests of the core: every session but the django-celery-beat
#: ones runs them (those run Celery and kazoo at their newest, as celery-5.7 does).
IN_PROCESS = [
    "tests/test_scheduler.py",
    "tests/test_hostile_schedule.py",
    "tests/test_ledger.py",
    "tests/test_election.py",
    "tests/test_conf.py",
]
#: What depends on Celery's and kombu's own code: each Celery session runs it.
CELERY_SIDE = [
    # Celery's crontab across DST changed in 5.5 and 5.7; each night takes about a second.
    "tests/test_dst.py",
    # Read off tracebacks of kombu, redis-py and py-amqp: proved on each of their versions,
    # Redis's lost answer and refused send, and RabbitMQ's lost confirm, nack and dropped idle link.
    "tests/test_uncertain_publish.py::test_a_publish_whose_reply_is_lost_is_in_the_queue_once_and_never_sent_again",
    "tests/test_uncertain_publish.py::test_a_publish_refused_before_it_was_sent_stays_due_and_goes_out_once",
    "tests/test_rabbitmq.py::test_with_confirms_and_a_confirm_timeout_a_cut_link_costs_that_tick_once_and_never_doubles",
    "tests/test_rabbitmq.py::test_a_nack_arrives_wrapped_and_is_not_taken_for_an_outage",
    "tests/test_publish_classification.py",
]
#: The Redis batch publish (zkbeat.leading.batch_publish): it exists only with kombu 5.7's producer, and its
#: shapes are cut from the message Celery builds, read through Celery's own ``Signal.receivers``. Each Celery
#: session whose kombu has that producer runs it (``_celery_selection``); elsewhere the path is never taken.
BATCH_PUBLISH = ["tests/test_batch_publish.py"]
#: The first kombu with a Redis publish batch (zkbeat.leading.batch_publish.can_batch).
BATCH_KOMBU = (5, 7)
#: ONE real 3-replica failover (kill -9), in every session.
FAILOVER = ["tests/test_failover.py::test_kill_9_of_the_leader_repeatedly[redis]"]
#: What a django-celery-beat session runs: the DatabaseScheduler tests and ONE of its failovers.
DJANGO_IN_PROCESS = [
    "tests/test_django.py",
    # The admin app against django-celery-beat's admin of each version: the tests without replicas.
    "tests/test_django_admin.py::test_actions_need_the_change_permission",
    "tests/test_django_admin.py::test_layout_guard_refuses_with_a_message_per_row",
    "tests/test_django_admin.py::test_zookeeper_down_the_admin_still_renders",
    "tests/test_django_admin.py::test_without_the_app_nothing_is_registered",
    "tests/test_django_admin.py::test_a_page_reads_its_rows_in_one_batch",
    "tests/test_django_admin.py::test_the_celery_app_named_by_a_django_setting",
    "tests/test_django_admin.py::test_installed_in_any_order_and_only_with_django_celery_beat",
]
DJANGO_FAILOVER = [
    "tests/test_django_failover.py::test_kill_9_then_sigterm_each_tick_once_and_only_leaders_write[redis]"
]

CELERY_SELECTION = IN_PROCESS + CELERY_SIDE + FAILOVER
KAZOO_SELECTION = IN_PROCESS + FAILOVER
PYTHON_SELECTION = IN_PROCESS + FAILOVER
DJANGO_SELECTION = DJANGO_IN_PROCESS + FAILOVER + DJANGO_FAILOVER
FLOORS_SELECTION = IN_PROCESS + CELERY_SIDE + DJANGO_IN_PROCESS + FAILOVER + DJANGO_FAILOVER

#: Each Celery minor (newest patch) with the kombu minor released beside it.
CELERY = {
    "5.3": {"celery": "5.3.6", "kombu": "5.3.7"},
    "5.4": {"celery": "5.4.0", "kombu": "5.4.2"},
    "5.5": {"celery": "5.5.3", "kombu": "5.5.4"},
    "5.6": {"celery": "5.6.3", "kombu": "5.6.2"},
    "5.7": {"celery": "5.7.0", "kombu": "5.7.0"},
}
KAZOO = {"2.9": "2.9.0", "2.11": "2.11.0"}
#: django-celery-beat with each Django it supports among the LTS releases and the newest
#: on Python 3.11 (Django 6 needs Python 3.12; django-celery-beat 2.5 needs Django < 5).
DJANGO = {
    ("2.5", "4.2"): {"django-celery-beat": "2.5.0", "django": "4.2.30"},
    ("2.9", "4.2"): {"django-celery-beat": "2.9.0", "django": "4.2.30"},
    ("2.9", "5.2"): {"django-celery-beat": "2.9.0", "django": "5.2.19"},
}

NEWEST = {**CELERY["5.7"], "kazoo": KAZOO["2.11"]}
FLOORS = {**CELERY["5.3"], "kazoo": KAZOO["2.9"], **DJANGO[("2.5", "4.2")]}


def _celery_selection(pins: dict[str, str]) -> list[str]:
    """A Celery session's tests: CELERY_SELECTION, and BATCH_PUBLISH where its kombu has the batch producer."""
    kombu = tuple(int(part) for part in pins["kombu"].split(".")[:2])
    return CELERY_SELECTION + (BATCH_PUBLISH if kombu >= BATCH_KOMBU else [])


def _run(
    session: nox.Session, pins: dict[str, str], tests: list[str], extras: str = "test", python: str = PYTHON
) -> None:
    """Install zkbeat with exact pins, run the selection, and record the outcome and time."""
    started = time.monotonic()
    result = "failed"
    try:
        with _locked("install"):
            session.install("-e", f".[{extras}]", *(f"{name}=={version}" for name, version in pins.items()))
        session.run("python", "-c", _VERSIONS)
        session.run("python", "-m", "pytest", "-q", *tests, *session.posargs)
        result = "passed"
    finally:
        shown = pins if python == PYTHON else {"python": python, **pins}
        _record(session.name, result, time.monotonic() - started, shown)


#: Printed first in each session: the versions actually installed, not the ones asked for.
_VERSIONS = """
import importlib.metadata as metadata
import platform
print(f"  python {platform.python_version()}")
for name in ("celery", "kombu", "kazoo", "django-celery-beat", "django"):
    try:
        print(f"  {name} {metadata.version(name)}")
    except metadata.PackageNotFoundError:
        pass
"""


@contextlib.contextmanager
def _locked(name: str):
    """Hold ``.nox/<name>.lock`` against the sessions running beside this one."""
    RESULTS.parent.mkdir(exist_ok=True)
    with open(RESULTS.parent / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _record(name: str, result: str, seconds: float, pins: dict[str, str]) -> None:
    with _locked("matrix"):
        runs = json.loads(RESULTS.read_text()) if RESULTS.exists() else []
        runs.append({"session": name, "result": result, "seconds": round(seconds, 1), "pins": pins})
        RESULTS.write_text(json.dumps(runs, indent=2) + "\n")


def interpreter(version: str, pyenv_root: Path | None = None) -> str:
    """The interpreter nox should use for ``version``: pyenv's own, by path, when it has one.

    ``$PYENV_ROOT/versions/<version>.<patch>/bin/python<version>``, the newest
    patch; otherwise ``version`` itself, for nox and uv to find on ``PATH``.
    """
    root = pyenv_root or Path(os.environ.get("PYENV_ROOT") or Path.home() / ".pyenv")
    found = []
    for candidate in (root / "versions").glob(f"{version}.*/bin/python{version}"):
        patch = candidate.parent.parent.name[len(version) + 1 :]
        if patch.isdigit() and os.access(candidate, os.X_OK):
            found.append((int(patch), str(candidate)))
    return max(found)[1] if found else version


def _session(name: str, pins: dict[str, str], tests: list[str], extras: str = "test", python: str = PYTHON) -> None:
    @nox.session(name=name, python=interpreter(python))
    def run(session: nox.Session) -> None:
        _run(session, pins, tests, extras, python)

    run.__doc__ = ", ".join(f"{n} {v}" for n, v in pins.items()) + f" on Python {python}"


for minor, celery_pins in CELERY.items():
    _session(f"celery-{minor}", {**NEWEST, **celery_pins}, _celery_selection(celery_pins))
_session("kazoo-2.9", {**NEWEST, "kazoo": KAZOO["2.9"]}, KAZOO_SELECTION)
# kazoo 2.11 with Celery 5.7 is the celery-5.7 session: no second copy.
for (beat, django), django_pins in DJANGO.items():
    _session(f"django-celery-beat-{beat}-django-{django}", {**NEWEST, **django_pins}, DJANGO_SELECTION, "test,django")
_session("floors", FLOORS, FLOORS_SELECTION, "test,django")
for version in NEWER_PYTHONS:
    _session(f"python-{version}", NEWEST, PYTHON_SELECTION, python=version)


def table(runs: list[dict]) -> str:
    """The Markdown table of one run: session, result, time, and the total."""
    lines = ["| environment | result | time |", "|---|---|---|"]
    for run in runs:
        pins = ", ".join(f"{n} {v}" for n, v in run["pins"].items())
        lines.append(f"| {run['session']} ({pins}) | {run['result']} | {_minutes(run['seconds'])} |")
    total = sum(run["seconds"] for run in runs)
    passed = sum(run["result"] == "passed" for run in runs)
    lines.append(f"| **{passed}/{len(runs)} passed** | | **{_minutes(total)}** |")
    return "\n".join(lines)


def _minutes(seconds: float) -> str:
    return f"{int(seconds // 60)}m{int(seconds % 60):02d}s"


if __name__ == "__main__":
    if not RESULTS.exists():
        sys.exit(f"no matrix run recorded in {RESULTS}")
    print(table(json.loads(RESULTS.read_text())))

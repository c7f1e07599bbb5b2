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

Only Python 3.11 is tested: it is the only interpreter on these machines,
and ``python_requires`` says so.

``python noxfile.py`` prints the table of the last run (session, result,
time) from ``.nox/matrix.json``, which each session appends to.
"""

from __future__ import annotations

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
    # Read off tracebacks of kombu, redis-py and py-amqp: proved on each of their versions.
    "tests/test_uncertain_publish.py::test_a_publish_whose_reply_is_lost_is_in_the_queue_once_and_never_sent_again",
]
#: ONE real 3-replica failover (kill -9), in every session.
FAILOVER = ["tests/test_failover.py::test_kill_9_of_the_leader_repeatedly[redis]"]
#: What a django-celery-beat session runs: the DatabaseScheduler tests and ONE of its failovers.
DJANGO_IN_PROCESS = ["tests/test_django.py"]
DJANGO_FAILOVER = [
    "tests/test_django_failover.py::test_kill_9_then_sigterm_each_tick_once_and_only_leaders_write[redis]"
]

CELERY_SELECTION = IN_PROCESS + CELERY_SIDE + FAILOVER
KAZOO_SELECTION = IN_PROCESS + FAILOVER
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


def _run(session: nox.Session, pins: dict[str, str], tests: list[str], extras: str = "test") -> None:
    """Install zkbeat with exact pins, run the selection, and record the outcome and time."""
    started = time.monotonic()
    result = "failed"
    try:
        session.install("-e", f".[{extras}]", *(f"{name}=={version}" for name, version in pins.items()))
        session.run("python", "-c", _VERSIONS)
        session.run("python", "-m", "pytest", "-q", *tests, *session.posargs)
        result = "passed"
    finally:
        _record(session.name, result, time.monotonic() - started, pins)


#: Printed first in each session: the versions actually installed, not the ones asked for.
_VERSIONS = """
import importlib.metadata as metadata
for name in ("celery", "kombu", "kazoo", "django-celery-beat", "django"):
    try:
        print(f"  {name} {metadata.version(name)}")
    except metadata.PackageNotFoundError:
        pass
"""


def _record(name: str, result: str, seconds: float, pins: dict[str, str]) -> None:
    RESULTS.parent.mkdir(exist_ok=True)
    runs = json.loads(RESULTS.read_text()) if RESULTS.exists() else []
    runs.append({"session": name, "result": result, "seconds": round(seconds, 1), "pins": pins})
    RESULTS.write_text(json.dumps(runs, indent=2) + "\n")


def _session(name: str, pins: dict[str, str], tests: list[str], extras: str = "test") -> None:
    @nox.session(name=name, python=PYTHON)
    def run(session: nox.Session) -> None:
        _run(session, pins, tests, extras)

    run.__doc__ = ", ".join(f"{n} {v}" for n, v in pins.items())


for minor, celery_pins in CELERY.items():
    _session(f"celery-{minor}", {**NEWEST, **celery_pins}, CELERY_SELECTION)
_session("kazoo-2.9", {**NEWEST, "kazoo": KAZOO["2.9"]}, KAZOO_SELECTION)
# kazoo 2.11 with Celery 5.7 is the celery-5.7 session: no second copy.
for (beat, django), django_pins in DJANGO.items():
    _session(f"django-celery-beat-{beat}-django-{django}", {**NEWEST, **django_pins}, DJANGO_SELECTION, "test,django")
_session("floors", FLOORS, FLOORS_SELECTION, "test,django")


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

"""The `zkbeat` command's answer to a bad flag or argument, as docs/operating.md states it: exit status 2,
"always with a one-line reason on stderr and never a traceback", and "with --json every outcome, failures
included, is one JSON object on stdout". Nothing here reaches ZooKeeper: each is refused before it asks."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.support.processes import ROOT

#: (arguments, the flag the reason names). Each is refused while its arguments are read.
BAD = [
    (["--timeout", "-1", "status"], "--timeout"),
    (["--timeout", "nan", "status"], "--timeout"),
    (["--timeout", "inf", "status"], "--timeout"),
    (["next", "x", "-n", "0"], "-n"),
    (["next", "x", "-n", "1001"], "-n"),
    (["trigger", "x", "--wait-timeout", "-1"], "--wait-timeout"),
    (["trigger", "x", "--wait-timeout", "nan"], "--wait-timeout"),
    (["trigger", "x", "--wait-timeout", "inf"], "--wait-timeout"),
    (["step-down", "--wait-timeout", "-5"], "--wait-timeout"),
    (["step-down", "--shard", "-1"], "--shard"),
    (["status", "--no-such-flag"], "--no-such-flag"),
    (["history"], "ENTRY"),
    (["dashboard", "--port", "99999"], "--port"),
    (["dashboard", "--port", "-1"], "--port"),
]


def zkbeat(*args: str) -> subprocess.CompletedProcess:
    """`python -m zkbeat` on a ZooKeeper nobody listens on (the flags are refused before it would be asked)."""
    return subprocess.run(
        [sys.executable, "-m", "zkbeat", "--hosts", "127.0.0.1:1", "--root", "/nowhere", *args],
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )


@pytest.mark.parametrize(("args", "flag"), BAD, ids=[" ".join(args) for args, _ in BAD])
def test_a_bad_flag_is_one_line_exit_2_and_with_json_one_json_object(args: list[str], flag: str) -> None:
    """Exit 2, one line on stderr naming the flag, no traceback; with --json also one JSON object on stdout."""
    text = zkbeat(*args)
    assert text.returncode == 2, (text.returncode, text.stderr)
    assert "Traceback" not in text.stderr, text.stderr
    lines = text.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("zkbeat: ") and f"'{flag}'" in lines[0], text.stderr
    if not {"status", "history", "next", "trigger"} & set(args):
        return  # step-down and the dashboard take no --json
    as_json = zkbeat(*args, "--json")
    assert as_json.returncode == 2, as_json.stderr
    answer = json.loads(as_json.stdout)
    assert answer["ok"] is False and answer["exit_status"] == 2 and f"'{flag}'" in answer["error"], answer


def test_help_and_version_still_answer_with_0_and_no_command_shows_the_help() -> None:
    """The usual help and version, exit 0; `zkbeat` alone shows its help, exit 2, as it always did."""
    for args in (["--help"], ["status", "--help"], ["--version"]):
        shown = zkbeat(*args)
        assert shown.returncode == 0 and shown.stdout and shown.stderr == "", (args, shown.stdout, shown.stderr)
    bare = subprocess.run([sys.executable, "-m", "zkbeat"], env={**os.environ, "PYTHONPATH": str(ROOT)},
                          capture_output=True, text=True, timeout=60, cwd=ROOT)  # fmt: skip
    assert bare.returncode == 2 and bare.stderr.startswith("Usage: zkbeat ") and "Commands:" in bare.stderr


def test_as_a_celery_subcommand_a_bad_flag_is_one_line_too() -> None:
    """`celery -A proj zkbeat ...` is the same command (operating.md): a refused flag is one line, exit 2."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "ZKBEAT_HOSTS": "127.0.0.1:1", "ZKBEAT_TEST_ROOT": "/nowhere",
           "ZKBEAT_TEST_BROKER": "redis://127.0.0.1:1/0"}  # fmt: skip
    result = subprocess.run(
        [sys.executable, "-m", "celery", "-A", "tests.support.beatapp", "zkbeat", "status", "--json", "--bogus"],
        env=env, capture_output=True, text=True, timeout=60, cwd=ROOT,
    )  # fmt: skip
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("zkbeat: No such option '--bogus'. (see "), result.stderr
    assert lines[0].endswith("celery zkbeat status --help)"), result.stderr
    assert json.loads(result.stdout)["exit_status"] == 2

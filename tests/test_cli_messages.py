"""The `zkbeat` command's words, in-process against a real ZooKeeper: what it
says when it finds nothing (and what it used), when the leader left before it
could ask it to step down, how it shows a crontab's next run and the
candidates' epochs, and that its help has no reST markup."""

from __future__ import annotations

import json

import pytest
from celery import Celery
from celery.schedules import crontab
from click.testing import CliRunner
from kazoo.client import KazooClient

from tests.support.helpers import Published, every, lead, wait_for
from tests.support.servers import ZooKeeperServer, free_port
from tests.test_security import app_for, output_of, run_cli
from zkbeat.ops import cli as cli_module
from zkbeat.ops.cli import main as zkbeat_command


def test_help_has_no_markup() -> None:
    """`zkbeat --help` and each command's help read as plain text."""
    for args in ([], ["trigger"], ["pause"], ["health"], ["status"], ["history"], ["next"]):
        result = CliRunner().invoke(zkbeat_command, [*args, "--help"])
        assert result.exit_code == 0 and "``" not in result.stdout, result.stdout
    assert "The zkbeat command" in CliRunner().invoke(zkbeat_command, ["--help"]).stdout


def test_finding_nothing_names_what_was_used_and_what_to_pass(
    zk_server: ZooKeeperServer, zk_client: KazooClient, zk_root: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without -A: the root it looked at, where each value came from, and the hint to pass -A or --root; the
    same for hosts that do not answer and for an election nobody joined."""
    monkeypatch.delenv("ZKBEAT_HOSTS", raising=False)
    missing = run_cli(None, "--hosts", zk_server.hosts, "status", monkeypatch=monkeypatch)
    text = output_of(missing)
    assert missing.exit_code == 1 and len(text.strip().splitlines()) == 1, text
    expected = ["/zkbeat/default does not exist", "no app (-A)", f"hosts {zk_server.hosts} (--hosts)",
                "root /zkbeat/default (the default without an app)", "-A proj", "no replica has started"]  # fmt: skip
    for words in expected:
        assert words in text, (words, text)

    port = free_port()
    unreachable = run_cli(None, "--hosts", f"127.0.0.1:{port}", "--timeout", "0.5", "health", monkeypatch=monkeypatch)
    text = output_of(unreachable)
    assert unreachable.exit_code == 2 and f"hosts 127.0.0.1:{port} (--hosts)" in text and "-A proj" in text, text

    zk_client.ensure_path(f"{zk_root}/v1/election")
    app = app_for({"zkbeat_hosts": zk_server.hosts, "zkbeat_root": zk_root})
    nobody = run_cli(app, "health", monkeypatch=monkeypatch)
    text = output_of(nobody)
    assert nobody.exit_code == 1 and f"no replica is in the election under {zk_root}" in text, text
    assert "app 'zkbeat-security'" in text and f"root {zk_root} (the app's zkbeat_root)" in text, text
    as_json = run_cli(app, "status", "--json", monkeypatch=monkeypatch)
    assert json.loads(as_json.stdout)["leader"] is None


def test_step_down_says_when_the_leader_had_left_already(
    make_scheduler, published: Published, zk_server: ZooKeeperServer, zk_root: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The leader leaves between the command's read and its delete: the command says so, not "asked X"."""
    leader = make_scheduler({"tidy": every(0.2)}, identity="leaving")
    lead(leader)
    wait_for(lambda: leader.tick() is not None and published.headers, timeout=15)
    read = cli_module._read

    def read_then_leave(target, client):
        found = read(target, client)
        leader.close()  # its SIGTERM lands just after the command looked
        return found

    monkeypatch.setattr(cli_module, "_read", read_then_leave)
    app = app_for({"zkbeat_hosts": zk_server.hosts, "zkbeat_root": zk_root})
    result = run_cli(app, "step-down", monkeypatch=monkeypatch)
    assert result.exit_code == 0, output_of(result)
    assert "leaving (epoch" in result.stdout and "had left the election already" in result.stdout
    assert not result.stdout.startswith("asked")


def test_status_shows_a_crontab_due_on_the_minute_and_epochs_only_for_the_leader(
    make_scheduler, published: Published, zk_server: ZooKeeperServer, zk_root: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A crontab's next run shows as the minute it is due (…:00, not …:59), and only the leader has an epoch."""

    def entries(app: Celery) -> dict:
        return {"minutely": {"task": "zkbeat.test", "schedule": crontab(minute="*", app=app)}, "tidy": every(0.2)}

    leader = make_scheduler(entries, identity="the-leader")
    lead(leader)
    wait_for(lambda: leader.tick() is not None and published.count("tidy"), timeout=15)
    follower = make_scheduler(entries, identity="the-follower")
    wait_for(lambda: follower.election.candidate is not None)
    app = Celery("zkbeat-status", set_as_current=False)
    app.conf.update(zkbeat_hosts=zk_server.hosts, zkbeat_root=zk_root, beat_schedule=entries(app))

    def status() -> dict:
        return json.loads(run_cli(app, "status", "--json", monkeypatch=monkeypatch).stdout)

    def due_of(found: dict) -> str:
        return next(e for e in found["entries"] if e["name"] == "minutely")["next_due"]

    def in_one_minute() -> tuple[dict, str] | None:
        """The JSON and the text of runs within one minute: the crontab never ran, so each run counts from its
        own clock, and runs either side of a minute's end name next runs a minute apart."""
        found = status()
        text = run_cli(app, "status", monkeypatch=monkeypatch).stdout
        return (found, text) if due_of(status()) == due_of(found) else None

    found, text = wait_for(in_one_minute, timeout=30)
    due = due_of(found)
    assert due.endswith(":00+00:00"), due
    assert [c["epoch"] for c in found["candidates"]] == [leader.election.epoch, None]
    row = next(line for line in text.splitlines() if line.strip().startswith("minutely"))
    assert f"{due[11:19]} (in" in row, (due, row)
    follower_row = next(line for line in text.splitlines() if "the-follower" in line)
    assert follower_row.split()[1] == "-", follower_row


def test_status_lists_the_20_entries_due_soonest_unless_all(
    zk_server: ZooKeeperServer, zk_client: KazooClient, zk_root: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """operating.md: `zkbeat status` shows each entry's next due time, "the 20 due soonest unless --all". 25
    entries whose names sort against their order of due times: the 20 due first, in that order, then a line
    saying how many more; --all lists all 25."""
    zk_client.ensure_path(f"{zk_root}/v1/election")
    schedule = {f"entry-{26 - i:02d}": every(60 * i) for i in range(1, 26)}  # entry-25 is due first
    app = app_for({"zkbeat_hosts": zk_server.hosts, "zkbeat_root": zk_root, "beat_schedule": schedule})

    def names(text: str) -> list[str]:
        return [line.split()[0] for line in text.splitlines() if line.startswith("  entry-")]

    shown = run_cli(app, "status", monkeypatch=monkeypatch)
    assert shown.exit_code == 0, output_of(shown)
    assert names(shown.stdout) == [f"entry-{26 - i:02d}" for i in range(1, 21)], shown.stdout
    assert "entries (25):" in shown.stdout and "  ... 5 more (--all)" in shown.stdout, shown.stdout
    every_one = run_cli(app, "status", "--all", monkeypatch=monkeypatch)
    assert names(every_one.stdout) == [f"entry-{26 - i:02d}" for i in range(1, 26)], every_one.stdout
    assert "more (--all)" not in every_one.stdout

"""The ``zkbeat`` command: status, step-down and health of a zkbeat cluster; pause, resume and trigger entries.

Works from a Celery app (``zkbeat -A proj status``, reading its zkbeat_*
settings as ``celery -A`` does), from flags (``--hosts``, ``--root``), and as
``celery -A proj zkbeat status``. Exit status: 0 fine, 1 unhealthy or timed
out, 2 cannot even ask (ZooKeeper unreachable, app not importable, bad flags).
"""

from __future__ import annotations

import getpass
import json
import logging
import socket
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, fields
from datetime import datetime, timezone
from typing import Any, NoReturn

import click
from kazoo.client import KazooClient
from kazoo.exceptions import KazooException, NoAuthError, NoNodeError, ZookeeperError
from kazoo.handlers.threading import KazooTimeoutError

from . import __version__, controls
from ._zookeeper import make_client
from .conf import Settings, parse_hosts, parse_root, read_settings
from .exceptions import ConfigurationError
from .layout import LAYOUT_DIR
from .status import ClusterStatus, NotAZkbeatRoot, read_election, read_status

__all__ = ["main", "celery_command"]

#: Entries shown by `status` unless --all.
ENTRY_LIMIT = 20


@dataclass
class Target:
    """Which cluster a command talks to, and the app's schedule if known."""

    settings: Settings
    app: Any = None
    timeout: float = 10.0

    def schedule(self) -> dict[str, Any] | None:
        if self.app is None:
            return None
        from celery.beat import ScheduleEntry

        entries = {}
        for name, spec in (self.app.conf.beat_schedule or {}).items():
            try:
                entries[name] = ScheduleEntry(**dict(spec, name=name, app=self.app))
            except Exception:  # noqa: BLE001 - one bad entry must not hide the rest
                continue
        return entries


#: ``zkbeat trigger``: the run was sent and the broker never answered (see docs/operating.md).
UNCERTAIN_EXIT = 3


def _fail(code: int, message: str) -> NoReturn:
    click.echo(f"zkbeat: {message}", err=True)
    sys.exit(code)


@contextmanager
def _connected(target: Target) -> Iterator[KazooClient]:
    client = make_client(target.settings)
    try:
        client.start(timeout=target.timeout)
    except (KazooTimeoutError, KazooException) as exc:
        client.close()
        _fail(2, f"cannot reach ZooKeeper at {target.settings.hosts} within {target.timeout:g}s ({exc or 'timeout'})")
    try:
        yield client
    except NoAuthError:
        # The root's ACL belongs to an identity this command did not present.
        _fail(
            2,
            f"ZooKeeper at {target.settings.hosts} denied access under {target.settings.root} (NoAuth): "
            "pass the app's zkbeat_auth with -A",
        )
    except (KazooException, ZookeeperError) as exc:
        _fail(2, f"ZooKeeper at {target.settings.hosts} answered with an error: {type(exc).__name__}")
    finally:
        client.stop()
        client.close()


def _build_target(app_name: str | None, hosts: str | None, root: str | None, timeout: float, app: Any = None) -> Target:
    if app is None and app_name:
        from celery.app.utils import find_app

        try:
            app = find_app(app_name)
        except Exception as exc:  # noqa: BLE001 - any import error is "cannot import the app"
            _fail(2, f"cannot import the Celery app {app_name!r}: {exc}")
    conf: dict[str, Any] = {}
    if app is not None:
        # By name, not by iterating app.conf: under Django's CELERY namespace
        # iteration yields CELERY_ZKBEAT_* keys; get() resolves both spellings.
        names = [f"zkbeat_{field.name}" for field in fields(Settings)]
        conf = {name: app.conf.get(name) for name in names if app.conf.get(name) is not None}
    try:
        if hosts:
            conf["zkbeat_hosts"] = parse_hosts("--hosts", hosts)
        if root:
            conf["zkbeat_root"] = parse_root("--root", root)
        settings = read_settings(conf, app.main if app is not None else None)
    except ConfigurationError as exc:
        _fail(2, str(exc))
    return Target(settings=settings, app=app, timeout=timeout)


def _target(ctx: click.Context) -> Target:
    obj = ctx.find_object(Target)
    if obj is not None:
        return obj
    # Run as `celery -A proj zkbeat ...`: Celery's context carries the app.
    celery_ctx = ctx.find_root().obj
    return _build_target(None, None, None, 10.0, app=getattr(celery_ctx, "app", None))


@click.group(help=__doc__.split("\n\n")[0])
@click.option("-A", "--app", "app_name", help="Celery app, as for `celery -A` (reads its zkbeat_* settings).")
@click.option("--hosts", help="ZooKeeper connect string (overrides the app's zkbeat_hosts).")
@click.option("--root", help="zkbeat root znode (overrides the app's zkbeat_root).")
@click.option("--timeout", default=10.0, show_default=True, help="Seconds to wait for ZooKeeper.")
@click.version_option(__version__, prog_name="zkbeat")
@click.pass_context
def main(ctx: click.Context, app_name: str | None, hosts: str | None, root: str | None, timeout: float) -> None:
    _quiet_kazoo()
    ctx.obj = _build_target(app_name, hosts, root, timeout)


def _quiet_kazoo() -> None:
    """kazoo logs every failed connect attempt; the command says it once, on one line."""
    logging.getLogger("kazoo").setLevel(logging.CRITICAL)


@click.group(name="zkbeat", help="zkbeat cluster status, step-down, health; pause, resume and trigger entries.")
def celery_command() -> None:
    """Entry point for `celery -A proj zkbeat ...`."""
    _quiet_kazoo()


def _read(target: Target, client: KazooClient) -> ClusterStatus:
    try:
        return read_status(client, target.settings.root, target.settings.hosts, target.schedule())
    except NotAZkbeatRoot as exc:
        _fail(1, str(exc))


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.option("--all", "show_all", is_flag=True, help=f"Show every entry, not the {ENTRY_LIMIT} due soonest.")
@click.pass_context
def status(ctx: click.Context, as_json: bool, show_all: bool) -> None:
    """Show the leader, every candidate in order, and each entry's runs."""
    target = _target(ctx)
    with _connected(target) as client:
        found = _read(target, client)
    if as_json:
        click.echo(json.dumps(found.as_dict(), indent=2, sort_keys=True))
        return
    click.echo(_render(found, show_all))


def _ago(iso: str | None) -> str:
    if not iso:
        return "-"
    try:
        moment = datetime.fromisoformat(iso)
    except ValueError:
        return iso
    seconds = (datetime.now(timezone.utc) - moment).total_seconds()
    stamp = moment.astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M:%S")
    if seconds >= 0:
        return f"{stamp} ({_span(seconds)} ago)"
    return f"{stamp} (in {_span(-seconds)})"


def _span(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f}{unit}"
    return f"{seconds:.0f}s"


def _printable(text: str) -> str:
    """``text`` with control characters escaped (``\\n``, ``\\x1b``).

    Entry names and candidate identities come from znodes that anyone allowed
    to write there controls: a newline must not forge a line of the report,
    nor an escape sequence drive the operator's terminal.
    """
    return "".join(ch if ch.isprintable() else ch.encode("unicode_escape").decode("ascii") for ch in text)


def _table(rows: list[list[str]]) -> list[str]:
    rows = [[_printable(cell) for cell in row] for row in rows]
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return ["  " + "  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip() for row in rows]


def _render(found: ClusterStatus, show_all: bool) -> str:
    lines = [f"zkbeat root {found.root} on {found.hosts}"]
    leader = found.leader
    if leader is None:
        lines.append("leader: none (no replica is in the election)")
    else:
        lines.append(
            _printable(
                f"leader: {leader.identity or '?'} (host {leader.host or '?'}, pid {leader.pid or '?'}) "
                f"epoch {leader.epoch}, leading since {_ago(leader.leader_since)}"
            )
        )
    rows = [["#", "epoch", "identity", "host", "pid", "started", "version"]]
    for place, c in enumerate(found.candidates, 1):
        identity = c.identity or ("<unreadable data>" if not c.readable else "?")
        rows.append(
            [str(place), str(c.epoch), identity, c.host or "-", str(c.pid or "-"), _ago(c.started_at), c.version or "-"]
        )
    lines.append(f"candidates ({len(found.candidates)}):")
    lines.extend(_table(rows) if found.candidates else ["  none"])
    entries = sorted(found.entries, key=lambda e: (e.next_due is None, e.next_due or "", e.name))
    shown = entries if show_all else entries[:ENTRY_LIMIT]
    lines.append(f"entries ({len(entries)}):")
    if shown:
        rows = [["name", "last run", "runs", "epoch", "next due", "state"]]
        for e in shown:
            last = _ago(e.last_run_at) if e.readable else "<unreadable data>"
            rows.append(
                [
                    e.name,
                    last,
                    "-" if e.total_run_count is None else str(e.total_run_count),
                    "-" if e.epoch is None else str(e.epoch),
                    _ago(e.next_due),
                    "paused" if e.paused else "active",
                ]
            )
        lines.extend(_table(rows))
    else:
        lines.append("  none")
    if len(shown) < len(entries):
        lines.append(f"  ... {len(entries) - len(shown)} more (--all)")
    paused = [e for e in entries if e.paused]
    if paused:
        lines.append(f"paused ({len(paused)}):")
        for e in paused:
            note = e.paused.get("note") or ""
            lines.append(
                _printable(
                    f"  {e.name}: by {e.paused.get('by') or '?'} at {_ago(e.paused.get('at'))}"
                    + (f": {note}" if note else "")
                )
            )
    return "\n".join(lines)


@click.command("step-down")
@click.option("--wait", is_flag=True, help="Return only when a new leader has published.")
@click.option("--wait-timeout", default=120.0, show_default=True, help="Seconds --wait waits at most.")
@click.pass_context
def step_down(ctx: click.Context, wait: bool, wait_timeout: float) -> None:
    """Make the leader give up leadership; it joins again at the back."""
    target = _target(ctx)
    with _connected(target) as client:
        leader = _read(target, client).leader
        if leader is None:
            _fail(1, "no leader to step down")
        try:
            client.delete(leader.znode)
        except NoNodeError:
            pass
        click.echo(f"asked {_printable(leader.identity or leader.znode)} (epoch {leader.epoch}) to step down")
        if not wait:
            return
        deadline = time.monotonic() + wait_timeout
        while time.monotonic() < deadline:
            found = _read(target, client)
            new = found.leader
            if new is not None and new.epoch != leader.epoch:
                if any(e.epoch is not None and e.epoch >= new.epoch for e in found.entries):
                    click.echo(f"{_printable(new.identity or '?')} (epoch {new.epoch}) leads and has published")
                    return
            time.sleep(0.2)
        _fail(1, f"no new leader published within {wait_timeout:g}s")


@click.command()
@click.option("--local", is_flag=True, help="Also require this replica (its /healthz) to be connected.")
@click.pass_context
def health(ctx: click.Context, local: bool) -> None:
    """Exit 0 when the cluster has a leader (and, with --local, this replica is connected).

    The leader is the head of the election (its lowest real candidate; a
    stranger's znode never counts) once it has said so on the election node.
    A head that has not said so within one session timeout is not leading: a
    stuck process, or a live session's node that no zkbeat runs behind.
    """
    target = _target(ctx)
    if local:
        _check_local(target)
    with _connected(target) as client:
        found = _read(target, client)
        if found.leader is not None and not found.leader_announced:
            found = _await_announcement(target, client, found)
    if found.leader is None:
        _fail(1, f"no leader: no replica is in the election under {found.root}")
    head = found.leader
    if not found.leader_announced:
        _fail(
            1,
            _printable(
                f"no leader: {head.identity or '?'} (epoch {head.epoch}, {head.znode}) heads the election but has "
                f"not taken the lead within the session timeout ({target.settings.session_timeout:g}s)"
            ),
        )
    ignored = f", {len(found.strangers)} stranger znode(s) ignored" if found.strangers else ""
    click.echo(
        f"ok: {_printable(head.identity or '?')} leads (epoch {head.epoch}), "
        f"{len(found.candidates)} candidate(s){ignored}"
    )


def _await_announcement(target: Target, client: KazooClient, found: ClusterStatus) -> ClusterStatus:
    """Re-read until the head announces its lead, for at most one session timeout.

    A handover takes milliseconds; a head still silent after a session
    timeout is not going to lead by itself.
    """
    path = f"{found.root.rstrip('/')}/{LAYOUT_DIR}/election"
    deadline = time.monotonic() + target.settings.session_timeout
    while time.monotonic() < deadline and found.leader is not None and not found.leader_announced:
        time.sleep(0.1)
        found.candidates, found.strangers = read_election(client, path)
    return found


def _check_local(target: Target) -> None:
    port = target.settings.metrics_port
    if port is None:
        _fail(2, "--local reads this replica's /healthz: set zkbeat_metrics_port")
    url = f"http://127.0.0.1:{port}/healthz"
    try:
        with urllib.request.urlopen(url, timeout=target.timeout) as answer:  # noqa: S310 - loopback only
            json.loads(answer.read())
    except urllib.error.HTTPError as exc:
        try:
            body = json.loads(exc.read())
        except ValueError:
            body = {}
        _fail(1, f"this replica is not connected to ZooKeeper ({body.get('zookeeper', exc.code)})")
    except (OSError, ValueError) as exc:
        _fail(1, f"this replica does not answer on {url} ({exc})")


def _operator() -> str:
    """Who runs this command, as kept with a pause or a trigger: ``user@host``."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = "?"
    return f"{user}@{socket.gethostname()}"


def _report(as_json: bool, data: dict[str, Any], text: str) -> None:
    click.echo(json.dumps(data, indent=2, sort_keys=True) if as_json else _printable(text))


def _control_failed(exc: controls.ControlError) -> NoReturn:
    # An entry that is not there: the question was fine, the answer is no (1), as status does for a root.
    _fail(1 if isinstance(exc, controls.UnknownEntryError) else 2, _printable(str(exc)))


@click.command()
@click.argument("entry")
@click.option("--note", default="", help=f"Why (shown by status; at most {controls.MAX_NOTE} chars).")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_context
def pause(ctx: click.Context, entry: str, note: str, as_json: bool) -> None:
    """Pause ENTRY on every replica: none of its ticks is published until it is resumed."""
    target = _target(ctx)
    try:
        controls.check_note(note)
    except controls.ControlError as exc:
        _control_failed(exc)
    with _connected(target) as client:
        try:
            state, changed = controls.pause(client, target.settings.root, entry, _operator(), note)
        except controls.ControlError as exc:
            _control_failed(exc)
    held = state.paused
    assert held is not None
    since = held.at.isoformat() if held.at else "?"
    text = f"{'paused' if changed else 'already paused:'} {entry} (by {held.by} at {since}" + (
        f", note: {held.note})" if held.note else ")"
    )
    _report(as_json, {"entry": entry, "paused": held.as_dict(), "changed": changed}, text)


@click.command()
@click.argument("entry")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_context
def resume(ctx: click.Context, entry: str, as_json: bool) -> None:
    """Resume ENTRY; what it missed while paused follows its catch-up policy."""
    target = _target(ctx)
    with _connected(target) as client:
        try:
            state, changed = controls.resume(client, target.settings.root, entry)
        except controls.ControlError as exc:
            _control_failed(exc)
    was = state.paused.as_dict() if changed and state.paused else None
    text = (
        f"resumed {entry}" + (f" (paused by {was['by']} at {was['at']})" if was else "")
        if changed
        else (f"{entry} was not paused")
    )
    _report(as_json, {"entry": entry, "was_paused": was, "changed": changed}, text)


@click.command()
@click.argument("entry")
@click.option("--no-wait", is_flag=True, help="Return once the request is made, not once it is published.")
@click.option("--wait-timeout", default=60.0, show_default=True, help="Seconds to wait for the publish at most.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_context
def trigger(ctx: click.Context, entry: str, no_wait: bool, wait_timeout: float, as_json: bool) -> None:
    """Run ENTRY once now, through the leader, exactly once (also while it is paused)."""
    target = _target(ctx)
    schedule = target.schedule() or {}
    with _connected(target) as client:
        started = time.monotonic()
        try:
            request = controls.request_trigger(
                client, target.settings.root, entry, _operator(), scheduled=entry in schedule
            )
        except controls.ControlError as exc:
            _control_failed(exc)
        name = request.rsplit("/", 1)[-1]
        if no_wait:
            _report(as_json, {"entry": entry, "request": name, "published": None}, f"asked to run {entry} ({name})")
            return
        receipt = controls.wait_published(client, target.settings.root, request, wait_timeout)
        waited = time.monotonic() - started
    if receipt is None:
        _fail(
            1,
            _printable(
                f"{entry} ({name}) was not published within {wait_timeout:g}s: no leader, or the broker is down; "
                "the request stays and runs once a leader can publish it"
            ),
        )
    data = {"entry": entry, "request": name, "published": receipt, "seconds": round(waited, 3)}
    task = f"task {receipt.get('task_id', '?')}, epoch {receipt.get('epoch', '?')}"
    if receipt.get("uncertain"):
        # Its own code: unlike a timeout (1, the request stays and still runs),
        # this run is over; asking again would be a second run.
        if as_json:
            _report(True, {**data, "uncertain": True}, "")
        _fail(
            UNCERTAIN_EXIT,
            _printable(
                f"{entry} ({name}) was sent as {task} but the broker never answered: it may or may not have "
                "arrived, and is not sent again; look for that task id in the worker's log before asking again"
            ),
        )
    _report(as_json, data, f"published {entry} ({name}) as {task}, {waited * 1000:.0f} ms after the request")


for _command in (status, step_down, health, pause, resume, trigger):
    main.add_command(_command)
    celery_command.add_command(_command)


if __name__ == "__main__":  # pragma: no cover
    main()

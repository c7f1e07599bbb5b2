"""The ``zkbeat`` command: status, step-down, health; pause, resume, trigger, history and next runs of entries.

Works from a Celery app (``zkbeat -A proj status``, reading its zkbeat_*
settings as ``celery -A`` does), from flags (``--hosts``, ``--root``), and as
``celery -A proj zkbeat status``. Exit status: 0 fine, 1 unhealthy, timed
out or refused, 2 cannot even ask (ZooKeeper unreachable, app not importable,
bad flags or arguments), 3 a run-now whose fate is unknown (see ``trigger``).
With ``--json`` every outcome, failures included, is one JSON object on
standard output (failures also keep their one line on standard error).
"""

from __future__ import annotations

import getpass
import json
import logging
import math
import os
import socket
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, fields
from datetime import datetime, timedelta, timezone
from typing import Any, NoReturn

import click
from kazoo.client import KazooClient
from kazoo.exceptions import KazooException, NoAuthError, NoNodeError, ZookeeperError
from kazoo.handlers.threading import KazooTimeoutError

from .. import __version__
from .._decode import json_object
from ..conf import Settings, parse_hosts, parse_root, read_settings
from ..coordination import shards as _shards
from ..coordination._zookeeper import apply_acl, make_client, owner_acl
from ..coordination.election import request_step_down
from ..coordination.layout import LAYOUT_DIR
from ..exceptions import ConfigurationError
from ..ledger import controls
from ..ledger.history import cut_identity, shown
from ..ledger.store import LedgerRecord
from . import status as _status
from .status import ClusterStatus, NotAZkbeatRoot, UnreadyMark, read_election, read_entry, read_status

__all__ = ["main", "celery_command"]

#: Entries shown by `status` unless --all.
ENTRY_LIMIT = 20
#: Most fire times `next -n` prints.
MAX_NEXT = 1000


@dataclass
class Target:
    """Which cluster a command talks to, and the app's schedule if known."""

    settings: Settings
    app: Any = None
    timeout: float = 10.0
    #: Where the hosts and the root came from, for messages that found nothing.
    hosts_from: str = "the default"
    root_from: str = "the default"
    #: The running command wants its outcome as JSON (failures too).
    as_json: bool = False

    def used(self) -> str:
        """What this command used, in words: app, hosts and root, and where each came from."""
        app = f"app {self.app.main!r}" if self.app is not None else "no app (-A)"
        return f"{app}, hosts {self.settings.hosts} ({self.hosts_from}), root {self.settings.root} ({self.root_from})"

    def hint(self) -> str:
        """What to try when nothing was found where this command looked."""
        if self.app is None:
            return "pass your Celery app with -A proj (its zkbeat_* settings), or --hosts and --root"
        return "check the app's zkbeat_hosts and zkbeat_root, or pass --hosts and --root"

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


def _fail(code: int, message: str, **data: Any) -> NoReturn:
    """End with ``code`` and one line on standard error; under --json also a JSON object on standard output."""
    context = click.get_current_context(silent=True)
    target = context.find_object(Target) if context is not None else None
    if target is not None and target.as_json:
        click.echo(json.dumps({"ok": False, "error": message, "exit_status": code, **data}, indent=2, sort_keys=True))
    click.echo(f"zkbeat: {message}", err=True)
    sys.exit(code)


def _plain(text: str) -> str:
    """Help text without reST markup (``zkbeat`` reads as zkbeat in a terminal)."""
    return text.replace("``", "")


@contextmanager
def _connected(target: Target) -> Iterator[KazooClient]:
    client = make_client(target.settings)
    try:
        client.start(timeout=target.timeout)
    except (KazooTimeoutError, KazooException) as exc:
        client.close()
        _fail(
            2,
            f"cannot reach ZooKeeper at {target.settings.hosts} within {target.timeout:g}s ({exc or 'timeout'}); "
            f"used {target.used()}: {target.hint()}",
        )
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
    hosts_from = "the app's zkbeat_hosts" if "zkbeat_hosts" in conf else "the default"
    if "zkbeat_hosts" not in conf and os.environ.get("ZKBEAT_HOSTS"):
        hosts_from = "$ZKBEAT_HOSTS"
    root_from = "the app's zkbeat_root" if "zkbeat_root" in conf else "the default"
    if root_from == "the default":
        root_from = "the default, /zkbeat/<app.main>" if app is not None else "the default without an app"
    try:
        if hosts:
            conf["zkbeat_hosts"] = parse_hosts("--hosts", hosts)
            hosts_from = "--hosts"
        if root:
            conf["zkbeat_root"] = parse_root("--root", root)
            root_from = "--root"
        settings = read_settings(conf, app.main if app is not None else None)
    except ConfigurationError as exc:
        _fail(2, str(exc))
    return Target(settings=settings, app=app, timeout=timeout, hosts_from=hosts_from, root_from=root_from)


def _target(ctx: click.Context) -> Target:
    obj = ctx.find_object(Target)
    if obj is not None:
        return obj
    # Run as `celery -A proj zkbeat ...`: Celery's context carries the app.
    celery_ctx = ctx.find_root().obj
    target = _build_target(None, None, None, 10.0, app=getattr(celery_ctx, "app", None))
    ctx.obj = target  # found again by _fail (--json)
    return target


class _Seconds(click.FloatRange):
    """A number of seconds in a range, and finite: nan and inf would reach kazoo and threading as a timeout."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        number = super().convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number of seconds", param, ctx)
        return number


#: A number of seconds to wait for ZooKeeper: more than nothing.
_SECONDS = _Seconds(min=0, min_open=True)
#: A number of seconds to wait for the cluster: none at all is a valid answer ("what is it now?").
_WAIT = _Seconds(min=0)


def _usage_failed(exc: click.UsageError, args: list[str]) -> NoReturn:
    """A flag or argument click refused: one line (and the JSON object under --json), exit 2, as every failure.

    A command given no arguments at all shows its help, as before.
    """
    if isinstance(exc, click.exceptions.NoArgsIsHelpError):
        raise exc
    message = exc.format_message().replace("\n", " ")
    if exc.ctx is not None:
        message += f" (see {exc.ctx.command_path} --help)"
    if "--json" in args:
        click.echo(json.dumps({"ok": False, "error": message, "exit_status": 2}, indent=2, sort_keys=True))
    click.echo(f"zkbeat: {message}", err=True)
    sys.exit(2)


class _Group(click.Group):
    """The `zkbeat` command: a flag or argument it refuses is answered as any other failure (see _fail)."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        ctx.meta["zkbeat.args"] = list(args)
        return super().parse_args(ctx, args)

    def make_context(self, info_name: str | None, args: list[str], parent: click.Context | None = None, **extra: Any):
        try:
            return super().make_context(info_name, args, parent, **extra)
        except click.UsageError as exc:
            _usage_failed(exc, list(args))

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except click.UsageError as exc:  # a subcommand's own flags and arguments
            _usage_failed(exc, ctx.meta.get("zkbeat.args", []))


@click.group(cls=_Group, help=_plain(__doc__.split("\n\n")[0]))
@click.option("-A", "--app", "app_name", help="Celery app, as for `celery -A` (reads its zkbeat_* settings).")
@click.option("--hosts", help="ZooKeeper connect string (overrides the app's zkbeat_hosts).")
@click.option("--root", help="zkbeat root znode (overrides the app's zkbeat_root).")
@click.option("--timeout", type=_SECONDS, default=10.0, show_default=True, help="Seconds to wait for ZooKeeper.")
@click.version_option(__version__, prog_name="zkbeat")
@click.pass_context
def main(ctx: click.Context, app_name: str | None, hosts: str | None, root: str | None, timeout: float) -> None:
    _quiet_kazoo()
    ctx.obj = _build_target(app_name, hosts, root, timeout)


def _quiet_kazoo() -> None:
    """kazoo logs every failed connect attempt; the command says it once, on one line."""
    logging.getLogger("kazoo").setLevel(logging.CRITICAL)


@click.group(
    cls=_Group,
    name="zkbeat",
    help="zkbeat cluster status, step-down, health; pause, resume and trigger entries; their history and next runs.",
)
def celery_command() -> None:
    """Entry point for `celery -A proj zkbeat ...`."""
    _quiet_kazoo()


def _read(target: Target, client: KazooClient) -> ClusterStatus:
    try:
        return read_status(
            client, target.settings.root, target.settings.hosts, target.schedule(), shards=target.settings.shards
        )
    except NotAZkbeatRoot as exc:
        _fail(1, f"{exc}; used {target.used()}: {target.hint()}, or no replica has started under this root yet")


def _nobody(target: Target) -> str:
    """Why an empty election may be the wrong one."""
    return (
        f"no replica is in the election under {target.settings.root} (none has started, or they use another "
        f"root: used {target.used()})"
    )


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.option("--all", "show_all", is_flag=True, help=f"Show every entry, not the {ENTRY_LIMIT} due soonest.")
@click.pass_context
def status(ctx: click.Context, as_json: bool, show_all: bool) -> None:
    """Show the leader, every candidate in order, each entry's runs, and run-now requests waiting."""
    target = _target(ctx)
    target.as_json = as_json
    with _connected(target) as client:
        found = _read(target, client)
    if as_json:
        click.echo(json.dumps(found.as_dict(), indent=2, sort_keys=True))
        return
    click.echo(_render(found, show_all, target))


def _ago(iso: str | None) -> str:
    if not iso:
        return "-"
    try:
        moment = datetime.fromisoformat(iso)
    except ValueError:
        return iso
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=timezone.utc)
    seconds = (datetime.now(timezone.utc) - moment).total_seconds()
    try:
        # To the nearest second: a crontab due at 18:39:00 computed as 18:38:59.9999 reads 18:39:00.
        shown = (moment + timedelta(microseconds=500_000)).replace(microsecond=0)
        stamp = shown.astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M:%S")
    except OverflowError:  # the calendar's last half second (a stranger's time): shown as written
        return iso
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


def _unready_line(mark: UnreadyMark) -> str:
    """One replica's unready mark: who, why and since when; also of one in no line (it stepped aside a while)."""
    where = "" if mark.in_line else ", in no line"
    who = f"{mark.identity or f'replica {mark.replica}'} (pid {mark.pid or '?'}{where})"
    return f"not ready to lead: {who}: {mark.why}, since {_ago(mark.since)}; handed no shard"


def _render(found: ClusterStatus, show_all: bool, target: Target) -> str:
    lines = [f"zkbeat root {found.root} on {found.hosts}"]
    head, leader = found.head, found.leader
    if found.sharded:
        lines.extend(_render_shards(found, target))
    elif head is None:
        lines.append(f"leader: none ({_nobody(target)}: {target.hint()})")
    elif leader is None:
        lines.append(
            _printable(
                f"leader: none yet: {head.identity or '?'} (host {head.host or '?'}, pid {head.pid or '?'}) heads the "
                "line but has not run a pass as leader (taking over, refusing to lead, or stuck)"
            )
        )
    else:
        lines.append(
            _printable(
                f"leader: {leader.identity or '?'} (host {leader.host or '?'}, pid {leader.pid or '?'}) "
                f"epoch {leader.epoch}, leading since {_ago(leader.leader_since)}"
            )
        )
    rows = [["#", "leads" if found.sharded else "epoch", "identity", "host", "pid", "started", "version"]]
    for place, c in enumerate(found.candidates, 1):
        identity = c.identity or ("<unreadable data>" if not c.readable else "?")
        epoch = _shards_led(found, c) if found.sharded else "-" if c.epoch is None else str(c.epoch)
        version = f"{c.version or '?'} (layout {c.layout or '?'})" if c.readable else "-"
        rows.append([str(place), epoch, identity, c.host or "-", str(c.pid or "-"), _ago(c.started_at), version])
    lines.append(f"{'replicas' if found.sharded else 'candidates'} ({len(found.candidates)}):")
    lines.extend(_table(rows) if found.candidates else ["  none"])
    lines.extend(_printable(_unready_line(mark)) for mark in found.unready)
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
    if found.pending:
        lines.append(f"run-now requests waiting ({len(found.pending)}):")
        for request in found.pending:
            held = request.get("held")
            why = held.get("why") if isinstance(held, dict) else held
            lines.append(
                _printable(
                    f"  {request['request']}: {request.get('entry') or '?'} by {request.get('by') or '?'} "
                    f"at {_ago(request.get('at'))}" + (f": {why}" if why else "")
                )
            )
    return "\n".join(lines)


def _render_shards(found: ClusterStatus, target: Target) -> list[str]:
    """One line per shard: who leads it (or heads its line), its epoch and its entries."""
    lines = [f"shards ({len(found.shards)}):"]
    for shard in found.shards:
        name = f"  shard {shard.shard}/{shard.count} ({shard.entries} entries): "
        head, leader = shard.head, shard.leader
        if head is None:
            lines.append(f"{name}leader: none (no replica is in its election)")
        elif leader is None:
            lines.append(_printable(f"{name}leader: none yet: {head.identity or '?'} heads the line"))
        else:
            lines.append(
                _printable(
                    f"{name}leader: {leader.identity or '?'} (host {leader.host or '?'}, pid {leader.pid or '?'}) "
                    f"epoch {leader.epoch}, leading since {_ago(leader.leader_since)}; {len(shard.candidates)} in line"
                )
            )
    return lines


def _shards_led(found: ClusterStatus, replica: _status.Candidate) -> str:
    """The shards ``replica`` leads, e.g. ``0,2``; ``-`` for none."""
    led = [
        str(shard.shard)
        for shard in found.shards
        if shard.leader is not None and (shard.leader.identity, shard.leader.pid) == (replica.identity, replica.pid)
    ]
    return ",".join(led) or "-"


@click.command("step-down")
@click.option("--wait", is_flag=True, help="Return only when a new leader has published.")
@click.option("--wait-timeout", type=_WAIT, default=120.0, show_default=True, help="Seconds --wait waits at most.")
@click.option(
    "--shard", type=click.IntRange(min=0), default=0, show_default=True, help="With zkbeat_shards: which shard."
)
@click.pass_context
def step_down(ctx: click.Context, wait: bool, wait_timeout: float, shard: int) -> None:
    """Make the leader (of one shard, with zkbeat_shards) give up leadership; it joins again at the back."""
    target = _target(ctx)
    with _connected(target) as client:
        found, entries = _view(_read(target, client), shard, target)
        before = _runs(entries)  # read before asking: a successor may publish at once
        head = found.head
        if head is None:
            _fail(1, f"no leader to step down: {_nobody(target)}")
        who = _printable(head.identity or head.znode)
        if found.leader is None:
            who += f" (sequence {head.sequence}, at the head of the line but not leading yet)"
        else:
            who += f" (epoch {head.epoch})"
        try:
            request_step_down(client, head.znode, by=_operator())  # the successor logs who asked
        except NoNodeError:
            click.echo(f"{who} had left the election already (its candidate was gone): nobody was asked to step down")
        else:
            click.echo(f"asked {who} to step down")
        if not wait:
            return
        deadline = time.monotonic() + wait_timeout
        while time.monotonic() < deadline:
            found, entries = _view(_read(target, client), shard, target)
            new = found.leader
            if new is not None and new.znode != head.znode and new.epoch is not None:
                if _published_by(new, entries, before):
                    click.echo(f"{_printable(new.identity or '?')} (epoch {new.epoch}) leads and has published")
                    return
            time.sleep(0.2)
        _fail(1, f"no new leader published within {wait_timeout:g}s")


def _runs(entries: list[_status.EntryStatus]) -> set[tuple[str, ...]]:
    """Every recent run of these entries, and each entry's last run as its record says, as comparable keys."""
    keys = {
        ("run", e.name, str(run.get("slot")), str(run.get("at")), str(run.get("replica")), str(run.get("epoch")))
        for e in entries
        for run in e.recent_runs
    }
    keys.update(("state", e.name, str(e.last_run_at), str(e.total_run_count), str(e.epoch)) for e in entries)
    return keys


def _published_by(leader: _status.Candidate, entries: list[_status.EntryStatus], before: set[tuple[str, ...]]) -> bool:
    """Whether ``leader`` itself recorded a run since ``before`` was read.

    A new run naming its identity and epoch; with ``zkbeat_recent_runs = 0``
    an entry record that changed since and carries its epoch exactly. An
    entry's epoch above the leader's proves nothing: after a change of
    zkbeat_shards the entries carry epochs of another election (another
    sequence), which may be above the new leader's.
    """
    identity, epoch = cut_identity(leader.identity or ""), str(leader.epoch)
    for key in _runs(entries) - before:
        if key[0] == "run" and key[4] == identity and key[5] == epoch:
            return True
        if key[0] == "state" and key[4] == epoch:
            return True
    return False


@click.command()
@click.option("--local", is_flag=True, help="Also require this replica (its /healthz) to be connected.")
@click.pass_context
def health(ctx: click.Context, local: bool) -> None:
    """Exit 0 when the cluster has a leader (and, with --local, this replica is connected).

    The leader is the head of the election (its lowest real candidate; a
    stranger's znode never counts) once it has said so on the election node,
    which a replica does only after its first whole pass as leader: one that
    refuses to lead steps out of the line instead. A head that has not said
    so within one session timeout is not leading: a stuck process, or a live
    session's node that no zkbeat runs behind.
    """
    target = _target(ctx)
    if local:
        _check_local(target)
    with _connected(target) as client:
        found = _read(target, client)
        if found.sharded:
            _shards_health(target, client, found)
            return
        if found.head is not None and not found.leader_announced:
            found = _await_announcement(target, client, found)
    head = found.head
    if head is None:
        _fail(1, f"no leader: {_nobody(target)}")
    if found.leader is None:
        _fail(
            1,
            _printable(
                f"no leader: {head.identity or '?'} (sequence {head.sequence}, {head.znode}) heads the election but "
                f"has not taken the lead within the session timeout ({target.settings.session_timeout:g}s)"
            ),
        )
    ignored = f", {len(found.strangers)} stranger znode(s) ignored" if found.strangers else ""
    click.echo(
        f"ok: {_printable(head.identity or '?')} leads (epoch {head.epoch}), "
        f"{len(found.candidates)} candidate(s){ignored}"
    )


def _view(
    found: ClusterStatus, shard: int, target: Target
) -> tuple[ClusterStatus | _status.ShardStatus, list[_status.EntryStatus]]:
    """One shard's election and entries with zkbeat_shards, else the cluster's (both have head and leader)."""
    if not found.sharded:
        return found, found.entries
    if shard >= len(found.shards):
        _fail(2, f"--shard {shard}: the app has {len(found.shards)} shards (0 to {len(found.shards) - 1})")
    root, count = _shards.shard_root(target.settings.hosts, target.settings.root), len(found.shards)
    return found.shards[shard], [e for e in found.entries if _shards.shard_of(root, e.name, count) == shard]


def _shards_health(target: Target, client: KazooClient, found: ClusterStatus) -> None:
    """health with zkbeat_shards: ok only when every shard has a leader that said so (each named when not)."""
    deadline = time.monotonic() + target.settings.session_timeout
    while True:
        silent = [shard for shard in found.shards if shard.leader is None]
        if not silent or time.monotonic() >= deadline:
            break
        time.sleep(0.1)
        for shard in silent:
            shard.candidates, shard.strangers = read_election(client, shard.election)
    if silent:
        why = []
        for shard in silent:
            head = shard.head
            if head is None:
                why.append(f"shard {shard.shard}/{shard.count}: nobody in its election")
            else:
                why.append(
                    f"shard {shard.shard}/{shard.count}: {head.identity or '?'} (sequence {head.sequence}) heads its "
                    f"election but has not taken the lead within the session timeout "
                    f"({target.settings.session_timeout:g}s)"
                )
        _fail(1, _printable("no leader of " + "; ".join(why)))
    leads = ", ".join(f"{s.shard}: {s.leader.identity or '?'} (epoch {s.leader.epoch})" for s in found.shards)
    click.echo(_printable(f"ok: every shard has a leader ({leads}), {len(found.candidates)} replica(s)"))


def _await_announcement(target: Target, client: KazooClient, found: ClusterStatus) -> ClusterStatus:
    """Re-read until the head announces its lead, for at most one session timeout.

    A handover takes milliseconds; a head still silent after a session
    timeout is not going to lead by itself.
    """
    path = f"{found.root.rstrip('/')}/{LAYOUT_DIR}/election"
    deadline = time.monotonic() + target.settings.session_timeout
    while time.monotonic() < deadline and found.head is not None and not found.leader_announced:
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
            json_object(answer.read())
    except urllib.error.HTTPError as exc:
        try:
            body = json_object(exc.read())
        except ValueError:  # whatever else answers on that port
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


def _control_failed(exc: controls.ControlError, **data: Any) -> NoReturn:
    # An entry that is not there, or a cluster that cannot take the command:
    # the question was fine, the answer is no (1), as status does for a root.
    refused = isinstance(exc, (controls.UnknownEntryError, controls.LayoutError))
    _fail(1 if refused else 2, _printable(str(exc)), **data)


def _checked_name(entry: str) -> None:
    try:
        controls.check_name(entry)
    except controls.ControlError as exc:
        _control_failed(exc, entry=entry)


_FORCE_HELP = "Write layout-2 state even though no replica in line reads it (its layout-1 replicas stop leading)."


@click.command()
@click.argument("entry")
@click.option("--note", default="", help=f"Why (shown by status; at most {controls.MAX_NOTE} chars).")
@click.option("--force", is_flag=True, help=_FORCE_HELP)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_context
def pause(ctx: click.Context, entry: str, note: str, force: bool, as_json: bool) -> None:
    """Pause ENTRY on every replica: none of its ticks is published until it is resumed."""
    target = _target(ctx)
    target.as_json = as_json
    _checked_name(entry)
    try:
        controls.check_note(note)
    except controls.ControlError as exc:
        _control_failed(exc, entry=entry)
    schedule = target.schedule() or {}
    with _connected(target) as client:
        try:
            state, changed = controls.pause(
                client, target.settings.root, entry, _operator(), note, scheduled=entry in schedule, force=force
            )
        except controls.ControlError as exc:
            _control_failed(exc, entry=entry)
    held = state.paused
    assert held is not None
    since = held.at.isoformat() if held.at else "?"
    text = f"{'paused' if changed else 'already paused:'} {entry} (by {held.by} at {since}" + (
        f", note: {held.note})" if held.note else ")"
    )
    _report(as_json, {"ok": True, "entry": entry, "paused": held.as_dict(), "changed": changed}, text)


@click.command()
@click.argument("entry")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_context
def resume(ctx: click.Context, entry: str, as_json: bool) -> None:
    """Resume ENTRY; what it missed while paused follows its catch-up policy."""
    target = _target(ctx)
    target.as_json = as_json
    _checked_name(entry)
    schedule = target.schedule() or {}
    with _connected(target) as client:
        try:
            state, changed = controls.resume(client, target.settings.root, entry, scheduled=entry in schedule)
        except controls.ControlError as exc:
            _control_failed(exc, entry=entry)
    was = state.paused.as_dict() if changed and state.paused else None
    text = (
        f"resumed {entry}" + (f" (paused by {was['by']} at {was['at']})" if was else "")
        if changed
        else (f"{entry} was not paused")
    )
    _report(as_json, {"ok": True, "entry": entry, "was_paused": was, "changed": changed}, text)


@click.command()
@click.argument("entry")
@click.option("--no-wait", is_flag=True, help="Return once the request is made, not once it is published.")
@click.option(
    "--wait-timeout",
    type=_WAIT,
    default=60.0,
    show_default=True,
    help="Seconds to wait for the publish at most.",
)
@click.option("--force", is_flag=True, help=_FORCE_HELP)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_context
def trigger(ctx: click.Context, entry: str, no_wait: bool, wait_timeout: float, force: bool, as_json: bool) -> None:
    """Run ENTRY once now, through the leader, exactly once (also while it is paused)."""
    target = _target(ctx)
    target.as_json = as_json
    _checked_name(entry)
    schedule = target.schedule() or {}
    with _connected(target) as client:
        started = time.monotonic()
        try:
            request = controls.request_trigger(
                client, target.settings.root, entry, _operator(), scheduled=entry in schedule, force=force
            )
        except controls.ControlError as exc:
            _control_failed(exc, entry=entry)
        name = request.rsplit("/", 1)[-1]
        if no_wait:
            data = {"ok": True, "entry": entry, "request": name, "published": None, "state": "pending"}
            _report(as_json, data, f"asked to run {entry} ({name})")
            return
        receipt = controls.wait_published(client, target.settings.root, request, wait_timeout)
        waited = time.monotonic() - started
        if receipt is None:
            _timed_out(target, client, entry, name, wait_timeout)
    if receipt.get("refused"):
        _fail(
            1,
            _printable(f"{entry} ({name}) was refused by the leader: {receipt['refused']}"),
            entry=entry,
            request=name,
            state="refused",
            reason=receipt["refused"],
        )
    data = {"ok": True, "entry": entry, "request": name, "published": receipt, "seconds": round(waited, 3)}
    task = f"task {receipt.get('task_id', '?')}, epoch {receipt.get('epoch', '?')}"
    if receipt.get("uncertain"):
        # Its own code: unlike a timeout (1, the request stays and still runs),
        # this run is over; asking again would be a second run.
        _fail(
            UNCERTAIN_EXIT,
            _printable(
                f"{entry} ({name}) was sent as {task} but the broker never answered: it may or may not have "
                "arrived, and is not sent again; look for that task id in the worker's log before asking again"
            ),
            **{**data, "ok": False, "uncertain": True, "state": "uncertain"},
        )
    _report(
        as_json,
        {**data, "state": "published"},
        f"published {entry} ({name}) as {task}, {waited * 1000:.0f} ms after the request",
    )


def _timed_out(target: Target, client: KazooClient, entry: str, name: str, wait_timeout: float) -> NoReturn:
    """Say what became of a request not published within the wait, and end (see zkbeat.ledger.controls)."""
    root = target.settings.root
    outcome = controls.request_outcome(client, root, name, entry)
    state = outcome["state"]
    where = f"{entry} ({name}) was not published within {wait_timeout:g}s"
    data = {"entry": entry, "request": name, "published": None, **outcome}
    if state == "published":  # the receipt came as the wait ended
        receipt = outcome["receipt"]
        _report(
            target.as_json,
            {"ok": True, **data, "published": receipt},
            f"published {entry} ({name}) as task {receipt.get('task_id', '?')}, epoch {receipt.get('epoch', '?')}",
        )
        sys.exit(0)
    if state == "refused":
        _fail(1, _printable(f"{entry} ({name}) was refused by the leader: {outcome['reason']}"), **data)
    if state == "consumed":
        _fail(
            UNCERTAIN_EXIT,
            _printable(
                f"{where}, but a leader consumed it: its run is recorded in the ledger as task "
                f"{outcome['task_id']}"
                + (f" (a later run-now, {outcome['superseded_by']}, has run since)" if outcome["superseded_by"] else "")
                + ", and no receipt came: it was sent, or its leader stopped between recording and sending it "
                "(then it is lost, never sent twice); look for that task id in the worker's log before asking again"
            ),
            **data,
        )
    if state == "gone":
        _fail(
            1,
            _printable(f"{where}, and the request is gone with no receipt and no run recorded: someone removed it"),
            **data,
        )
    # Pending (or unreadable): say why it waits, as far as ZooKeeper tells.
    held = outcome.get("held")
    if isinstance(held, dict) and held.get("why"):
        why = f"the leader ({held.get('by', '?')}, epoch {held.get('epoch', '?')}) keeps it waiting: {held['why']}"
    else:
        found = _read(target, client)
        if found.sharded:
            why = _shard_waits(found, target.settings.root, entry)
        elif found.leader is not None:
            why = (
                f"the leader ({found.leader.identity or '?'}, epoch {found.leader.epoch}) has not taken it: "
                "it cannot publish (the broker is down?)"
            )
        elif found.head is not None:
            line = ", ".join(f"{c.identity or '?'} (layout {c.layout or '?'})" for c in found.candidates)
            why = f"no replica leads now (in line: {line})"
        else:
            why = _nobody(target)
    _fail(1, _printable(f"{where}: it is still pending and runs once a leader can publish it; {why}"), **data)


def _shard_waits(found: ClusterStatus, root: str, entry: str) -> str:
    """Why a run-now waits with shards: only the leader of the entry's shard takes it (zkbeat.coordination.shards)."""
    shard = found.shards[_shards.shard_of(_shards.shard_root(found.hosts, root), entry, len(found.shards))]
    label = f"shard {shard.shard}/{shard.count}"
    if shard.leader is not None:
        return (
            f"{label}, its shard, is led by {shard.leader.identity or '?'} (epoch {shard.leader.epoch}), which has "
            "not taken it: it cannot publish (the broker is down?)"
        )
    if shard.head is not None:
        line = ", ".join(f"{c.identity or '?'} (layout {c.layout or '?'})" for c in shard.candidates)
        return f"no replica leads {label}, its shard, now (in its line: {line})"
    return f"no replica is in the line of {label}, its shard (the other shards' leaders do not take its requests)"


def _entry_record(target: Target, client: KazooClient, entry: str, schedule: dict[str, Any]) -> LedgerRecord | None:
    """ENTRY's ledger record (None if it has never run but the app's schedule has it); ends for an unknown one."""
    try:
        record = read_entry(client, target.settings.root, target.settings.hosts, entry)
    except NotAZkbeatRoot as exc:
        _fail(1, f"{exc}; used {target.used()}: {target.hint()}, or no replica has started under this root yet",
              entry=entry)  # fmt: skip
    if record is None and entry not in schedule:
        where = (
            "nor in the app's beat_schedule"
            if target.app is not None
            else "(without -A the app's schedule is not known)"
        )
        _fail(
            1,
            _printable(
                f"unknown entry {entry!r}: it has no ledger state under {target.settings.root} {where}; "
                f"used {target.used()}"
            ),
            entry=entry,
        )
    if record is not None and record.state is None:
        _fail(
            1,
            _printable(f"entry {entry!r}: its ledger znode holds data zkbeat cannot read (or may not read: NoAuth)"),
            entry=entry,
        )
    return record


@click.command()
@click.argument("entry")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_context
def history(ctx: click.Context, entry: str, as_json: bool) -> None:
    """Show ENTRY's recent runs, newest first: slot, publish time, lateness, replica, epoch and kind.

    At most 10 are kept, in the entry's ledger znode (see zkbeat.ledger.history);
    the longer history is in the workers' result backend and logs.
    """
    target = _target(ctx)
    target.as_json = as_json
    _checked_name(entry)
    schedule = target.schedule() or {}
    with _connected(target) as client:
        record = _entry_record(target, client, entry, schedule)
    state = record.state if record is not None else None
    runs = shown(state.recent) if state is not None else []
    kept = target.settings.recent_runs
    data = {"ok": True, "entry": entry, "kept": kept, "runs": runs}
    lines = [f"{entry}: {len(runs)} recent run{'' if len(runs) == 1 else 's'}, newest first (at most {kept} kept)"]
    if runs:
        rows = [["slot", "published", "late", "replica", "epoch", "kind"]]
        for run in runs:
            late = f"{run['late_seconds']:.3f}s"
            rows.append([_ago(run["slot"]), _ago(run["at"]), late, run["replica"], str(run["epoch"]), run["kind"]])
        lines.extend(_table(rows))
    elif state is None:
        lines.append("  none: it has not run yet")
    else:
        lines.append(
            "  none recorded: its last claim was made by a release that keeps no recent runs, or the list could "
            "not be read (logged); the next run starts it again"
        )
    if as_json:
        _report(True, data, "")
    else:
        click.echo("\n".join(_printable(line) for line in lines))


@click.command("next")
@click.argument("entry")
@click.option("-n", "count", type=click.IntRange(1, MAX_NEXT), default=10, show_default=True, help="How many.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_context
def next_runs(ctx: click.Context, entry: str, count: int, as_json: bool) -> None:
    """Show ENTRY's next fire times, with its jitter, as the leader will publish them (needs -A).

    Each is the slot the leader plans from the ledger's last run, and the
    moment it is published (the slot plus the entry's jitter offset).
    """
    from .dashboard import describe

    target = _target(ctx)
    target.as_json = as_json
    _checked_name(entry)
    schedule = target.schedule()
    if schedule is None:
        _fail(2, f"next needs the app's schedule to say when {entry!r} runs: pass your Celery app with -A proj",
              entry=entry)  # fmt: skip
    with _connected(target) as client:
        record = _entry_record(target, client, entry, schedule)
    scheduled = schedule.get(entry)
    if scheduled is None:
        _fail(
            1,
            _printable(
                f"entry {entry!r} is in the ledger under {target.settings.root} but not in the app's beat_schedule: "
                "its schedule (and so its next runs) is not known here"
            ),
            entry=entry,
        )
    state = record.state if record is not None else None
    settings = target.settings
    now = datetime.now(timezone.utc)
    try:
        fires = describe.next_fires(scheduled, state, settings.root, settings.jitter, now, count)
    except Exception as exc:  # noqa: BLE001 - a user's schedule that raises: say so, as the leader logs it
        _fail(1, _printable(f"entry {entry!r}: its schedule cannot say when it runs next ({exc!r})"), entry=entry)
    paused = state.paused.as_dict() if state is not None and state.paused is not None else None
    data = {"ok": True, "entry": entry, "schedule": describe.schedule_words(scheduled), "paused": paused, "next": fires}
    if as_json:
        _report(True, data, "")
        return
    lines = [f"{entry} ({data['schedule']}): next {len(fires)} fire time{'' if len(fires) == 1 else 's'}"]
    if paused:
        lines.append(f"  paused by {paused['by']} at {_ago(paused['at'])}: none of these is published until resumed")
    rows = [["slot", "published at", "jitter"]]
    for fire in fires:
        jitter = (datetime.fromisoformat(fire["at"]) - datetime.fromisoformat(fire["slot"])).total_seconds()
        rows.append([_ago(fire["slot"]) + (" (due now)" if fire["due"] else ""), _ago(fire["at"]), f"{jitter:.3f}s"])
    lines.extend(_table(rows))
    click.echo("\n".join(_printable(line) for line in lines))


for _command in (status, step_down, health, pause, resume, trigger, history, next_runs):
    main.add_command(_command)
    celery_command.add_command(_command)


@click.command()
@click.option(
    "--port",
    default=5555,
    show_default=True,
    type=click.IntRange(0, 65535),
    help="TCP port to serve on (0: any free one).",
)
@click.option("--bind", default="127.0.0.1", show_default=True, help="Address to serve on.")
@click.option(
    "--secret-file",
    type=click.Path(dir_okay=False),
    help="File holding the secret that turns pause, resume and run-now on (else $ZKBEAT_DASHBOARD_SECRET; "
    "without either they are off).",
)
@click.pass_context
def dashboard(ctx: click.Context, port: int, bind: str, secret_file: str | None) -> None:
    """Serve a web page and a JSON API of the cluster and its entries, kept current by ZooKeeper watches."""
    from . import dashboard as web

    target = _target(ctx)
    try:
        secret = web.load_secret(secret_file)
    except ConfigurationError as exc:
        _fail(2, str(exc))
    try:
        web.serve(
            target.settings, target.app, target.schedule(), bind, port, secret, target.timeout, announce=click.echo
        )
    except (KazooTimeoutError, KazooException) as exc:
        _fail(2, f"cannot reach ZooKeeper at {target.settings.hosts} within {target.timeout:g}s ({exc or 'timeout'})")
    except OSError as exc:
        _fail(2, f"cannot serve on {bind}:{port} ({exc.strerror or exc})")


main.add_command(dashboard)
celery_command.add_command(dashboard)


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_context
def acl(ctx: click.Context, as_json: bool) -> None:
    """Give every znode under the root the ACL of the app's zkbeat_auth: a step of a credential rotation.

    Every permission to each digest identity of zkbeat_auth, as the replicas
    give what they create (docs/operating.md says when to run it: once every
    replica holds both credentials, and once the old one is gone).
    """
    target = _target(ctx)
    target.as_json = as_json
    owners = owner_acl(target.settings)
    if not owners:
        _fail(2, f"zkbeat_auth holds no digest credential: there is no identity to grant; used {target.used()}")
    who = [f"digest:{entry.id.id.partition(':')[0]}" for entry in owners]
    root = target.settings.root
    with _connected(target) as client:
        count, refused = apply_acl(client, root, owners)
    if count == 0 and not refused:
        _fail(1, f"no znode at {root}: used {target.used()}: {target.hint()}")
    text = f"set the ACL of {count} znode(s) under {root}: every permission to {', '.join(who)}, nobody else"
    data = {"root": root, "znodes": count, "identities": who, "refused": refused}
    if refused:
        shown = ", ".join(refused[:10]) + (f" and {len(refused) - 10} more" if len(refused) > 10 else "")
        _fail(
            1,
            _printable(
                f"{text}; ZooKeeper refused {len(refused)} (NoAuth: an ACL that does not grant these credentials "
                f"READ and ADMIN, left as it is, with what is under it): {shown}"
            ),
            **data,
        )
    _report(as_json, {"ok": True, **data}, text)


main.add_command(acl)
celery_command.add_command(acl)


if __name__ == "__main__":  # pragma: no cover
    main()

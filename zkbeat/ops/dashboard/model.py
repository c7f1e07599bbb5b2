"""The dashboard's one view of a cluster, kept current by ZooKeeper watches.

One model per ``zkbeat dashboard`` process, whatever the number of
browsers: they read the model, never ZooKeeper. What it watches (one-shot
watches, re-armed by the read that follows each one)::

    <root>                      children: the layout markers (v1, v2, a newer v<N>)
    <root>/v1/election          children (the line, read by CandidateReader) and data (who announced the lead)
    <root>/v1/entries           children (entries appear and go) and each entry's data (its ledger state)
    <root>/v1/triggers          children: pending run-now requests

With ``zkbeat_shards`` above 1, each shard's election
(``<root>/v1/shards/<N>/<k>/election``) is watched the same way and
``shards`` holds one element per shard (its line, head and announced
leader); the leader history (``epochs.observed``) follows shard 0. Each
entry carries its ``shard`` (zkbeat.coordination.shards.shard_of, as its leaders compute
it). Epochs are per shard (each shard's candidates are numbered by its own
election), so an entry's ``by`` and the ledger's epochs are looked up in the
entry's shard.

Watch callbacks run on kazoo's thread and only note what changed and wake
the model's own thread, which re-reads just that (an entry that changed is
one get; ten thousand entries at start are pipelined) and publishes a new
sequence number. A lost session drops every watch: the model reads
everything again once a new session is connected. While ZooKeeper is away
the model keeps its last view and says so (``connection``).

Each entry carries ``recent_runs``, its last runs newest first as the ledger keeps them
(zkbeat.ledger.history, the same records ``zkbeat history`` reads).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from dataclasses import asdict
from datetime import datetime, timezone
from typing import Any

from kazoo.client import KazooClient
from kazoo.exceptions import KazooException, NoAuthError, NoNodeError, UnimplementedError, ZookeeperError
from kazoo.protocol.states import KazooState, WatchedEvent

from ..._decode import json_object
from ...conf import Settings
from ...coordination._multiread import read_many
from ...coordination.candidates import CandidateReader, Line
from ...coordination.layout import LAYOUT, LAYOUT_DIR, MARKER_DIR
from ...coordination.liveness import Announcement
from ...coordination.peers import layout_of
from ...coordination.shards import REPLICA_KEY, election_path, entry_shard
from ...ledger import history
from ...ledger.store import EntryState, decode_answer, decode_name, encode_name
from ..status import UnreadyMark, place_marks, read_marks
from . import describe

__all__ = ["ClusterModel", "OBSERVED_LEADERS"]

logger = logging.getLogger(__name__)

#: Leader changes this process remembers having seen (the oldest drop out).
OBSERVED_LEADERS = 100
#: Seconds the model waits after a watch fires before it reads, so that a
#: burst of changes (a leader claiming many entries) is read in one go.
_BATCH = 0.05
#: Entries above which a first read is shown before its watches are armed (see _update_entries).
_QUICK_FIRST = 100
#: Seconds between recomputing the next fire times of entries that are due
#: (late or paused): theirs move with the clock, not with ZooKeeper.
_DUE_REFRESH = 5.0
#: Seconds between reads of entries that denied READ: a refused read sets no watch, and an ACL put right
#: (``zkbeat acl``, a credential rotation) fires none either.
_DENIED_RETRY = 2.0


def _iso(moment: datetime | None) -> str | None:
    return moment.isoformat() if moment else None


class ClusterModel:
    """The cluster as the dashboard shows it; :meth:`snapshot` and :meth:`changes` for the server.

    Thread-safe: the server's threads read while the model's own thread
    writes, under one lock. ``schedule`` is the app's (name -> Celery
    ScheduleEntry), or None when the dashboard runs from ``--hosts/--root``.
    """

    def __init__(
        self, client: KazooClient, settings: Settings, schedule: dict[str, Any] | None = None, app: Any = None
    ) -> None:
        self.client = client
        self.settings = settings
        self.schedule = schedule
        #: The Celery app: current in the model's thread (see _run).
        self.app = app
        root = settings.root.rstrip("/") or "/"
        self.root = root
        self.base = f"{root.rstrip('/')}/{LAYOUT_DIR}"
        #: Each shard's election (one: layout 1's ``<root>/v1/election``); shard 0's is the one of ``epochs``.
        self.election_paths = [election_path(root, shard, settings.shards) for shard in range(settings.shards)]
        self.election_path = self.election_paths[0]
        self.entries_path = f"{self.base}/entries"
        self.triggers_path = f"{self.base}/triggers"
        self._reader = CandidateReader(client, self.election_path, timeout=settings.session_timeout)
        self._multiread = True
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._wake = threading.Event()
        #: Guards only the sets below, so that kazoo's thread never waits on a reader.
        self._notes = threading.Lock()
        self._stopping = False
        self._thread: threading.Thread | None = None
        # What needs reading (set by watches and the connection listener).
        self._full = True
        self._dirty: set[str] = set()
        self._dirty_entries: set[str] = set()
        # The view.
        self.seq = 0
        self.connection = "CONNECTING"
        self.error: str | None = None
        self._cluster: dict[str, Any] = {}
        self._states: dict[str, EntryState | None] = {}
        #: Entries whose znode denied READ when last read (said once each).
        self._denied: set[str] = set()
        self._triggers_denied = False
        self._views: dict[str, dict[str, Any]] = {}
        self._entry_seq: dict[str, int] = {}
        self._removed: dict[str, int] = {}
        self._pending: dict[str, list[dict[str, Any]]] = {}
        self._line = Line()
        self._announced: dict[str, Any] = {}
        #: Shards 1 and up (``zkbeat_shards``): each one's reader, line and announcement.
        self._shard_readers = [
            CandidateReader(client, path, timeout=settings.session_timeout) for path in self.election_paths[1:]
        ]
        self._shard_lines: list[tuple[Line, dict[str, Any]]] = [(Line(), {}) for _ in self._shard_readers]
        #: Replica id -> mark, of the replicas that said they cannot lead now (zkbeat_shards > 1).
        self._unready: dict[str, UnreadyMark] = {}
        self._election_stat: Any = None
        self._root_children: list[str] = []
        self._leaders: deque[dict[str, Any]] = deque(maxlen=OBSERVED_LEADERS)
        #: Per shard: epoch (a candidate's sequence number in that shard's election) -> its identity.
        self._owners: list[dict[int, str]] = [{} for _ in self.election_paths]
        self._epoch_owner = self._owners[0]

    # -- lifecycle ---------------------------------------------------------

    def start(self) -> ClusterModel:
        self.client.add_listener(self._on_connection)
        if self.client.connected:
            self.connection = "CONNECTED"
        self._cluster = self._cluster_view(datetime.now(timezone.utc))
        self._thread = threading.Thread(target=self._run, name="zkbeat-dashboard-model", daemon=True)
        self._thread.start()
        self._wake.set()
        return self

    def stop(self) -> None:
        self._stopping = True
        self._wake.set()
        self.client.remove_listener(self._on_connection)
        if self._thread is not None:
            self._thread.join(5)
        with self._changed:
            self._changed.notify_all()

    # -- kazoo's thread: note and wake, nothing else -------------------------

    def _on_connection(self, state: str) -> None:
        self.connection = str(state)
        if state == KazooState.LOST:
            self._full = True  # the session's watches are gone with it
        # Browsers hear about the connection at once, not at the next change.
        self._note("connection")

    def _on_root(self, event: WatchedEvent) -> None:
        self._note("root")

    def _on_election(self, event: WatchedEvent) -> None:
        self._note("election")

    def _on_entries(self, event: WatchedEvent) -> None:
        self._note("entries")

    def _on_triggers(self, event: WatchedEvent) -> None:
        self._note("triggers")

    def _on_entry(self, event: WatchedEvent) -> None:
        if not event.path:
            return  # kazoo's word that the session's watches are gone: the LOST state says it too
        component = event.path.rsplit("/", 1)[-1]
        with self._notes:
            self._dirty_entries.add(decode_name(component))
        self._wake.set()

    def _note(self, part: str) -> None:
        with self._notes:
            self._dirty.add(part)
        self._wake.set()

    # -- the model's thread --------------------------------------------------

    def _run(self) -> None:
        # Celery's current app is per thread, and a crontab made without app=
        # takes its timezone from it: in this thread it would be Celery's
        # default app (UTC), and "at 07:30 Europe/Paris" would fire at 07:30 UTC.
        if self.app is not None:
            self.app.set_current()
        last_due = last_denied = time.monotonic()
        while not self._stopping:
            self._wake.wait(_DENIED_RETRY if self._denied or self._triggers_denied else _DUE_REFRESH)
            self._wake.clear()
            if self._stopping:
                return
            time.sleep(_BATCH)
            if time.monotonic() - last_denied >= _DENIED_RETRY:
                last_denied = time.monotonic()
                with self._notes:
                    self._dirty_entries |= self._denied
                    if self._triggers_denied:
                        self._dirty.add("triggers")
            if self.client.connected:
                try:
                    self._sync()
                    notice = self._denied_notice()
                    if notice != self.error:
                        self.error = notice
                        self._publish(set(), cluster=True)
                except NoAuthError:
                    self.error = f"ZooKeeper denied access under {self.root} (NoAuth): start the dashboard with -A"
                    self._full = True
                    self._publish(set(), cluster=True)
                    time.sleep(1.0)
                    self._wake.set()
                except (KazooException, ZookeeperError) as exc:
                    logger.warning("zkbeat dashboard: reading %s failed (%r); reading it again", self.root, exc)
                    self._full = True
                    time.sleep(0.5)
                    self._wake.set()
                except Exception:  # noqa: BLE001 - the page outlives one bad read
                    logger.exception("zkbeat dashboard: unexpected error reading %s", self.root)
                    self._full = True
                    time.sleep(1.0)
                    self._wake.set()
            else:
                with self._notes:
                    told = "connection" in self._dirty
                    self._dirty.discard("connection")
                if told:
                    self._publish(set(), cluster=True)
            if time.monotonic() - last_due >= _DUE_REFRESH:
                last_due = time.monotonic()
                self._refresh_due()

    def _sync(self) -> None:
        with self._notes:
            full, self._full = self._full, False
            parts, self._dirty = self._dirty, set()
            names, self._dirty_entries = self._dirty_entries, set()
        try:
            changed: set[str] = set(self.schedule or {}) if full else set()
            cluster = full or bool(parts)
            if full or "root" in parts:
                self._read_root()
            if full or "election" in parts:
                self._read_election()
            if full or "entries" in parts:
                changed |= self._read_entry_list(full)
                names -= changed
            if names:
                changed |= self._update_entries(sorted(names))
            if full or "triggers" in parts:
                changed |= self._read_triggers()
        except BaseException:
            # Read it all again next time: a half-done read must not be taken for done.
            self._full = True
            raise
        if changed or cluster:
            self._publish(changed, cluster=True)

    def _read_root(self) -> None:
        try:
            self._root_children = sorted(self.client.get_children(self.root, watch=self._on_root))
        except NoNodeError:
            self._root_children = []
            if self.client.exists(self.root, watch=self._on_root) is not None:
                self._note("root")

    def _read_election(self) -> None:
        try:
            raw, stat = self.client.get(self.election_path, watch=self._on_election)
        except NoNodeError:
            if self.client.exists(self.election_path, watch=self._on_election) is not None:
                self._note("election")
            self._line, self._announced, self._election_stat = Line(), {}, None
            return
        self._announced = _announcement(raw)
        self._election_stat = stat
        self._line = self._reader.read(watch=self._on_election)
        self._note_owners(0, self._line)
        self._observe_leader()
        for index, reader in enumerate(self._shard_readers, 1):
            self._shard_lines[index - 1] = self._read_shard(reader)
            self._note_owners(index, self._shard_lines[index - 1][0])
        if self._shard_readers:
            self._unready = read_marks(self.client, self.root, watch=self._on_election)

    def _note_owners(self, shard: int, line: Line) -> None:
        """Remember who each candidate of ``shard``'s line is, for the epochs the ledger names later."""
        for node in line.candidates:
            identity = node.data.get("identity")
            self._owners[shard][node.sequence] = str(identity) if identity is not None else node.name

    def _read_shard(self, reader: CandidateReader) -> tuple[Line, dict[str, Any]]:
        """One more shard's line and announcement, both watched (zkbeat_shards > 1)."""
        try:
            raw, _ = self.client.get(reader.path, watch=self._on_election)
        except NoNodeError:
            if self.client.exists(reader.path, watch=self._on_election) is not None:
                self._note("election")
            return Line(), {}
        return reader.read(watch=self._on_election), _announcement(raw)

    def _observe_leader(self) -> None:
        """Remember each new head of the line, with when it said it leads."""
        head = self._line.head
        last = self._leaders[-1] if self._leaders else None
        now = datetime.now(timezone.utc).isoformat()
        if head is None:
            if last is not None and last["until"] is None:
                last["until"] = now
            return
        since = self._announced.get("leader_since") if self._announced.get("leader") == head.name else None
        if last is not None and last["epoch"] == head.sequence:
            if since and not last["leader_since"]:
                last["leader_since"] = str(since)
            return
        if last is not None and last["until"] is None:
            last["until"] = now
        self._leaders.append(
            {
                "epoch": head.sequence,
                "identity": self._epoch_owner.get(head.sequence),
                "seen_at": now,
                "leader_since": str(since) if since else None,
                "until": None,
            }
        )

    def _denied_notice(self) -> str | None:
        """What the page says while ledger entries deny this dashboard READ (they are shown unreadable)."""
        if not self._denied:
            return None
        count = len(self._denied)
        what = f"{count} ledger entr{'y denies' if count == 1 else 'ies deny'} this dashboard READ (NoAuth)"
        if not self.client.auth_data:
            return f"{what}: start the dashboard with -A (or zkbeat_auth) if the replicas use zkbeat_auth"
        return f"{what} with its credentials: another ACL, or a zkbeat_auth that differs from the replicas'"

    def _read_entry_list(self, full: bool) -> set[str]:
        try:
            components = self.client.get_children(self.entries_path, watch=self._on_entries)
        except NoNodeError:
            components = []
            if self.client.exists(self.entries_path, watch=self._on_entries) is not None:
                self._note("entries")
        present = {decode_name(c) for c in components}
        gone = {name for name in self._states if name not in present}
        for name in gone:
            del self._states[name]
            self._denied.discard(name)
        fresh = present if full else present - set(self._states)
        changed = self._update_entries(sorted(fresh)) | gone
        return changed

    def _read_entries(self, names: list[str], watch: bool) -> list[tuple[str, Any]]:
        """Each entry's (data, stat) or NoNodeError; with ``watch``, each read re-arms its data watch.

        Without a watch, one multiRead per thousand entries (zkbeat.coordination._multiread).
        A watch needs a get of its own (multiRead sets none), and kazoo hands
        each get from thread to thread: about a millisecond each on a busy
        machine, seconds for thousands. So the first read of many entries
        is a multiRead, shown at once, and the watches are armed after it.
        """
        paths = []
        for name in names:
            try:
                paths.append((name, f"{self.entries_path}/{encode_name(name)}"))
            except ValueError:
                continue
        timeout = self.settings.session_timeout
        if not watch and self._multiread:
            try:
                answers = read_many(self.client, [path for _, path in paths], timeout)
                return [(name, answer) for (name, _), answer in zip(paths, answers)]
            except UnimplementedError:
                self._multiread = False
        requests = [(name, self.client.get_async(path, watch=self._on_entry)) for name, path in paths]
        found: list[tuple[str, Any]] = []
        for name, request in requests:
            try:
                found.append((name, request.get(timeout=timeout)))
            except (NoNodeError, NoAuthError) as exc:
                found.append((name, exc))
        return found

    def _update_entries(self, names: list[str]) -> set[str]:
        """Read ``names`` into the model, watched; the names whose state changed.

        Many at once (a first read, a new session): read and shown without
        watches first, then read again with them, so that what changed in
        between is not missed.
        """
        if len(names) > _QUICK_FIRST:
            self._publish(self._apply(self._read_entries(names, watch=False)), cluster=True)
        return self._apply(self._read_entries(names, watch=True))

    def _apply(self, answers: list[tuple[str, Any]]) -> set[str]:
        """Take read answers into the model; the names whose state changed.

        A znode that denies READ (someone else's ACL under the ledger) is one
        unreadable entry, logged once, as Ledger.load takes it, never an error
        for the whole page. A dashboard without the cluster's credentials is
        told so by the listing of the ledger, which then denies READ itself.
        """
        changed = set()
        for name, answer in answers:
            if isinstance(answer, NoAuthError):
                if name not in self._denied:
                    self._denied.add(name)
                    logger.warning(
                        "zkbeat dashboard: ledger entry %r denies this dashboard READ (NoAuth; %s); shown unreadable",
                        name,
                        "it has no credentials: -A" if not self.client.auth_data else "another ACL",
                    )
                state = None  # as an unreadable znode
            else:
                self._denied.discard(name)
                read = decode_answer(answer)
                if read is None:
                    if self._states.pop(name, None) is not None or name in self._views:
                        changed.add(name)
                    continue
                if read.unreadable is not None:
                    logger.warning(
                        "zkbeat dashboard: ledger entry %r holds data zkbeat cannot read (%s)", name, read.unreadable
                    )
                state = read.state
            if name not in self._states or self._states[name] != state or name not in self._views:
                changed.add(name)
            self._states[name] = state
        return changed

    def _read_triggers(self) -> set[str]:
        try:
            children = self.client.get_children(self.triggers_path, watch=self._on_triggers)
            self._triggers_denied = False
        except NoNodeError:
            children = []
            if self.client.exists(self.triggers_path, watch=self._on_triggers) is not None:
                self._note("triggers")
        except NoAuthError:
            # Someone else's inbox, which no leader may list either (it logs it): nothing pending shows.
            children = []
            if not self._triggers_denied:
                self._triggers_denied = True
                logger.warning("zkbeat dashboard: %s denies zkbeat READ; no run-now request shows", self.triggers_path)
        requests = [
            (child, self.client.get_async(f"{self.triggers_path}/{child}"))
            for child in sorted(children)
            if child != "done"
        ]
        pending: dict[str, list[dict[str, Any]]] = {}
        for child, request in requests:
            try:
                raw, _ = request.get(timeout=self.settings.session_timeout)
                data = json_object(raw)
            except NoNodeError:
                continue  # consumed between the listing and the read
            except NoAuthError:
                continue  # someone else's, which no leader runs either (it logs it)
            except ValueError:
                continue  # the leader logs and removes it: it never runs
            if isinstance(data.get("entry"), str):
                pending.setdefault(data["entry"], []).append(
                    {"request": child, "by": str(data.get("by", "?")), "at": str(data.get("at", ""))}
                )
        changed = {name for name in set(pending) | set(self._pending) if pending.get(name) != self._pending.get(name)}
        self._pending = pending
        return changed

    def _refresh_due(self) -> None:
        """Recompute the entries whose next tick is already due: their later fire times go on from now."""
        now = datetime.now(timezone.utc)
        with self._lock:
            due = [
                name
                for name, view in self._views.items()
                if view["next"] and datetime.fromisoformat(view["next"][0]["at"]) <= now
            ]
        if due:
            self._publish(set(due), cluster=False)

    # -- views -----------------------------------------------------------------

    def _publish(self, names: set[str], cluster: bool) -> None:
        now = datetime.now(timezone.utc)
        known = set(self._states) | set(self.schedule or {})
        views = {name: self._entry_view(name, now) for name in names if name in known}
        removed = {name for name in names if name not in known}
        cluster_view = self._cluster_view(now) if cluster else None
        with self._changed:
            self.seq += 1
            for name, view in views.items():
                self._views[name] = view
                self._entry_seq[name] = self.seq
                self._removed.pop(name, None)
            for name in removed:
                if self._views.pop(name, None) is not None:
                    self._entry_seq.pop(name, None)
                    self._removed[name] = self.seq
            if cluster_view is not None:
                self._cluster = cluster_view
            self._cluster["entry_count"] = len(self._views)
            self._changed.notify_all()

    def _entry_view(self, name: str, now: datetime) -> dict[str, Any]:
        settings = self.settings
        state = self._states.get(name)
        entry = (self.schedule or {}).get(name)
        shard = self._shard_of(name)
        view: dict[str, Any] = {
            "name": name,
            "shard": shard,
            "readable": name not in self._states or state is not None,
            "in_ledger": name in self._states,
            "schedule": describe.schedule_words(entry) if entry is not None else None,
            "catchup": describe.policy(entry, settings.catchup) if entry is not None else None,
            "last_run_at": _iso(state.last_run_at) if state else None,
            "total_run_count": state.total_run_count if state else None,
            "epoch": state.epoch if state else None,
            "slot": _iso(state.slot) if state else None,
            "updated_at": _iso(state.updated_at) if state else None,
            "manual": state.manual if state else None,
            "paused": state.paused.as_dict() if state and state.paused else None,
            "last_run": None,
            "by": None,
            "next": [],
            "next_due": None,
            "pending": list(self._pending.get(name, [])),
            "recent_runs": history.shown(state.recent) if state else [],
        }
        if state is not None:
            view["last_run"] = describe.last_run(state, entry, self.root_setting, settings.jitter)
            view["by"] = self._owners[shard].get(state.epoch) if state.epoch is not None else None
        if entry is not None:
            try:
                view["next"] = describe.next_fires(entry, state, self.root_setting, settings.jitter, now)
            except Exception:  # noqa: BLE001 - a schedule that raises shows no fire times
                view["next"] = []
            if view["next"]:
                view["next_due"] = view["next"][0]["slot"]
        return view

    def _shard_of(self, name: str) -> int:
        """The shard of entry ``name``, as its leaders compute it (zkbeat.coordination.shards.entry_shard)."""
        return entry_shard(self.settings.hosts, self.root_setting, name, self.settings.shards)

    @property
    def root_setting(self) -> str:
        """The root exactly as the replicas have it (jitter hashes it)."""
        return self.settings.root

    def _candidate_view(self, node: Any, place: int, announced: dict[str, Any] | None = None) -> dict[str, Any]:
        data = node.data
        announcement = Announcement.of(node)
        pid = data.get("pid")
        layout = data.get("layout")
        announced = self._announced if announced is None else announced
        leads = announced.get("leader") == node.name and announced.get("leader_since") is not None

        def text(key: str) -> str | None:
            value = data.get(key)
            return str(value) if value is not None else None

        return {
            "place": place,
            # Its place in the election; the epoch is shown only for the head that
            # announced it leads (as zkbeat status does: a candidate behind it never led).
            "sequence": node.sequence,
            "epoch": node.sequence if place == 1 and leads else None,
            "znode": node.path,
            "identity": text("identity"),
            "host": text("host"),
            "pid": pid if isinstance(pid, int) and not isinstance(pid, bool) else None,
            "started_at": text("started_at"),
            "version": text("version"),
            "layout": layout if isinstance(layout, int) and not isinstance(layout, bool) else None,
            "schedule_hash": text("schedule_hash"),
            # Where its liveness socket listens (its token is left out: it is the beacon's to give).
            "liveness": {"host": announcement.host, "port": announcement.port} if announcement else None,
            "leader_since": str(announced["leader_since"]) if leads else text("leader_since"),
            "readable": node.readable,
            # Why it cannot lead now, if it said so (zkbeat.coordination.shards: handed no shard meanwhile).
            "unready": mark.why if (mark := self._unready.get(str(data.get(REPLICA_KEY)))) is not None else None,
        }

    def _shard_views(self) -> list[dict[str, Any]]:
        """Shards 1 and up, shaped as shard 0's element of ``shards``."""
        views = []
        for index, (line, announced) in enumerate(self._shard_lines, 1):
            candidates = [self._candidate_view(node, place, announced) for place, node in enumerate(line.candidates, 1)]
            head = candidates[0] if candidates else None
            leader = head if head is not None and head["epoch"] is not None else None
            views.append(
                {
                    "shard": index,
                    "election": self.election_paths[index],
                    "leader": leader,
                    "head": head,
                    "leader_announced": leader is not None,
                    "candidates": candidates,
                    "strangers": [f"{s.path}: {s.reason}" for s in line.strangers],
                }
            )
        return views

    def _cluster_view(self, now: datetime) -> dict[str, Any]:
        candidates = [self._candidate_view(node, place) for place, node in enumerate(self._line.candidates, 1)]
        head = candidates[0] if candidates else None
        # As zkbeat status: the head leads once it has said so (its term began and ran a pass).
        leader = head if head is not None and head["epoch"] is not None else None
        stat = self._election_stat
        layouts = sorted(n for c in self._root_children if (n := layout_of(c)) is not None)
        by_epoch: dict[tuple[int, int], dict[str, Any]] = {}
        for name, state in self._states.items():
            if state is None or state.epoch is None:
                continue
            shard = self._shard_of(name)
            row = by_epoch.setdefault(
                (shard, state.epoch), {"shard": shard, "epoch": state.epoch, "entries": 0, "last_at": None}
            )
            row["entries"] += 1
            stamp = _iso(state.updated_at)
            if stamp and (row["last_at"] is None or stamp > row["last_at"]):
                row["last_at"] = stamp
        for row in by_epoch.values():
            row["identity"] = self._owners[row["shard"]].get(row["epoch"])
        return {
            "connection": self.connection,
            "error": self.error,
            "shards": [
                {
                    "shard": 0,
                    "election": self.election_path,
                    "leader": leader,
                    "head": head,
                    "leader_announced": leader is not None,
                    "candidates": candidates,
                    "strangers": [f"{s.path}: {s.reason}" for s in self._line.strangers],
                },
                *self._shard_views(),
            ],
            "epochs": {
                # Candidate sequence numbers are the epochs: the next joiner gets at least this one.
                "next": stat.cversion if stat is not None else None,
                # Each new leader writes the election node once: its version counts takeovers.
                "takeovers": stat.version if stat is not None else None,
                "announced": {
                    "leader": self._announced.get("leader"),
                    "leader_since": self._announced.get("leader_since"),
                },
                "observed": list(self._leaders),
                "ledger": sorted(by_epoch.values(), key=lambda row: (row["epoch"], -row["shard"]), reverse=True),
            },
            "layout": {
                "this_release": LAYOUT,
                "found": [f"v{n}" for n in layouts],
                "marker": MARKER_DIR in self._root_children,
                "newer": [f"v{n}" for n in layouts if n > LAYOUT],
            },
            # Every replica marked unready, in a line or not (out of every line a while after it stepped aside).
            "unready": [asdict(mark) for mark in place_marks(self._unready, self._in_line())],
        }

    def _in_line(self) -> dict[str, tuple[str | None, str | None, int | None]]:
        """Replica id -> (identity, host, pid), of each replica in some shard's line."""
        found: dict[str, tuple[str | None, str | None, int | None]] = {}
        for line in [self._line, *(line for line, _ in self._shard_lines)]:
            for node in line.candidates:
                data, pid = node.data, node.data.get("pid")
                identity, host = data.get("identity"), data.get("host")
                found.setdefault(
                    str(data.get(REPLICA_KEY)),
                    (
                        str(identity) if identity is not None else None,
                        str(host) if host is not None else None,
                        pid if isinstance(pid, int) and not isinstance(pid, bool) else None,
                    ),
                )
        return found

    # -- for the server ----------------------------------------------------------

    def snapshot(self) -> dict[str, Any]:
        """Everything the page shows, as JSON-ready data."""
        with self._lock:
            entries = [self._views[name] for name in sorted(self._views)]
            return self._envelope(self.seq, dict(self._cluster), entries, [], full=True)

    def changes(self, since: int) -> dict[str, Any]:
        """What changed after sequence ``since``: the cluster, the entries changed, the names removed."""
        with self._lock:
            entries = [self._views[name] for name, seq in self._entry_seq.items() if seq > since]
            removed = [name for name, seq in self._removed.items() if seq > since]
            return self._envelope(self.seq, dict(self._cluster), entries, removed, full=False)

    def wait(self, since: int, timeout: float) -> int:
        """Block until the sequence passes ``since`` (or ``timeout``); the sequence now."""
        with self._changed:
            if self.seq <= since and not self._stopping:
                self._changed.wait(timeout)
            return self.seq

    def _envelope(
        self, seq: int, cluster: dict[str, Any], entries: list[dict[str, Any]], removed: list[str], full: bool
    ) -> dict[str, Any]:
        cluster["connection"] = self.connection
        return {
            "seq": seq,
            "full": full,
            "root": self.root_setting,
            "hosts": self.settings.hosts,
            "app": self.schedule is not None,
            "generated_at": datetime.now(timezone.utc).isoformat(),
            **cluster,
            "entries": entries,
            "removed": removed,
        }

    def wait_ready(self, timeout: float) -> bool:
        """Block until the first full read is published (for the command's start-up and tests)."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while self.seq == 0 and time.monotonic() < deadline:
                self._changed.wait(max(0.0, deadline - time.monotonic()))
            return self.seq > 0


def _announcement(raw: bytes | None) -> dict[str, Any]:
    """An election node's JSON (who leads, since when); {} for anything a stranger may have left there."""
    try:
        return json_object(raw, empty_ok=True)
    except ValueError:
        return {}

"""Shards: which shard an entry belongs to, where each shard's election lives, and the fair share.

With ``zkbeat_shards = N`` the schedule is split into N shards. An entry's
shard is a stable hash of the root and the entry's name, mod N: the same on
every replica, every platform and every release (SHA-1, never Python's
``hash()``, which is salted per process). Each shard has an election of its
own, so its leader's term is fenced by that shard's candidate:

=========  ==========================================  ====================================
N          shard k's election                          its broker handover
=========  ==========================================  ====================================
1          ``<root>/v1/election`` (layout 1, as ever)  ``<root>/v1/handover``
N > 1      ``<root>/v1/shards/<N>/<k>/election``       ``<root>/v1/shards/<N>/<k>/handover``
=========  ==========================================  ====================================

The ledger (``<root>/v1/entries``), run-now requests and pauses stay shared.
N is part of the path, so during a rolling change of N the replicas of each
configuration contend in elections of their own, and two leaders may believe
they own one entry; neither can record a slot twice, because every claim is
a compare-and-set on the entry's own znode (zkbeat.ledger.store).

Every replica contends for every shard. The fair share (:func:`rebalance`)
spreads leadership: with R live replicas none leads more than ceil(N/R)
shards once settled. Each replica decides only about itself, from the
candidate lines of all shards, and only moves leadership towards a replica
below its share, so settling converges and never ping-pongs:

=============================================  ===========================================
this replica, in the lines of all shards        it
=============================================  ===========================================
leads more than its share, and the next in      steps down from that shard (the graceful
line of one of its shards leads fewer           handover), joining its line at the back
the next in line of a shard it does not lead,   steps back in that line (no handover: it
leads its share or more, and someone behind     does not lead it), so that a crash of
it there leads fewer                            that shard's leader moves it to the
                                                replica with fewer
anything else                                   nothing
=============================================  ===========================================

A replica that stepped out of the line of a shard this one handed it, and
stays out (its schedule did not load, it refused to lead), or that left
every line and came back under the same session (its loop stalled: the
watchdog holds it out of every line until the loop turns again), is no
longer below its share for this one's moves for FAILED_TARGET_TIME: each
handover to it would leave a shard unpublished until it steps aside again.
One that left every line and does not come back stopped (a new process is
a new replica id); one back under another session lost its session (a
partition, a paused process), not its loop, and gets its share again.

A replica that knows it cannot lead now (its schedule did not load as
leader: a database it cannot read) says so to every replica, not only to
the one that handed it the shard: an ephemeral znode named by its replica
id under ``<root>/v1/unready`` (:func:`unready_path`), there until a probe
of its schedule's storage succeeds or its session ends. Every replica's
fair share reads that listing with the lines: a replica marked there is
handed no shard and counts for nobody's share, and, next in line of a
shard with a ready replica behind it, it steps back in that line itself,
so that a crash of that shard's leader moves the shard to a replica that
can lead it. Should it lead a shard all the same (that leader crashed
before it stepped back), and its schedule not load at the first try, it
steps aside at once if a ready replica stands behind it in that line
(:func:`ready_successor`), instead of after ``zkbeat_stall_timeout``; with
none ready behind it, it is the best there is and keeps trying.

A replica that handed a shard over because it cannot reach the broker
(zkbeat.coordination.broker_handover) marks itself the same way, until a
probe of the broker on a connection of its own gets through: it stays in
every line, and the broker handover brought it behind the replica that
took the shard, so without the mark that replica, now above its share,
would hand it a shard back within seconds, and it would hand that one
back after ``zkbeat_broker_handover_timeout``, again and again, each time
leaving the shard unpublished for the timeout. The replicas between it and
the one that took the shard, which passed the question on (their own probes
failed) and queue again with it, mark themselves the same way.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import math
import re
import threading
import time
from collections import Counter
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kazoo.client import KazooClient
from kazoo.exceptions import (
    ConnectionLoss,
    NoAuthError,
    NodeExistsError,
    NoNodeError,
    SessionExpiredError,
    ZookeeperError,
)
from kazoo.hosts import collect_hosts
from kazoo.protocol.states import WatchedEvent

from .._decode import cut
from .candidates import CandidateReader
from .layout import LAYOUT_DIR

__all__ = [
    "shard_of",
    "shard_root",
    "entry_shard",
    "election_path",
    "handover_path",
    "unready_path",
    "cap_why",
    "MAX_WHY",
    "list_unready",
    "Move",
    "rebalance",
    "ready_successor",
    "FairShare",
    "REPLICA_KEY",
    "SCHEDULE",
    "BROKER",
]

logger = logging.getLogger(__name__)

#: Key of a replica's own random id in its candidate data (only with N > 1):
#: an identity may be set alike on every replica, this id never is.
REPLICA_KEY = "replica"
#: Seconds the lines must stay unchanged before this replica acts on them,
#: and the least time between two of its moves: candidates that are still
#: joining, or a handover under way, are never taken for a settled picture.
SETTLE_TIME = 2.0
#: Seconds a replica that lost a shard this one handed it (it stepped out of that line: its schedule did
#: not load, it refused to lead, its loop stalled) is handed no other by this one: not a shard a few
#: seconds after each time it steps aside, for as long as it cannot lead.
FAILED_TARGET_TIME = 300.0
#: Characters of an unready mark's reason, as written and as read (longer: cut, ending in "…"). zkbeat's own
#: reason is a short fixed text; the cut guards the write (a reason past ZooKeeper's jute.maxbuffer, 1 MiB by
#: default, would make the server drop the connection at every write) and `zkbeat status` against a long one.
MAX_WHY = 300
#: Causes of an unready mark (:meth:`FairShare.mark_unready`): the host's schedule did not load as leader, or
#: this replica handed a shard over because it cannot reach the broker (zkbeat.coordination.broker_handover).
SCHEDULE = "schedule"
BROKER = "broker"
#: What a replica id is (uuid4 hex): a child of the unready listing named otherwise is a stranger's, ignored.
_REPLICA_ID = re.compile(r"^[0-9a-f]{32}$")


def shard_of(root: str, name: str, shards: int) -> int:
    """The shard (0 to ``shards`` - 1) of entry ``name`` under ``root``: stable across processes and releases."""
    if shards <= 1:
        return 0
    digest = hashlib.sha1(f"{root}\0{name}".encode("utf-8", "surrogatepass")).digest()
    return int.from_bytes(digest[:8], "big") % shards


@functools.lru_cache(maxsize=64)
def shard_root(hosts: str, root: str) -> str:
    """The root as ZooKeeper names it: the chroot of ``hosts`` (if any), then ``root``. What :func:`shard_of` hashes.

    Replicas that reach the same znodes through a chroot and without one
    (``zk:2181/apps`` with ``/zkbeat/proj``, ``zk:2181`` with
    ``/apps/zkbeat/proj``) must put every entry in the same shard, or an
    entry each puts in a shard the other leads is led by nobody.
    """
    _, chroot = collect_hosts(hosts)
    chroot = (chroot or "").rstrip("/")
    if not chroot:
        return root
    return chroot if root == "/" else f"{chroot}{root}"


def entry_shard(hosts: str, root: str, name: str, shards: int) -> int:
    """The shard of entry ``name`` as every replica computes it: :func:`shard_of` under :func:`shard_root`.

    Worked out once per name and configuration: a leader asks for the shard
    of every row of its schedule on each pass, the dashboard of every entry
    it shows, and SHA-1 over 100,000 names is a cost each pass would pay again.
    """
    return _shard_memo(shard_root(hosts, root), shards)(name)


@functools.lru_cache(maxsize=64)
def _shard_memo(root: str, shards: int) -> Callable[[str], int]:
    """A memo of :func:`shard_of` for one root and count: a dict that lives as long as the configuration is used.

    Bounded by configurations (roots and counts, a handful in a process), not
    by names: an LRU over names smaller than the schedule would miss on every
    lookup of a pass over all its rows.
    """
    known: dict[str, int] = {}

    def shard(name: str) -> int:
        index = known.get(name)
        if index is None:
            index = known[name] = shard_of(root, name, shards)
        return index

    return shard


def _base(root: str, shard: int, shards: int) -> str:
    if shards <= 1:
        return f"{root}/{LAYOUT_DIR}"
    return f"{root}/{LAYOUT_DIR}/shards/{shards}/{shard}"


def election_path(root: str, shard: int = 0, shards: int = 1) -> str:
    """The election of ``shard`` of ``shards``; with one shard, layout 1's ``<root>/v1/election``."""
    return f"{_base(root, shard, shards)}/election"


def handover_path(root: str, shard: int = 0, shards: int = 1) -> str:
    """Where the broker handover of ``shard`` of ``shards`` asks its question (zkbeat.coordination.broker_handover)."""
    return f"{_base(root, shard, shards)}/handover"


def cap_why(why: str) -> str:
    """``why`` as a mark holds it: at most MAX_WHY characters, the last an ellipsis where it was cut."""
    return cut(why, MAX_WHY)


def unready_path(root: str) -> str:
    """Where replicas that cannot lead now say so: one ephemeral child per such replica, named by its replica id."""
    return f"{root}/{LAYOUT_DIR}/unready"


def list_unready(client: KazooClient, path: str, watch: Callable[[WatchedEvent], None] | None = None) -> frozenset[str]:
    """The replica ids marked in the unready listing at ``path`` (:func:`unready_path`); a stranger's child names none.

    ``watch`` is set on the listing, or on its creation while there is none
    (made between the two reads: listed once more). Raises NoAuthError and
    the connection's errors: each reader says so in its own words.
    """
    try:
        children = client.get_children(path, watch=watch)
    except NoNodeError:
        if client.exists(path, watch=watch) is None:
            return frozenset()
        try:
            children = client.get_children(path, watch=watch)
        except NoNodeError:
            return frozenset()  # gone again: the watch exists set fires on that
    return frozenset(child for child in children if _REPLICA_ID.match(child))


@dataclass(frozen=True)
class Move:
    """What the fair share asks of this replica: give up ``shard`` (``lead``: its leadership; else its place)."""

    shard: int
    lead: bool
    why: str


def rebalance(
    lines: Mapping[int, Sequence[str]],
    me: str,
    shards: int,
    exclude: Collection[str] = (),
    unready: Collection[str] = (),
) -> Move | None:
    """This replica's one move towards the fair share, or None (see the module docstring's table).

    ``lines`` holds each shard's candidates (replica ids, the head leads);
    a shard missing from it, or with an empty line, has no leader now.
    No move is made towards a replica of ``exclude`` (one that lost a shard
    it was handed) or of ``unready`` (one that said it cannot lead now);
    the share is counted over the replicas not ``unready`` (all of them if
    none is ready). Deterministic: the same lines give the same answer.
    """
    replicas = {replica for line in lines.values() for replica in line}
    if me not in replicas:
        return None
    unready = set(unready)
    if me in unready:
        return _step_back_unready(lines, me, unready | set(exclude))
    ready = replicas - unready
    share = math.ceil(shards / len(ready or replicas))
    takers = ready - set(exclude)
    leads = Counter(line[0] for line in lines.values() if line)
    if leads[me] > share:
        for shard in sorted(lines, reverse=True):
            line = lines[shard]
            if line and line[0] == me and len(line) > 1 and leads[line[1]] < share and line[1] in takers:
                why = f"fair share: leads {leads[me]} of {shards} shards, {len(ready or replicas)} replicas"
                return Move(shard, True, why)
    if leads[me] >= share:
        for shard in sorted(lines):
            line = lines[shard]
            behind = [r for r in line[2:] if r in takers]
            if len(line) > 2 and line[0] != me and line[1] == me and any(leads[r] < share for r in behind):
                return Move(shard, False, "fair share: a replica that leads fewer shards goes first")
    return None


def _step_back_unready(lines: Mapping[int, Sequence[str]], me: str, cannot: set[str]) -> Move | None:
    """A replica that cannot lead now, next in line of a shard with one that can behind it: it steps back.

    Then a crash of that shard's leader moves the shard to a replica that
    can lead it, not to this one for a stall timeout. It never steps down
    from a shard it leads here: a leader whose schedule does not load steps
    aside on its own (zkbeat.leading.leadership), and one that loaded is
    ready again.
    """
    for shard in sorted(lines):
        line = lines[shard]
        if len(line) > 2 and line[1] == me and any(r not in cannot for r in line[2:]):
            return Move(shard, False, "not ready to lead: a replica that can lead goes first")
    return None


def ready_successor(line: Sequence[str], me: str, cannot: Collection[str], *, listed: bool) -> str | None:
    """The first replica behind ``me`` in ``line`` that can lead (none of ``cannot``), or None.

    Asked by a replica marked unready that leads a shard whose schedule did
    not load: it steps aside at once for that replica, never for nobody nor
    for one marked too (two marked replicas would hand the shard back and
    forth). Only while its own mark is ``listed`` as read: if the listing
    holds no mark of its own (zkbeat may not write there), the others'
    absence from it says nothing either.
    """
    if not listed or me not in line:
        return None
    return next((replica for replica in line[line.index(me) + 1 :] if replica not in cannot), None)


class FairShare:
    """Reads the candidate lines of every shard (watched) and says when this replica should move.

    Not thread-safe: one caller (beat's main thread); the watches (kazoo's
    thread) only set a flag and call ``on_change`` (which wakes beat's loop).
    The one exception: a broker handover's thread may mark this replica
    unready and write the mark (:meth:`mark_unready`, :meth:`keep_mark`),
    which only rebinds the reasons (under a lock of their own), sets a flag,
    and makes or finds the mark's znode, the same whichever thread writes it
    first.
    :meth:`decide` reads ZooKeeper only after a watch fired, and answers a
    move only once the lines stood still for SETTLE_TIME and SETTLE_TIME has
    passed since its last move; :meth:`next_look` says when to ask again.
    """

    def __init__(
        self,
        client: KazooClient,
        paths: Sequence[str],
        me: str,
        *,
        timeout: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
        on_change: Callable[[], None] | None = None,
        unready: str | None = None,
        about: Mapping[str, Any] | None = None,
    ) -> None:
        self.me = me
        #: Who this replica is (identity, host, pid), written into its mark: one out of every line is named by it.
        self._about = dict(about or {})
        self.shards = len(paths)
        self._client = client
        self._readers = [CandidateReader(client, path, timeout=timeout) for path in paths]
        #: The unready listing (:func:`unready_path`), None: not read, never marked.
        self._unready_path = unready
        #: The replicas marked unready there, as last read.
        self._unready: frozenset[str] = frozenset()
        #: Why this replica cannot lead now, by cause (SCHEDULE, BROKER): marked while any holds.
        self._whys: dict[str, str] = {}
        #: Cause -> how many times it was marked: a probe's answer clears only the marks made before it began.
        self._marked: dict[str, int] = {}
        self._whys_lock = threading.Lock()  # marked by a broker handover's thread, unmarked by beat's
        self._unreadable_said = False
        self._denied_said = False
        self._refused_said = False
        self._clock = clock
        self._changed = threading.Event()
        self._changed.set()
        self._lines: dict[int, tuple[str, ...]] = {}
        self._since = clock()
        self._moved_at = -math.inf
        self._on_change_hook = on_change
        #: Watch events seen (kazoo's thread counts them): a change since a caller looked wakes it.
        self.changes = 0
        #: Shard -> (the replica this one handed it to, when, whether it was seen in no line since, its session
        #: then: a return under another one is a session that ended, not a loop that stalled).
        self._handed: dict[int, tuple[str, float, bool, int | None]] = {}
        #: Replica -> until when no shard is handed to it (it lost one it was handed; FAILED_TARGET_TIME).
        self._failed: dict[str, float] = {}
        #: Shard -> replica -> the sequence of its candidate there, as last read.
        self._sequences: dict[int, dict[str, int]] = {}
        #: Replica -> the ZooKeeper session that owns its candidates (their ephemeralOwner), as last read.
        self._sessions: dict[str, int] = {}
        #: While unready: shard -> (this one's candidate's sequence when it stepped back there, the replicas it
        #: stepped back behind).
        self._passed: dict[int, tuple[int, frozenset[str]]] = {}
        #: While unready: replica -> until when this one does not step back for it (it gave way to this one).
        self._gave_way: dict[str, float] = {}

    def _on_change(self, event: WatchedEvent) -> None:
        self._changed.set()
        self.changes += 1
        if self._on_change_hook is not None:
            self._on_change_hook()

    def lines(self) -> dict[int, tuple[str, ...]]:
        """Each shard's line of replica ids as last read (ZooKeeper is read again if a watch fired)."""
        if self._changed.is_set():
            self._changed.clear()
            lines = {}
            sequences = {}
            sessions = {}
            try:
                for shard, reader in enumerate(self._readers):
                    line = reader.read(watch=self._on_change)
                    kept = [c for c in line.candidates if isinstance(c.data.get(REPLICA_KEY), str)]
                    lines[shard] = tuple(str(c.data[REPLICA_KEY]) for c in kept)
                    sequences[shard] = {str(c.data[REPLICA_KEY]): c.sequence for c in kept}
                    sessions.update((str(c.data[REPLICA_KEY]), c.owner) for c in kept)
                unready = self._read_unready()  # in the guard too: a cut listing is read again, lines and all
                # A child naming no replica in line counts for nobody: a stranger's churn there is no change.
                listed = {replica for line in lines.values() for replica in line} | {self.me}
                unready = unready & listed
            except BaseException:
                self._changed.set()  # read again at the next pass
                raise
            if not all(lines.values()):
                self._changed.set()  # an election not made yet sets no watch: read again at the next pass
            self._sequences = sequences
            self._sessions = sessions
            if lines != self._lines or unready != self._unready:
                self._lines, self._unready = lines, unready
                self._since = self._clock()
        return self._lines

    def unready(self) -> frozenset[str]:
        """The replicas that said they cannot lead now, as read with :meth:`lines`."""
        return self._unready

    def _read_unready(self) -> frozenset[str]:
        """The unready listing's replica ids (watched); a stranger's child or an unreadable listing counts for none."""
        if self._unready_path is None:
            return frozenset()
        try:
            return list_unready(self._client, self._unready_path, watch=self._on_change)
        except NoAuthError:
            if not self._unreadable_said:
                self._unreadable_said = True
                logger.error(
                    "zkbeat: %s may not be listed with this replica's credentials (NoAuth): replicas that "
                    "cannot lead now are not known here; check zkbeat_auth",
                    self._unready_path,
                )
            return frozenset()

    def _unready_now(self) -> frozenset[str]:
        """The listing as read, with this replica as it knows itself: its mark may be unwritten yet, or refused."""
        others = self._unready - {self.me}
        return others | {self.me} if self.unready_why is not None else others

    @property
    def unready_why(self) -> str | None:
        """Why this replica cannot lead now (its mark's reason: the first cause's), None while it can."""
        return next(iter(self._whys.values()), None)

    def unready_for(self, cause: str) -> bool:
        """Whether this replica is marked unready for ``cause`` (SCHEDULE, BROKER)."""
        return cause in self._whys

    def mark_unready(self, why: str, cause: str = SCHEDULE) -> None:
        """Say to every replica that this one cannot lead now (:meth:`keep_mark` writes it); ``why`` cut to MAX_WHY.

        Each ``cause`` is cleared on its own (:meth:`mark_ready`): a schedule
        that loads says nothing about the broker, nor a broker that answers
        about the schedule.
        """
        with self._whys_lock:
            self._whys = {**self._whys, cause: cap_why(why)}  # rebound, not changed: other threads may read it
            self._marked = {**self._marked, cause: self._marked.get(cause, 0) + 1}

    def marks(self, cause: str) -> int:
        """How many times ``cause`` was marked so far: taken before a probe, given to :meth:`mark_ready` after it."""
        return self._marked.get(cause, 0)

    def mark_ready(self, cause: str = SCHEDULE, marks: int | None = None) -> bool:
        """``cause`` no longer keeps this replica from leading; with none left, :meth:`keep_mark` unmarks it.

        ``marks``: :meth:`marks` as it was when the probe that found the
        cause over began. A mark made since (a broker handover on its own
        thread, while the probe was under way) is newer than that answer and
        stays: False. True when ``cause`` no longer holds.
        """
        with self._whys_lock:
            if marks is not None and self._marked.get(cause, 0) != marks:
                return False
            self._whys = {key: why for key, why in self._whys.items() if key != cause}
            if not self._whys:
                self._passed, self._gave_way = {}, {}  # rebound, not cleared: beat's thread may be reading them
            return True

    def keep_mark(self) -> None:
        """Make this replica's mark in ZooKeeper what it should be, as the listing last read shows it.

        Called every pass: a mark lost with a session is written again, one
        left by a failed delete is deleted again. A mark ZooKeeper refuses
        (NoAuth, a stranger's znode) is said once; raises a broken connection.
        """
        if self._unready_path is None:
            return
        marked = self.me in self._unready
        path = f"{self._unready_path}/{self.me}"
        try:
            if self.unready_why is not None and not marked:
                data = json.dumps({**self._about, "why": self.unready_why, "since": time.time()}).encode()
                try:
                    self._client.create(path, data, ephemeral=True, makepath=True)
                except NodeExistsError:
                    pass
                self._changed.set()  # see the mark in the next read
            elif self.unready_why is None and marked:
                try:
                    self._client.delete(path)
                except NoNodeError:
                    pass
                self._changed.set()
        except NoAuthError:
            # Someone else's ACL on the listing: this replica cannot say it (the fair share's rule of
            # FAILED_TARGET_TIME still holds); said once, tried again at each pass (one request).
            if not self._denied_said:
                self._denied_said = True
                logger.error(
                    "zkbeat: %s may not be written with this replica's credentials (NoAuth): other replicas "
                    "are not told that it cannot lead now; check zkbeat_auth",
                    path,
                )
        except (ConnectionLoss, SessionExpiredError):
            raise
        except ZookeeperError as exc:
            # ZooKeeper refuses it for good (someone else's ephemeral znode where the listing should be:
            # no child may be made under it): as above, said once and tried again at each pass.
            if not self._refused_said:
                self._refused_said = True
                logger.error(
                    "zkbeat: %s cannot be written (%r): other replicas are not told that it cannot lead now; "
                    "is %s someone else's znode?",
                    path,
                    exc,
                    self._unready_path,
                )

    def decide(self) -> Move | None:
        """This replica's move now, or None (still settling, held off, or fair already)."""
        lines = self.lines()
        now = self._clock()
        if now - self._since < SETTLE_TIME or now - self._moved_at < SETTLE_TIME:
            return None
        self._note_lost_handovers(lines, now)
        self._note_gave_way(lines, now)
        move = rebalance(lines, self.me, self.shards, self._excluded(now), self._unready_now())
        if move is not None:
            self._moved_at = now
            if move.lead:
                target = lines[move.shard][1]
                self._handed[move.shard] = (target, now, False, self._sessions.get(target))
            elif self.unready_why is not None:
                mine = self._sequences.get(move.shard, {}).get(self.me, -1)
                self._passed[move.shard] = (mine, frozenset(lines[move.shard][2:]))
        return move

    def ready_successor(self, shard: int) -> str | None:
        """While marked unready: who can lead behind this one in ``shard``'s line (:func:`ready_successor`).

        Reads the lines again if a watch fired (raises the connection's
        errors). The step aside it leads to counts as a handover to that
        replica: should it step out of that line in turn (it cannot lead
        either, and no mark of its own says so: an older release), this one
        steps aside for it no more for FAILED_TARGET_TIME.
        """
        lines = self.lines()
        if self.unready_why is None:
            return None
        now = self._clock()
        cannot = self._unready_now() | self._failed_now(now)
        successor = ready_successor(lines.get(shard, ()), self.me, cannot, listed=self.me in self._unready)
        if successor is not None:
            self._handed[shard] = (successor, now, False, self._sessions.get(successor))
        return successor

    def _failed_now(self, now: float) -> set[str]:
        """The replicas that lost a shard this one handed them, not handed another yet (FAILED_TARGET_TIME)."""
        return {replica for replica, until in self._failed.items() if until > now}

    def _excluded(self, now: float) -> set[str]:
        excluded = self._failed_now(now)
        if self.unready_why is not None:
            excluded |= {replica for replica, until in self._gave_way.items() if until > now}
        return excluded

    def _note_gave_way(self, lines: Mapping[int, Sequence[str]], now: float) -> None:
        """While unready: a replica this one stepped back behind, now behind it again in that line, gave way to it.

        A release before the unready mark steps back for a replica that
        leads fewer shards than its share, marked or not; were this one to
        step back for it again, the two would swap places in that line for
        as long as this one cannot lead. Told by the candidates' sequences:
        this one's candidate there is newer than when it stepped back (it
        did), and that replica's is newer still (it joined again after).
        This one keeps the place it was given, for FAILED_TARGET_TIME or
        until it can lead.
        """
        if self.unready_why is None:
            self._passed, self._gave_way = {}, {}
            return
        for shard, (before, passed) in self._passed.items():
            line = lines.get(shard, ())
            if len(line) > 2 and line[1] == self.me and self._sequences.get(shard, {}).get(self.me, -1) > before:
                for replica in passed.intersection(line[2:]):
                    self._gave_way[replica] = now + FAILED_TARGET_TIME
        self._gave_way = {replica: until for replica, until in self._gave_way.items() if until > now}

    def _note_lost_handovers(self, lines: Mapping[int, Sequence[str]], now: float) -> None:
        """A replica that lost a shard this one handed it, and is in line still or again: hand it no other for a while.

        Read from lines that stood still for SETTLE_TIME and changed since the
        handover. Out of that line and in others' lines: it stepped out and
        stays out (its schedule did not load, it refused to lead). In no line:
        it stopped, or its loop stalled (the watchdog holds it out of every
        line until the loop turns again, under the same session), which
        tells only its return: seen in a line again (within FAILED_TARGET_TIME
        of the handover) under that session, it lost the shard too. Under
        another session, its session ended (a partition, a paused process):
        that says nothing of its loop, and holding it against the replica
        would keep this one above its share for FAILED_TARGET_TIME. A
        step-down on request, or a fair-share move of its own, joins the line
        again at once and is never seen out of it.
        Handing it the next shard would move that shard to a replica that
        cannot lead it, again and again.
        """
        for shard, (target, at, away, session) in list(self._handed.items()):
            if now - at > FAILED_TARGET_TIME:
                del self._handed[shard]
                continue
            if self._since <= at or (not away and target in lines.get(shard, ())):
                continue
            if not any(target in line for line in lines.values()):
                self._handed[shard] = (target, at, True, session)  # stopped, or stalled: told when it comes back
                continue
            del self._handed[shard]
            if away and self._sessions.get(target) != session:
                continue  # back under a new session: its session ended, its loop did not stall
            self._failed[target] = now + FAILED_TARGET_TIME
        self._failed = {replica: until for replica, until in self._failed.items() if until > now}

    def next_look(self) -> float:
        """Seconds until :meth:`decide` may answer the move the lines last read call for (inf: none is due).

        A replica whose shards have nothing due sleeps up to max_interval;
        this bounds that sleep, so a move waits out SETTLE_TIME, not the sleep.
        """
        if rebalance(self._lines, self.me, self.shards, self._excluded(self._clock()), self._unready_now()) is None:
            return math.inf
        now = self._clock()
        left = max(SETTLE_TIME - (now - self._since), SETTLE_TIME - (now - self._moved_at))
        # Nothing left to wait out, yet no move was made (ZooKeeper did not answer the read, or the
        # connection is down): look again in SETTLE_TIME, never in a loop as fast as the pass.
        return left if left > 0 else SETTLE_TIME

"""LeaderElection: a leader latch over kazoo, with Curator LeaderLatch semantics.

Usable on its own, without Celery, as an ``is_leader`` guard::

    election = LeaderElection(client, "/myapp/election", {"identity": "web-1"})
    election.start()
    if election.wait_for_leadership(timeout=5):
        ...  # act while election.is_leader stays true

Every ZooKeeper call runs on the election's own worker thread. kazoo's
listener and watch callbacks only flip state and wake that thread, because
kazoo runs them on its single event thread: a callback that blocked or called
ZooKeeper there would stall every other callback of the client.
"""

from __future__ import annotations

import json
import logging
import threading
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, NamedTuple

from kazoo.client import KazooClient, TransactionRequest
from kazoo.exceptions import KazooException, NoAuthError, NoNodeError, ZookeeperError
from kazoo.protocol.states import EventType, KazooState, WatchedEvent

from .._decode import json_object
from .candidates import PREFIX, CandidateNode, CandidateReader, parse_name

__all__ = [
    "LeaderElection",
    "Fence",
    "Departure",
    "Handover",
    "LATENT",
    "STARTED",
    "CLOSED",
    "candidate_sequence",
    "request_step_down",
    "events",
]

logger = logging.getLogger(__name__)
#: The events an operator follows (who leads and after whom, who follows,
#: step-downs, pauses, resumes), one line each, on a logger of their own:
#: zkbeat's scheduler sets it to INFO when nothing else did, so that these
#: lines show at celery beat's default level (WARNING) too.
events = logging.getLogger("zkbeat.events")

#: Lifecycle states (separate from "has leadership", as in Curator).
LATENT = "LATENT"
STARTED = "STARTED"
CLOSED = "CLOSED"

_PREFIX = PREFIX
_SEQUENCE_DIGITS = 10
#: How long close() waits for ZooKeeper to confirm the candidate's deletion.
_CLOSE_TIMEOUT = 2.0
#: Back-off after an unexpected ZooKeeper error inside the worker.
_RETRY_DELAYS = (0.1, 0.25, 0.5, 1.0, 2.0)

Listener = Callable[[bool], None]
PredecessorListener = Callable[["CandidateNode | None"], None]
#: Key, in the election node's data, of the note a leader leaves as it goes.
DEPARTURE_KEY = "left"


@dataclass(frozen=True)
class Departure:
    """Why a leader left: the note its last write leaves in the election node for its successor.

    Written in the same transaction that deletes the candidate (by the
    leader on close or step-down, by ``zkbeat step-down``), so the successor,
    whose watch that delete fires, finds it when it reads the node.
    ``failed`` marks a departure that something failing caused.
    """

    candidate: str
    why: str
    failed: bool = False

    def as_data(self) -> dict[str, Any]:
        return {
            "candidate": self.candidate,
            "why": self.why,
            "failed": self.failed,
            "at": datetime.now(timezone.utc).isoformat(),
        }

    @classmethod
    def of(cls, data: Any) -> Departure | None:
        if not isinstance(data, dict):
            return None
        candidate, why = data.get("candidate"), data.get("why")
        if not isinstance(candidate, str) or not isinstance(why, str) or not why:
            return None
        return cls(candidate, why, data.get("failed") is True)


@dataclass(frozen=True)
class Handover:
    """The leader before this replica's term, as the election node named it just before this one took over."""

    #: Candidate name of the leader before, or None: this root's first leader.
    previous: str | None = None
    identity: str | None = None
    #: Its departure note, if it left one (a graceful stop, a step-down).
    departure: Departure | None = None

    @property
    def epoch(self) -> int | None:
        try:
            return candidate_sequence(self.previous) if self.previous else None
        except ValueError:
            return None


def _election_data(raw: bytes | None) -> dict[str, Any]:
    """The election node's JSON {leader, leader_since, identity, left}; {} for anything else."""
    try:
        return json_object(raw, empty_ok=True)
    except ValueError:
        return {}


def _handover(raw: bytes | None) -> Handover:
    data = _election_data(raw)
    previous, identity = data.get("leader"), data.get("identity")
    if not isinstance(previous, str) or not previous:
        return Handover()
    departure = Departure.of(data.get(DEPARTURE_KEY))
    if departure is not None and departure.candidate != previous:
        departure = None  # a note about someone else: not why this leader left
    return Handover(previous, identity if isinstance(identity, str) and identity else None, departure)


def _epoch_of(handover: Handover) -> int:
    """The handover's epoch; -1 when its candidate name has none (every real candidate comes after it)."""
    return -1 if handover.epoch is None else handover.epoch


def request_step_down(client: KazooClient, candidate_path: str, by: str) -> None:
    """Delete the leading candidate at ``candidate_path`` (``zkbeat step-down``), noting who asked.

    The note and the delete are one transaction, so the successor reads why
    its predecessor left. NoNodeError if the candidate is gone already.
    """
    election_path, name = candidate_path.rsplit("/", 1)
    raw, stat = client.get(election_path)
    data = {**_election_data(raw), DEPARTURE_KEY: Departure(name, f"stepped down on request by {by}").as_data()}
    transaction = client.transaction()
    transaction.set_data(election_path, json.dumps(data, sort_keys=True).encode(), version=stat.version)
    transaction.delete(candidate_path)
    results = transaction.commit()
    if isinstance(results[-1], NoNodeError):
        raise NoNodeError(candidate_path)
    if any(isinstance(result, Exception) for result in results):
        client.delete(candidate_path)  # the note could not be written (a new leader announced meanwhile): just go


def _who(candidate: CandidateNode) -> str:
    """How a log line names a candidate: its identity, never its 32-hex znode name."""
    identity = candidate.data.get("identity") if candidate.readable else None
    return identity if isinstance(identity, str) and identity else f"an unnamed candidate (epoch {candidate.sequence})"


class Fence(NamedTuple):
    """This replica's candidate as one value: its epoch and its znode's path.

    Read as one attribute, so a reader never pairs the epoch of one candidate
    with the path of the next (the election swaps the whole value).
    """

    epoch: int
    candidate: str


@dataclass(frozen=True)
class _Mine:
    """Our candidate and the session that created it (one value, swapped whole)."""

    fence: Fence
    session: int | None


def candidate_sequence(name: str) -> int:
    """The sequence number ZooKeeper appended to a candidate's name.

    Raises ValueError for a child that is not a candidate (ignored by callers).
    """
    if not name.startswith(_PREFIX) or len(name) <= _SEQUENCE_DIGITS:
        raise ValueError(name)
    return int(name[-_SEQUENCE_DIGITS:])


def sorted_candidates(children: list[str]) -> list[str]:
    """Names zkbeat makes, in election order (lowest sequence first); others dropped.

    By name only: the election itself also drops persistent lookalikes,
    which needs their stats (see candidates.CandidateReader).
    """
    ranked = []
    for child in children:
        parsed = parse_name(child)
        if parsed is None:
            logger.debug("zkbeat: ignoring unexpected znode %r among election candidates", child)
        else:
            ranked.append((parsed[1], child))
    return [child for _, child in sorted(ranked)]


class LeaderElection:
    """One replica's place in a leader election under ``path``.

    Each replica creates one ephemeral sequential candidate; the lowest
    sequence leads; each follower watches only its predecessor (no herd).
    The leader's sequence number is its ``epoch``, a fencing token that only
    grows from one leader to the next. Children that zkbeat did not make (a
    persistent or oddly named "candidate") are strangers: logged once, never
    led by and never waited on; a candidate it may not read (another
    ``zkbeat_auth``) keeps its place, unidentified (see candidates.py).

    Every leadership decision carries the token current when the worker
    began it; step_down(), recheck(), a connection state change and the
    deletion of our own node each take a new token, so a decision begun
    before them never counts, even if it lands after them.

    Transitions (checked against the code in ``_on_connection_state``,
    ``_on_watch``, ``_invalidate`` and ``_reconcile``):

    ==============================  ==========================================  =======
    event                           action                                      leader
    ==============================  ==========================================  =======
    start()                         create candidate, then check                maybe
    own candidate first among the   (CONNECTED, owned by this session, token    yes
    real candidates                 unchanged since the check began) lead;
                                    announce it, unless made with
                                    announce=False (then :meth:`announce`)
    predecessor deleted (watch)     re-check, watch the new predecessor         maybe
    predecessor gone before the     (get answers NoNode: no watch is left       maybe
    watch is set                    behind) re-check
    predecessor's data changed      re-check; predecessor listeners hear the    -
    (watch)                         new data (annotate(): a question for us)
    stranger's child (persistent,   logged once, skipped: neither leader nor    -
    or a name zkbeat never makes)   predecessor
    SUSPENDED                       stop at once, in the listener (new token)   no
    CONNECTED, same session         re-check node exists, owner, sorts first    maybe
    LOST / new session              forget the candidate (and any pending       no
                                    step-down: the node went with the
                                    session), create a new one
    own candidate deleted           (step-down, external delete) rejoin at the  no
                                    back of the line
    step_down()                     new token; delete the candidate, rejoin     no
                                    at the back
    step_down(hold=True)            as step_down(), but no new candidate        no
                                    until resume()
    step-down's delete fails        stays pending, retried on the next pass     no
    (ConnectionLoss)                until ZooKeeper confirms (NoNode counts)
                                    or the session is gone
    recheck()                       new token; re-check as on CONNECTED         maybe
    close()                         delete candidate first, stop worker         no
    ==============================  ==========================================  =======

    Limits: listeners run on the election's worker thread and must return
    quickly; they hear edges only (became leader / stopped being leader). The
    election never stops or closes the client it was given.
    """

    def __init__(
        self,
        client: KazooClient,
        path: str,
        data: Mapping[str, Any] | None = None,
        *,
        name: str = "zkbeat",
        announce: bool = True,
        label: str = "",
    ) -> None:
        self.client = client
        #: Put before the epoch in this election's log lines, e.g. ``"shard 1/3, "`` (zkbeat.coordination.shards).
        self._label = label
        #: Announce on becoming the head of the line; False: the owner calls
        #: :meth:`announce` once it acts as leader (a scheduler, after its
        #: first pass), so status tools never name a head that does not lead.
        self._announce_on_lead = announce
        self.path = path.rstrip("/")
        self._info = dict(data or {})
        self._data = self._encoded({})
        self._guid = uuid.uuid4().hex
        self._name = name
        self._state = LATENT
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._leader_event = threading.Event()
        self._reported = False
        # Taken anew (under _lock) by every event that must void a decision in
        # flight; a decision counts only while its token is still current.
        self._token = 0
        #: (token, fence) of the leadership last decided, or None.
        self._leadership: tuple[int, Fence] | None = None
        self._listeners: list[Listener] = []
        self._mine: _Mine | None = None
        self._reader = CandidateReader(client, self.path)  # the worker's
        self._caller_reader = CandidateReader(client, self.path)  # candidates()'
        #: The candidate whose leadership was last written to the election node, and what was written.
        self._announced: str | None = None
        self._announcement: dict[str, Any] = {}
        #: (our candidate, the election node's data as it was just before that candidate announced).
        self._previous: tuple[str, bytes] | None = None
        #: The leader this follower last said it follows.
        self._following: str | None = None
        #: Why the pending step-down was asked for, and whether a failure caused it.
        self._step_down_reason: tuple[str, bool] = ("asked to", False)
        # step_down() counts requests; the worker counts the ones done, so a
        # request made while one is being carried out is never lost.
        self._step_downs_requested = 0
        self._step_downs_done = 0
        #: Set by step_down(hold=True): no new candidate until resume().
        self._held = False
        self._predecessor_listeners: list[PredecessorListener] = []
        #: The candidate this follower waits on (None while leading or out of line).
        self._predecessor: CandidateNode | None = None
        #: The last candidate just ahead of ours (kept once we head the line): who went before us.
        self._ahead: CandidateNode | None = None
        self._thread: threading.Thread | None = None

    def _encoded(self, extra: Mapping[str, Any]) -> bytes:
        return json.dumps({**self._info, **extra}, sort_keys=True).encode()

    # -- public API --------------------------------------------------------

    @property
    def state(self) -> str:
        """Lifecycle: LATENT, STARTED or CLOSED."""
        return self._state

    @property
    def is_leader(self) -> bool:
        """True only while this replica leads AND its connection is live.

        ``client.state`` is updated by kazoo before any listener runs, so a
        SUSPENDED connection reads as "not leader" from that instant.
        """
        return self.leadership is not None

    @property
    def leadership(self) -> Fence | None:
        """The fence this replica leads under, or None while it does not lead.

        One read answers both "do I lead?" and "under which candidate?": a
        caller holding a term can compare fences to see that its term ended.
        """
        decided, mine = self._leadership, self._mine
        if decided is None or mine is None or self.client.state != KazooState.CONNECTED:
            return None
        token, fence = decided
        return fence if token == self._token and fence == mine.fence else None

    @property
    def fence(self) -> Fence | None:
        """This replica's candidate as one immutable (epoch, candidate) value, if it has one.

        Leading or not; see ``leadership`` for the fence of a current lead.
        """
        mine = self._mine
        return mine.fence if mine is not None else None

    @property
    def candidate(self) -> str | None:
        """Full path of this replica's candidate znode, if it has one."""
        fence = self.fence
        return fence.candidate if fence else None

    @property
    def epoch(self) -> int | None:
        """This replica's candidate sequence number (its fencing token)."""
        fence = self.fence
        return fence.epoch if fence else None

    def start(self) -> None:
        """Join the election; returns at once (connecting happens in the background)."""
        with self._lock:
            if self._state != LATENT:
                raise RuntimeError(f"election already {self._state.lower()}")
            self._state = STARTED
        self.client.add_listener(self._on_connection_state)
        self._thread = threading.Thread(target=self._run, name=f"{self._name}-election", daemon=True)
        self._thread.start()
        self._wake.set()

    def wait_for_leadership(self, timeout: float | None = None) -> bool:
        """Block until this replica leads or ``timeout`` passes; returns is_leader."""
        self._leader_event.wait(timeout)
        return self.is_leader

    def add_listener(self, listener: Listener) -> None:
        """Call ``listener(is_leader)`` on every leadership edge (worker thread)."""
        self._listeners.append(listener)

    def remove_listener(self, listener: Listener) -> None:
        self._listeners.remove(listener)

    def step_down(self, *, hold: bool = False, reason: str = "asked to", failed: bool = False) -> None:
        """Give up leadership (or the place in line) and rejoin at the back.

        Not leader from the moment this returns. The candidate is deleted by
        the worker; if that fails (connection lost) it tries again until
        ZooKeeper confirms, or the session ends and takes the node with it.
        With ``hold`` the replica stays out of line until :meth:`resume`
        (a hung leader's watchdog: it contends again once its loop turns).
        ``reason`` is logged and left for the successor, with ``failed``
        when a failure (not a request) made it step down.
        """
        with self._lock:
            self._step_downs_requested += 1
            self._step_down_reason = (reason, failed)
            if hold:
                self._held = True
        self._invalidate()

    def resume(self) -> None:
        """Join the line again after ``step_down(hold=True)``; a no-op otherwise."""
        with self._lock:
            if not self._held:
                return
            self._held = False
        self._wake.set()

    @property
    def held(self) -> bool:
        """True while out of line after ``step_down(hold=True)``."""
        return self._held

    @property
    def predecessor(self) -> CandidateNode | None:
        """The candidate this follower waits on, as last read (None while leading)."""
        return self._predecessor

    def add_predecessor_listener(self, listener: PredecessorListener) -> None:
        """Call ``listener(candidate or None)`` when the predecessor or its data changes (worker thread: quick)."""
        self._predecessor_listeners.append(listener)

    def annotate(self, extra: Mapping[str, Any] | None, *, candidate: str | None = None) -> bool:
        """Set our candidate's data to what it was created with plus ``extra`` (None: as created).

        Only while ``candidate`` (if given) is still ours; False when it is
        not, or is gone. Writing it wakes our successor, whose watch is on it
        (that is the point: zkbeat.coordination.broker_handover asks it a question this
        way); a new candidate starts without ``extra``. Any thread but kazoo's.
        """
        mine = self._mine
        if mine is None or (candidate is not None and mine.fence.candidate != candidate):
            return False
        try:
            self.client.set(mine.fence.candidate, self._encoded(extra or {}))
        except NoNodeError:
            return False
        return True

    def recheck(self) -> None:
        """Ask the worker to re-verify leadership (e.g. after a fenced claim).

        Not leader until the re-check, begun after this call, says so.
        """
        self._invalidate()

    def handover(self, fence: Fence) -> Handover | None:
        """Who led before this replica took over under ``fence``, and why they left; None if unknown.

        From the election node as it was just before this replica announced itself.
        """
        if self._previous is None or self._previous[0] != fence.candidate:
            if self._announced == fence.candidate or self.leadership != fence:
                return None
            try:
                self._read_previous(fence)
            except (KazooException, ZookeeperError):
                return None
        handover = _handover(self._previous[1])
        ahead = self._ahead
        if ahead is not None and handover.previous is not None and ahead.sequence > _epoch_of(handover):
            # The candidate we last waited on came after the leader the node names: it headed the line
            # after that one and left without announcing itself (its schedule never loaded, say), so it
            # is whom we took over from, and the note the node holds is about someone else.
            identity = ahead.data.get("identity") if ahead.readable else None
            return Handover(ahead.name, identity if isinstance(identity, str) and identity else None)
        return handover

    def _read_previous(self, fence: Fence) -> None:
        """Read the election node as it is before ``fence`` announces itself: who led, and the note they left.

        Once per candidate: by :meth:`handover` when the new leader asks
        (its takeover line), else by :meth:`_announce` just before its write.
        """
        if self._previous is not None and self._previous[0] == fence.candidate:
            return
        try:
            raw, _ = self.client.get(self.path)
        except (NoNodeError, NoAuthError):
            raw = b""  # unreadable: the takeover line will not name a predecessor, nothing else depends on it
        try:
            json_object(raw, empty_ok=True)
        except ValueError as exc:  # a stranger's write: read as a fresh node, and overwritten by our announcement
            logger.warning(
                "zkbeat: the election node %s held data zkbeat cannot read (%s); no predecessor is named",
                self.path,
                exc,
            )
        self._previous = (fence.candidate, raw or b"")

    def close(self, reason: str = "shut down") -> None:
        """Leave the election: delete the candidate first (graceful handover).

        Safe to call twice (Celery closes the scheduler twice on SIGTERM).
        Deleting is what wakes the next replica's watch at once; if ZooKeeper
        is unreachable the candidate goes when the session ends instead. A
        leader leaves ``reason`` (``SIGTERM``) for its successor to log.
        """
        with self._lock:
            if self._state == CLOSED:
                return
            self._state = CLOSED
        self._invalidate()
        self.client.remove_listener(self._on_connection_state)
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(_CLOSE_TIMEOUT)
        mine, self._mine = self._mine, None
        if mine and self.client.state == KazooState.CONNECTED:
            try:
                self._delete(mine.fence, reason, failed=False, timeout=_CLOSE_TIMEOUT)
            except NoNodeError:
                pass
            except Exception as exc:  # noqa: BLE001 - shutdown must finish
                logger.warning(
                    "zkbeat: could not delete this replica's candidate (epoch %s) on close: %r", mine.fence.epoch, exc
                )
        self._notify()

    def _delete(self, fence: Fence, why: str, *, failed: bool, timeout: float | None = None) -> None:
        """Delete our candidate; as the announced leader, leave why in the election node first.

        The note goes out in a transaction that also checks our candidate
        still exists (a deposed leader must not overwrite its successor's
        announcement), pipelined before the delete: ZooKeeper applies one
        session's requests in order, so the successor, woken by the delete,
        reads the note. Its outcome is not waited for: only a log line
        depends on it. Raises NoNodeError if the candidate is gone already.
        """
        candidate = fence.candidate
        if self._announced == candidate and self._announcement:
            note = Departure(candidate.rsplit("/", 1)[1], why, failed)
            data = {**self._announcement, DEPARTURE_KEY: note.as_data()}
            transaction = self.client.transaction()
            transaction.check(candidate, -1)
            transaction.set_data(self.path, json.dumps(data, sort_keys=True).encode())
            transaction.commit_async()
        self.client.delete_async(candidate).get(timeout=timeout)

    def note_departure(self, transaction: TransactionRequest, fence: Fence, why: str, *, failed: bool) -> None:
        """Add to ``transaction`` the note that ``fence``'s leader left, and ``why``, if it announced itself.

        For a caller that deletes our candidate in a transaction of its own
        (zkbeat.coordination.broker_handover): the note lands exactly when the delete
        does, so the successor, woken by the delete, reads why, as it does
        after a step-down (:meth:`_delete`). Nothing is added for a leader
        that never announced itself: its successor names no predecessor.
        """
        candidate = fence.candidate
        if self._announced != candidate or not self._announcement:
            return
        note = Departure(candidate.rsplit("/", 1)[1], why, failed)
        data = {**self._announcement, DEPARTURE_KEY: note.as_data()}
        transaction.set_data(self.path, json.dumps(data, sort_keys=True).encode())

    def candidates(self) -> list[tuple[str, dict[str, Any]]]:
        """Every real candidate in election order with its data (ZooKeeper reads; strangers left out)."""
        line = self._caller_reader.read()
        return [(c.name, dict(c.data)) for c in line.candidates]

    # -- kazoo callbacks: state and wake-ups only ---------------------------

    def _on_connection_state(self, state: str) -> None:
        # Any change voids a decision in flight: one made before SUSPENDED, or
        # under the connection before a reconnect, is re-checked first.
        self._invalidate()

    def _on_watch(self, event: WatchedEvent) -> None:
        mine = self._mine
        if event.type == EventType.DELETED and mine is not None and event.path == mine.fence.candidate:
            self._invalidate()
        self._wake.set()

    # -- worker ------------------------------------------------------------

    def _invalidate(self) -> None:
        """Void every decision made or in flight, and wake the worker (any thread; never blocks)."""
        with self._lock:
            self._token += 1
            self._leadership = None
            self._leader_event.clear()
        self._wake.set()

    def _drop_leadership(self) -> None:
        with self._lock:
            self._leadership = None
            self._leader_event.clear()

    def _decide_leader(self, token: int, fence: Fence) -> bool:
        """Record leadership decided under ``token``; False if an event voided it meanwhile."""
        with self._lock:
            if token != self._token:
                return False
            self._leadership = (token, fence)
            self._leader_event.set()
            return True

    def _run(self) -> None:
        failures = 0
        while True:
            delay = _RETRY_DELAYS[min(failures, len(_RETRY_DELAYS) - 1)] if failures else None
            self._wake.wait(delay)
            self._wake.clear()
            if self._state == CLOSED:
                return
            try:
                self._reconcile()
                failures = 0
            except (KazooException, ZookeeperError) as exc:
                # ConnectionLoss and friends: the listener will wake us when
                # the connection comes back; other errors retry with back-off.
                self._drop_leadership()
                failures += 1
                log = logger.debug if failures > 1 else logger.warning
                if isinstance(exc, NoAuthError):
                    # Nothing in kazoo's error says where: name the path, or
                    # the operator is left guessing whose ACL is in the way.
                    log(
                        "zkbeat: ZooKeeper denied access (NoAuth) to %s or a parent: its ACL does not grant "
                        "this client's credentials; retrying",
                        self.path,
                    )
                else:
                    log("zkbeat: election check failed (%r); retrying", exc)
            except Exception:  # noqa: BLE001 - the worker must outlive bugs in data
                self._drop_leadership()
                failures += 1
                logger.exception("zkbeat: election check failed unexpectedly; retrying")
            self._notify()

    def _reconcile(self) -> None:
        client = self.client
        token = self._token  # before any read: what happens after it voids this pass
        if client.state != KazooState.CONNECTED:
            self._drop_leadership()
            return
        try:
            self._reconcile_connected(client, token)
        except BaseException:
            self._set_predecessor(None)
            raise

    def _reconcile_connected(self, client: KazooClient, token: int) -> None:
        session_id = client.client_id[0] if client.client_id else None
        mine = self._mine
        if mine is not None and mine.session != session_id:
            # A new session means the old ephemeral candidate is gone.
            self._mine = mine = None
        self._step_down(mine)
        if self._mine is None and self._held:
            self._drop_leadership()
            self._set_predecessor(None)
            return
        if self._mine is None:
            self._join(session_id)
        mine = self._mine
        assert mine is not None
        ours = mine.fence.candidate
        line = self._reader.read()
        position = line.find(ours.rsplit("/", 1)[1])
        if position is None or line.candidates[position].owner != session_id:
            # Deleted from outside, or not ours (Curator's ownership check).
            self._set_predecessor(None)
            self._rejoin(ours)
            return
        self._set_predecessor(line.candidates[position - 1] if position > 0 else None)
        if position == 0:
            # The leader watches its own node, so a step-down from outside is
            # seen at once; a follower watches only its predecessor.
            if not self._watch(ours):
                self._rejoin(ours)
                return
            if self._announce_on_lead:
                self._announce(mine.fence)
            if not self._decide_leader(token, mine.fence):
                self._wake.set()  # voided meanwhile: look again
            return
        self._drop_leadership()
        self._say_following(line.candidates[0])
        if not self._watch(line.candidates[position - 1].path):
            self._wake.set()  # it went between the two reads: look again

    def _say_following(self, head: CandidateNode) -> None:
        """One line when this follower sees a new leader at the head of the line."""
        if self._following == head.name:
            return
        self._following = head.name
        events.info("zkbeat: following %s (%sepoch %s) as %s", _who(head), self._label, head.sequence, self._identity)

    @property
    def _identity(self) -> str:
        identity = self._info.get("identity")
        return identity if isinstance(identity, str) and identity else "this replica"

    def _set_predecessor(self, candidate: CandidateNode | None) -> None:
        previous = self._predecessor
        if (previous.path if previous else None) == (candidate.path if candidate else None):
            if previous is None or candidate is None or previous.data == candidate.data:
                return
            # Same predecessor, new data: its watch fired because it wrote it.
        self._predecessor = candidate
        if candidate is not None:
            self._ahead = candidate
        for listener in list(self._predecessor_listeners):
            try:
                listener(candidate)
            except Exception:  # noqa: BLE001 - one bad listener must not stop the election
                logger.exception("zkbeat: predecessor listener %r failed", listener)

    def _step_down(self, mine: _Mine | None) -> None:
        """Carry out requested step-downs: delete our candidate, confirmed.

        The request stays pending until ZooKeeper confirms the delete (NoNode
        counts: it is gone) or the session is gone (``mine`` is None: the
        node went with it). A ConnectionLoss propagates with it still pending.
        """
        requested = self._step_downs_requested
        if requested == self._step_downs_done:
            return
        if mine is not None:
            reason, failed = self._step_down_reason
            events.info(
                "zkbeat: stepping down (%sepoch %s): %s; %s",
                self._label,
                mine.fence.epoch,
                reason,
                "out of the election until its loop turns again"
                if self._held
                else "joining the election again at the back",
            )
            try:
                self._delete(mine.fence, f"stepped down: {reason}", failed=failed)
            except NoNodeError:
                pass
            self._mine = None
        self._step_downs_done = requested

    def _watch(self, path: str) -> bool:
        """Set a data watch on ``path``; False if it is gone (or no longer ephemeral).

        A get, not an exists: an exists watch on a node that vanished between
        the listing and the watch would stay on the server until the session
        ends; a get on a missing node answers NoNode and leaves nothing. A
        node this client may not read (NoAuth: a candidate whose replica has
        another ``zkbeat_auth``, candidates.py) is watched with an exists,
        which needs no permission: it keeps its place, so it is waited on.
        """
        try:
            _, stat = self.client.get(path, watch=self._on_watch)
        except NoNodeError:
            return False
        except NoAuthError:
            stat = self.client.exists(path, watch=self._on_watch)
            if stat is None:
                return False
        return bool(stat.ephemeralOwner)

    def _rejoin(self, candidate: str) -> None:
        """Our candidate is gone from outside (``zkbeat step-down``, a liveness verdict, a hand): join again."""
        epoch = candidate_sequence(candidate.rsplit("/", 1)[1])
        departure = self._departure_of(candidate)
        if departure is not None:
            events.info(
                "zkbeat: %s (%sepoch %s); joining the election again at the back", departure.why, self._label, epoch
            )
        else:
            events.warning(
                "zkbeat: this replica's candidate (%sepoch %s) was deleted from outside; joining the election again "
                "at the back",
                self._label,
                epoch,
            )
        self._mine = None
        self._drop_leadership()
        self._wake.set()

    def announce(self, fence: Fence) -> None:
        """Say on the election node that ``fence`` leads, if it still does.

        For an election made with ``announce=False``, from the thread that
        acts as leader (never a kazoo callback): the first call per candidate
        reads the election node once (who led before, :meth:`_announce`);
        the write is asynchronous, and repeated calls cost nothing once it
        succeeded. ZooKeeper's errors of that read propagate.
        """
        if self.leadership == fence:
            self._announce(fence)

    def _departure_of(self, candidate: str) -> Departure | None:
        """The note left in the election node about ``candidate`` (a ``zkbeat step-down``), if any."""
        try:
            raw, _ = self.client.get(self.path)
        except (KazooException, ZookeeperError):
            return None
        departure = Departure.of(_election_data(raw).get(DEPARTURE_KEY))
        return departure if departure is not None and departure.candidate == candidate.rsplit("/", 1)[1] else None

    def _announce(self, fence: Fence) -> None:
        """Say since when this candidate leads (for status tools) in the election node's data.

        Nobody watches that node: written into the candidate it would fire the
        successor's watch and wake a follower for nothing. The node is read
        first, once per candidate (one round trip): who led before, and the
        note it left (:meth:`handover`); the write is asynchronous, so the
        leader does not wait for it. ``zkbeat health`` counts a head as
        leading only once it has announced, so a write that fails is made
        again on the next pass (the reconnect's, after a ConnectionLoss).
        """
        if self._announced == fence.candidate:
            return
        # Who led before, and the note it left (read before our write
        # replaces it; a failed read leaves this pass to be made again).
        self._read_previous(fence)
        self._announced = fence.candidate
        self._following = None
        since = datetime.now(timezone.utc).isoformat()
        announcement = {"leader": fence.candidate.rsplit("/", 1)[1], "leader_since": since}
        if isinstance(self._info.get("identity"), str):
            announcement["identity"] = self._info["identity"]
        self._announcement = announcement
        # The last departure note stays: the leader it is about may read it
        # after this write (it learns of its step-down as we do).
        note = _election_data(self._previous[1]).get(DEPARTURE_KEY)
        data = {**announcement, DEPARTURE_KEY: note} if note is not None else announcement
        request = self.client.set_async(self.path, json.dumps(data, sort_keys=True).encode())
        request.rawlink(lambda result: self._on_announced(fence, result))

    def _on_announced(self, fence: Fence, result: Any) -> None:
        # kazoo's thread: state only. No wake-up, so a write ZooKeeper keeps
        # refusing (an ACL) is retried once per pass, never in a loop.
        if result.exception is not None and self._announced == fence.candidate:
            self._announced = None

    def _join(self, session_id: int | None) -> None:
        """Adopt our candidate from a lost create() reply, or create one.

        The guid in the name (Curator's "protected" mode) finds a node whose
        create succeeded on the server while the reply was lost; without it
        that orphan would sort first and stall the election for a session.
        """
        client = self.client
        client.ensure_path(self.path)
        line = self._reader.read()
        mine = [c for c in line.candidates if c.guid == self._guid and c.owner == session_id]
        if mine:
            for extra in mine[1:]:
                client.delete(extra.path)
            path = mine[0].path
        else:
            path = client.create(f"{self.path}/{_PREFIX}{self._guid}-", self._data, ephemeral=True, sequence=True)
        self._mine = _Mine(Fence(candidate_sequence(path.rsplit("/", 1)[1]), path), session_id)
        self._following = None
        self._ahead = None
        logger.debug("zkbeat: candidate %s", path)

    def _notify(self) -> None:
        leading = self.is_leader if self._state != CLOSED else False
        if leading == self._reported:
            return
        self._reported = leading
        for listener in list(self._listeners):
            try:
                listener(leading)
            except Exception:  # noqa: BLE001 - one bad listener must not stop the rest
                logger.exception("zkbeat: leadership listener %r failed", listener)

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
from datetime import datetime, timezone
from typing import Any

from kazoo.client import KazooClient
from kazoo.exceptions import KazooException, NoAuthError, NoNodeError, ZookeeperError
from kazoo.protocol.states import EventType, KazooState, WatchedEvent

__all__ = ["LeaderElection", "LATENT", "STARTED", "CLOSED", "candidate_sequence"]

logger = logging.getLogger(__name__)

#: Lifecycle states (separate from "has leadership", as in Curator).
LATENT = "LATENT"
STARTED = "STARTED"
CLOSED = "CLOSED"

_PREFIX = "candidate-"
_SEQUENCE_DIGITS = 10
#: How long close() waits for ZooKeeper to confirm the candidate's deletion.
_CLOSE_TIMEOUT = 2.0
#: Back-off after an unexpected ZooKeeper error inside the worker.
_RETRY_DELAYS = (0.1, 0.25, 0.5, 1.0, 2.0)

Listener = Callable[[bool], None]


def candidate_sequence(name: str) -> int:
    """The sequence number ZooKeeper appended to a candidate's name.

    Raises ValueError for a child that is not a candidate (ignored by callers).
    """
    if not name.startswith(_PREFIX) or len(name) <= _SEQUENCE_DIGITS:
        raise ValueError(name)
    return int(name[-_SEQUENCE_DIGITS:])


def sorted_candidates(children: list[str]) -> list[str]:
    """Candidates in election order (lowest sequence first); strangers dropped."""
    ranked = []
    for child in children:
        try:
            ranked.append((candidate_sequence(child), child))
        except ValueError:
            logger.warning("zkbeat: ignoring unexpected znode %r among election candidates", child)
    return [child for _, child in sorted(ranked)]


class LeaderElection:
    """One replica's place in a leader election under ``path``.

    Each replica creates one ephemeral sequential candidate; the lowest
    sequence leads; each follower watches only its predecessor (no herd).
    The leader's sequence number is its ``epoch``, a fencing token that only
    grows from one leader to the next.

    Transitions (checked against the code in ``_on_connection_state`` and
    ``_reconcile``):

    ============================  ==========================================  =======
    event                         action                                      leader
    ============================  ==========================================  =======
    start()                       create candidate, then check                maybe
    own candidate sorts first     (CONNECTED, owned by this session) lead     yes
    predecessor deleted (watch)   re-check, watch the new predecessor         maybe
    SUSPENDED                     stop at once, in the listener               no
    CONNECTED, same session       re-check node exists, owner, sorts first    maybe
    LOST / new session            forget the candidate, create a new one      no
    own candidate deleted         (step-down, external delete) rejoin at the  no
                                  back of the line
    close()                       delete candidate first, stop worker         no
    ============================  ==========================================  =======

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
    ) -> None:
        self.client = client
        self.path = path.rstrip("/")
        self._info = dict(data or {})
        self._data = self._encoded({})
        self._guid = uuid.uuid4().hex
        self._name = name
        self._state = LATENT
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._leader_event = threading.Event()
        self._leader = False
        self._reported = False
        # Bumped by every connection state change; a leadership decision made
        # under an older connection generation never counts.
        self._connection_generation = 0
        self._leader_generation = -1
        self._listeners: list[Listener] = []
        self._candidate: str | None = None
        self._candidate_session: int | None = None
        #: The candidate whose leadership was last written to the election node.
        self._announced: str | None = None
        self._step_down_requested = False
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
        return (
            self._leader
            and self.client.state == KazooState.CONNECTED
            and self._leader_generation == self._connection_generation
        )

    @property
    def candidate(self) -> str | None:
        """Full path of this replica's candidate znode, if it has one."""
        return self._candidate

    @property
    def epoch(self) -> int | None:
        """This replica's candidate sequence number (its fencing token)."""
        candidate = self._candidate
        return candidate_sequence(candidate.rsplit("/", 1)[1]) if candidate else None

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

    def step_down(self) -> None:
        """Give up leadership (or the place in line) and rejoin at the back."""
        self._step_down_requested = True
        self._drop_leadership()
        self._wake.set()

    def recheck(self) -> None:
        """Ask the worker to re-verify leadership (e.g. after a fenced claim)."""
        self._drop_leadership()
        self._wake.set()

    def close(self) -> None:
        """Leave the election: delete the candidate first (graceful handover).

        Safe to call twice (Celery closes the scheduler twice on SIGTERM).
        Deleting is what wakes the next replica's watch at once; if ZooKeeper
        is unreachable the candidate goes when the session ends instead.
        """
        with self._lock:
            if self._state == CLOSED:
                return
            self._state = CLOSED
        self._drop_leadership()
        self._wake.set()
        self.client.remove_listener(self._on_connection_state)
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(_CLOSE_TIMEOUT)
        candidate, self._candidate = self._candidate, None
        if candidate and self.client.state == KazooState.CONNECTED:
            try:
                self.client.delete_async(candidate).get(timeout=_CLOSE_TIMEOUT)
            except NoNodeError:
                pass
            except Exception as exc:  # noqa: BLE001 - shutdown must finish
                logger.warning("zkbeat: could not delete candidate %s on close: %r", candidate, exc)
        self._notify()

    def candidates(self) -> list[tuple[str, dict[str, Any]]]:
        """Every candidate in election order with its data (ZooKeeper reads)."""
        found = []
        for child in sorted_candidates(self.client.get_children(self.path)):
            try:
                raw, _ = self.client.get(f"{self.path}/{child}")
                info = json.loads(raw.decode() or "{}")
            except NoNodeError:
                continue
            except ValueError:
                logger.warning("zkbeat: unreadable data in candidate %s/%s", self.path, child)
                info = {}
            found.append((child, info if isinstance(info, dict) else {}))
        return found

    # -- kazoo callbacks: state and wake-ups only ---------------------------

    def _on_connection_state(self, state: str) -> None:
        self._connection_generation += 1
        if state != KazooState.CONNECTED:
            self._drop_leadership()
        self._wake.set()

    def _on_watch(self, event: WatchedEvent) -> None:
        if event.type == EventType.DELETED and event.path == self._candidate:
            self._drop_leadership()
        self._wake.set()

    # -- worker ------------------------------------------------------------

    def _drop_leadership(self) -> None:
        self._leader = False
        self._leader_event.clear()

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
        generation = self._connection_generation
        if client.state != KazooState.CONNECTED:
            self._drop_leadership()
            return
        session_id = client.client_id[0] if client.client_id else None
        if self._candidate and self._candidate_session != session_id:
            # A new session means the old ephemeral candidate is gone.
            self._candidate = None
        if self._step_down_requested:
            self._step_down_requested = False
            if self._candidate:
                logger.info("zkbeat: stepping down; rejoining the election at the back")
                try:
                    client.delete(self._candidate)
                except NoNodeError:
                    pass
                self._candidate = None
        if self._candidate is None:
            self._join(session_id)

        ours = self._candidate.rsplit("/", 1)[1]
        line = sorted_candidates(client.get_children(self.path))
        position = line.index(ours) if ours in line else -1
        # The leader watches its own node, so a step-down from outside is seen
        # at once; a follower watches only its predecessor (one watch each).
        stat = client.exists(self._candidate, watch=self._on_watch if position == 0 else None)
        if position < 0 or stat is None or stat.ephemeralOwner != session_id:
            # Deleted from outside, or not ours (Curator's ownership check).
            logger.info("zkbeat: candidate %s is gone; joining again at the back", self._candidate)
            self._candidate = None
            self._drop_leadership()
            self._wake.set()
            return
        if position == 0:
            if self._announced != self._candidate:
                # Say since when this candidate leads (for status tools) in the
                # election node's own data, which nobody watches: written into
                # the candidate it would fire the successor's watch and wake a
                # follower for nothing. Asynchronous, so the leader does not wait.
                self._announced = self._candidate
                since = datetime.now(timezone.utc).isoformat()
                announcement = {"leader": ours, "leader_since": since}
                client.set_async(self.path, json.dumps(announcement, sort_keys=True).encode())
            self._leader_generation = generation
            self._leader = True
            self._leader_event.set()
            return
        self._drop_leadership()
        predecessor = f"{self.path}/{line[position - 1]}"
        if client.exists(predecessor, watch=self._on_watch) is None:
            self._wake.set()  # it went between the two reads: look again

    def _join(self, session_id: int | None) -> None:
        """Adopt our candidate from a lost create() reply, or create one.

        The guid in the name (Curator's "protected" mode) finds a node whose
        create succeeded on the server while the reply was lost; without it
        that orphan would sort first and stall the election for a session.
        """
        client = self.client
        client.ensure_path(self.path)
        mine = []
        for child in sorted_candidates(client.get_children(self.path)):
            if self._guid in child:
                stat = client.exists(f"{self.path}/{child}")
                if stat is not None and stat.ephemeralOwner == session_id:
                    mine.append(child)
        if mine:
            for extra in mine[1:]:
                client.delete(f"{self.path}/{extra}")
            self._candidate = f"{self.path}/{mine[0]}"
        else:
            self._candidate = client.create(
                f"{self.path}/{_PREFIX}{self._guid}-", self._data, ephemeral=True, sequence=True
            )
        self._candidate_session = session_id
        logger.debug("zkbeat: candidate %s", self._candidate)

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

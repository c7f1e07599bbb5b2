"""Handing leadership on when the leader cannot reach the broker and another replica can.

A leader cut off from the broker but not from ZooKeeper (one node's DNS,
route or network policy gone wrong) keeps its candidate, so the election
alone would keep the schedule hostage until the link heals. Only the
replicas can tell that from a broker outage, where nobody does better. So
the leader asks, down the line, one replica at a time, and decides itself:

* A leader that has not reached the broker for ``zkbeat_broker_handover_timeout``
  seconds (counted from the start of the send or connection that failed)
  writes a question into its own candidate's data (``broker_unreachable``:
  since when, who, which epoch, when asked). Its successor already holds a
  watch on that znode (the election's watch on its predecessor), so exactly
  one replica wakes: no new watch on followers, no herd.
* That successor probes the broker on a connection of its own. If it gets
  through, it answers: an ephemeral znode ``<root>/v1/handover/<its
  candidate>`` naming the chain of candidates ahead of it, with their data
  versions. If not, it copies the question, with that chain, into its own
  candidate's data, which wakes the replica behind it, and so on.
* The leader, which watches ``<root>/v1/handover`` only while it asks, probes
  the broker once more itself when an answer comes. Still cut off, it
  deletes in one transaction its own candidate, the candidates between it
  and the answering replica (each at the version that carries the
  question) and the answer: the answering replica leads next, the others
  queue again behind it. If the leader got through this time (the outage
  ended for everyone), it stays.

The leader decides after a probe of its own that began after the answer, so
the end of a broker outage, when every replica gets through again at once,
never moves leadership.

==============================================  ===========================================
what a replica sees                              what it does
==============================================  ===========================================
leading, broker unreachable for less than        nothing yet (a slow reply or a broker
the timeout                                      restart is no reason to move)
leading, broker unreachable for the timeout      writes the question into its candidate
                                                 (WARNING, once per outage); asks again every
                                                 timeout while cut off
leading, broker reachable again (a send, a       removes the question and any answers (INFO)
connection or its own probe got through)
leading, an answer came                          probes the broker: still cut off, hands over
                                                 in one transaction (WARNING, counted in
                                                 zkbeat_broker_handovers_total); else stays
following, the predecessor's data carries a      probes the broker once per version of that
question it has not answered                     data (a connection of its own, at most 3 s)
that probe gets through                          answers (a znode under handover/)
that probe fails                                 passes the question on in its own data (INFO,
                                                 once per outage)
following, the question is gone                  removes what it passed on and its answer
following, the candidate that passed the         tells ``on_passed_over`` (a handover deleted it
question on is gone                              with the leader's: it queues again, cut off)
==============================================  ===========================================

In a real broker outage every probe fails: the question travels down the
line once per timeout, each follower writes its own candidate once per
round, nobody answers and nothing is deleted: leadership stays put, with no
rotation. Idle followers do nothing at all (no periodic ZooKeeper write or
read, no probe) until their predecessor's data changes. Safety never rests
on this module: a deleted candidate only fences its owner's next claim.

A replica of an older release in line neither probes nor passes the
question on: the question stops there. A child of ``handover/`` zkbeat may
not read (NoAuth) or cannot parse is a stranger's: logged once and left
out, so it stops neither a handover nor the cleanup. A ``handover/`` it may
not use at all (someone else made it first, for themselves) is said once at
ERROR; nobody can answer there, so leadership stays put, as in an outage.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any

from kazoo.client import KazooClient
from kazoo.exceptions import KazooException, NoAuthError, NodeExistsError, NoNodeError, ZookeeperError
from kazoo.protocol.states import WatchedEvent

from .._decode import json_object
from .candidates import CandidateNode, parse_name
from .election import Fence, LeaderElection

__all__ = ["BrokerHandover", "DATA_KEY"]

logger = logging.getLogger(__name__)

#: Key of the question (the leader's, or a follower's copy) in a candidate's data: an extra key, layout v1 as before.
DATA_KEY = "broker_unreachable"
#: Seconds before a ZooKeeper step this module failed to make is tried again.
_RETRY_DELAY = 1.0
#: Seconds to wait for one pipelined read of an answer.
_READ_TIMEOUT = 10.0
#: Longest chain a question may carry: far more than any line of replicas.
_MAX_CHAIN = 100

Probe = Callable[[], "Exception | None"]
Chain = tuple[tuple[str, int], ...]


@dataclass(frozen=True)
class _Question:
    """A leader's question, or a follower's copy of it with the chain of candidates ahead."""

    since: str
    identity: str
    epoch: int | None
    #: When the leader asked: each ask changes the data, so the successor's watch brings it news.
    asked: str = ""
    chain: Chain = field(default=())

    def as_data(self) -> dict[str, Any]:
        data: dict[str, Any] = {"since": self.since, "identity": self.identity, "epoch": self.epoch}
        data["asked"] = self.asked
        if self.chain:
            data["chain"] = [[path, version] for path, version in self.chain]
        return {DATA_KEY: data}


@dataclass
class _Asked:
    """The question this leader wrote: on which candidate, and when (monotonic)."""

    candidate: str
    at: float


class BrokerHandover:
    """One replica's part, on a thread of its own; see the module docstring.

    The beat loop tells it after each leader pass whether and since when the
    broker has been unreachable (:meth:`leading`); the election tells it the
    predecessor, data included (:meth:`follow`, a predecessor listener).
    Both only set state and wake the thread: every probe and ZooKeeper call
    is made on it. ``probe()`` returns None when the broker answers, else
    the error; ``answers`` is the znode under which followers answer.
    ``on_handed_over`` is called (on this thread) when this leader handed
    its leadership over; ``on_passed_over`` when this follower's candidate
    that passed a question on (its own probe failed) is gone: a handover
    deletes the candidates between the leader and the replica that
    answered, and that one queues again as cut off as the leader was.
    """

    def __init__(
        self,
        client: KazooClient,
        election: LeaderElection,
        answers: str,
        probe: Probe,
        timeout: float,
        identity: str,
        *,
        on_handed_over: Callable[[], None] | None = None,
        on_passed_over: Callable[[], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.client = client
        self.election = election
        self.answers = answers.rstrip("/")
        self.timeout = timeout
        self.identity = identity
        self._probe = probe
        self._on_handed_over = on_handed_over
        self._on_passed_over = on_passed_over
        self._clock = clock
        self._wake = threading.Event()
        self._closed = False
        self._retry_at = 0.0
        # The leader's part. Set by leading() (beat's thread): the fence led under, and since when the broker fails.
        self._fence: Fence | None = None
        self._down_since: float | None = None
        #: A down_since the leader's own probe found over (not asked about again).
        self._got_through: float | None = None
        #: The fence this replica handed over under (nothing more is asked under it).
        self._handed: Fence | None = None
        self._asked: _Asked | None = None
        #: Set by the watch on ``answers`` (kazoo's thread).
        self._answers_changed = False
        # A follower's part. Set by follow() (the election's thread).
        self._predecessor: CandidateNode | None = None
        #: (predecessor path, data version) last probed for, so each question is probed once.
        self._probed: tuple[str, int] | None = None
        #: Our candidate whose data carries a question we passed on.
        self._passed_on: str | None = None
        #: Our answer znode, if we made one.
        self._answer: str | None = None
        #: Outages (who, since) already logged by this follower.
        self._logged: set[tuple[str, str]] = set()
        #: Children of ``answers`` zkbeat cannot read, already logged.
        self._ignored: set[str] = set()
        #: ``answers`` itself may not be listed or written (logged once).
        self._answers_denied = False
        self._thread = threading.Thread(target=self._run, name="zkbeat-broker-handover", daemon=True)

    def start(self) -> BrokerHandover:
        self._thread.start()
        return self

    def leading(self, fence: Fence | None, down_since: float | None) -> None:
        """After a leader pass: the fence led under (None: not leading) and since when the broker fails (monotonic).

        Any thread; never blocks.
        """
        if (fence, down_since) == (self._fence, self._down_since):
            return
        self._fence, self._down_since = fence, down_since
        self._wake.set()

    def follow(self, candidate: CandidateNode | None) -> None:
        """The predecessor, data included, as the election last read it (its listener: never blocks)."""
        self._predecessor = candidate
        self._wake.set()

    def close(self) -> None:
        self._closed = True
        self._wake.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(2.0)

    # -- the thread ----------------------------------------------------------

    def _run(self) -> None:
        while not self._closed:
            self._wake.wait(self._next_step_in())
            self._wake.clear()
            if self._closed:
                return
            if self._clock() < self._retry_at:
                continue
            try:
                # What this replica passed on as a follower goes before it asks as a leader.
                self._follow()
                self._lead()
            except (KazooException, ZookeeperError) as exc:
                logger.debug("zkbeat: broker handover: ZooKeeper error %r; trying again", exc)
                self._failed()
            except Exception:  # noqa: BLE001 - an optimisation: never die of it
                logger.exception("zkbeat: broker handover failed; trying again")
                self._failed()

    def _failed(self) -> None:
        self._probed = None
        self._answers_changed = True
        self._retry_at = self._clock() + _RETRY_DELAY

    def _next_step_in(self) -> float | None:
        """Seconds until the next ask is due or a failed step is retried (None: wait to be woken)."""
        now = self._clock()
        moments = [self._retry_at] if self._retry_at > now else []
        due = self._ask_due()
        if due is not None:
            moments.append(due)
        return max(0.0, min(moments) - now) if moments else None

    def _cut_off_since(self) -> float | None:
        down, fence = self._down_since, self._fence
        if fence is None or fence == self._handed or down is None or down == self._got_through:
            return None
        return down

    def _ask_due(self) -> float | None:
        down = self._cut_off_since()
        if down is None:
            return None
        asked = self._asked
        if asked is not None and self._fence is not None and asked.candidate == self._fence.candidate:
            return max(asked.at, down) + self.timeout
        return down + self.timeout

    # -- the leader's part ---------------------------------------------------

    def _lead(self) -> None:
        fence, down, asked = self._fence, self._cut_off_since(), self._asked
        if asked is not None and (fence is None or down is None or asked.candidate != fence.candidate):
            self._stop_asking(asked, reached=fence is not None and fence != self._handed and down is None)
            asked = None
        if fence is None or down is None:
            return
        if asked is not None and self._answers_changed:
            self._answers_changed = False
            answer = self._first_answer(fence.candidate)
            if answer is not None:
                self._decide(fence, down, *answer)
                return
        due = self._ask_due()
        if due is not None and self._clock() >= due:
            self._ask(fence, down, first=asked is None)

    def _ask(self, fence: Fence, down: float, first: bool) -> None:
        now = self._clock()
        wall = datetime.now(timezone.utc)
        since = (wall - timedelta(seconds=now - down)).isoformat(timespec="seconds")
        question = _Question(since, self.identity, fence.epoch, wall.isoformat(timespec="milliseconds"))
        self.client.ensure_path(self.answers)
        self._answers_changed = True  # read them (and watch them) on the next step
        if not self.election.annotate(question.as_data(), candidate=fence.candidate):
            self._handed = fence  # not our candidate any more: leadership is ending anyway
            return
        self._asked = _Asked(fence.candidate, now)
        if first:
            logger.warning(
                "zkbeat: the broker has been unreachable for %.0f s; asking the next replica in line that reaches "
                "it to take over (%s, epoch %s)",
                now - down,
                self.identity,
                fence.epoch,
            )
        self._wake.set()

    def _first_answer(self, candidate: str) -> tuple[str, str, Chain] | None:
        """(path, identity, chain) of the answer to ``candidate``'s question from the earliest replica in line.

        Watches the answers for more.
        """
        try:
            children = self.client.get_children(self.answers, watch=self._on_answers)
        except NoNodeError:
            return None
        except NoAuthError:
            self._denied()
            return None
        found = []
        for child, data in self._read_answers(children):
            parsed = parse_name(child)
            chain = _chain(data.get("chain"), self.election.path)
            identity = data.get("identity") if isinstance(data.get("identity"), str) else f"candidate {child}"
            if parsed is not None and chain and chain[0][0] == candidate:
                found.append((parsed[1], f"{self.answers}/{child}", identity, chain))
        if not found:
            return None
        _, path, identity, chain = min(found)
        return path, identity, chain

    def _read_answers(self, children: list[str]) -> list[tuple[str, dict[str, Any]]]:
        """(name, data) of each answer zkbeat can read, with pipelined gets.

        A child it may not read (NoAuth: a stranger's ACL, or a replica whose
        ``zkbeat_auth`` differs) or whose data is not a JSON object is no
        answer zkbeat wrote: logged once, and left out, so that one stranger's
        znode never stops the handover (nor the cleanup) for everyone.
        """
        reads = [(child, self.client.get_async(f"{self.answers}/{child}")) for child in children]
        found = []
        for child, read in reads:
            path = f"{self.answers}/{child}"
            try:
                raw, _ = read.get(timeout=_READ_TIMEOUT)
            except NoNodeError:
                continue
            except NoAuthError:
                self._ignore(path, "zkbeat may not read it (NoAuth: its ACL does not grant this replica's credentials)")
                continue
            try:
                data = json_object(raw, empty_ok=True)
            except ValueError as exc:
                self._ignore(path, f"it holds data zkbeat cannot read ({exc})")
                continue
            found.append((child, data))
        self._ignored &= {f"{self.answers}/{child}" for child in children}
        return found

    def _denied(self) -> None:
        """``answers`` itself is someone else's (NoAuth): no answer can be made or heard; said once."""
        if self._answers_denied:
            return
        self._answers_denied = True
        logger.error(
            "zkbeat: may not use %s (NoAuth: its ACL does not grant this replica's credentials): no replica can "
            "answer a leader cut off from the broker there, so leadership stays put; delete it, or grant the "
            "identity of zkbeat_auth on it",
            self.answers,
        )

    def _ignore(self, path: str, why: str) -> None:
        if path not in self._ignored:
            self._ignored.add(path)
            logger.warning("zkbeat: ignoring %s among the broker handover's answers: %s", path, why)

    def _on_answers(self, event: WatchedEvent) -> None:
        # kazoo's thread: state and a wake-up only.
        self._answers_changed = True
        self._wake.set()

    def _decide(self, fence: Fence, down: float, answer: str, heir: str, chain: Chain) -> None:
        """A replica reaches the broker: hand over unless this leader's own probe, begun now, gets through too."""
        error = self._probe()
        if error is None:
            logger.info(
                "zkbeat: a replica reaches the broker, and this leader does again: staying (%s, epoch %s)",
                self.identity,
                fence.epoch,
            )
            self._got_through = down
            self._wake.set()
            return
        if self._fence != fence:
            return  # leadership ended while we probed
        cut_off = self._clock() - down
        transaction = self.client.transaction()
        # Why it left, for the successor's takeover line: in the same transaction, so it lands with the delete.
        self.election.note_departure(
            transaction,
            fence,
            f"broker unreachable for {cut_off:.0f} s ({type(error).__name__}): handed leadership to {heir}, "
            "which reaches it",
            failed=True,
        )
        transaction.delete(fence.candidate)
        for path, version in chain[1:]:
            transaction.delete(path, version=version)
        transaction.delete(answer)
        results = transaction.commit()
        if any(isinstance(result, Exception) for result in results):
            logger.info("zkbeat: did not hand leadership over: the line changed meanwhile (%s)",
                        ", ".join(type(r).__name__ for r in results if isinstance(r, Exception)))  # fmt: skip
            return
        self._asked = None
        self._handed = fence
        logger.warning(
            "zkbeat: handing leadership to %s, which reaches the broker; this leader has not reached it for %.0f s "
            "(%r)%s (%s, epoch %s)",
            heir,
            cut_off,
            error,
            f"; the {len(chain) - 1} replica(s) between, which do not either, queue again" if len(chain) > 1 else "",
            self.identity,
            fence.epoch,
        )
        if self._on_handed_over is not None:
            self._on_handed_over()

    def _stop_asking(self, asked: _Asked, reached: bool) -> None:
        self._asked = None
        self.election.annotate(None, candidate=asked.candidate)
        self._delete_answers(asked.candidate)
        if reached:
            logger.info("zkbeat: the broker is reachable again; no longer asking the others to take over (%s)",
                        self.identity)  # fmt: skip

    def _delete_answers(self, candidate: str) -> None:
        try:
            children = self.client.get_children(self.answers)
        except (NoNodeError, NoAuthError):
            return
        for child, data in self._read_answers(children):
            chain = _chain(data.get("chain"), self.election.path)
            if chain and chain[0][0] == candidate:
                try:
                    self.client.delete(f"{self.answers}/{child}")
                except NoNodeError:
                    continue

    # -- a follower's part ---------------------------------------------------

    def _follow(self) -> None:
        predecessor = self._predecessor
        mine = self.election.candidate
        if self._passed_on is not None and self._passed_on != mine:
            self._passed_on = None  # that candidate is gone, and its data with it
            self._passed_over()
        question, version = self._question_of(predecessor)
        if question is None or predecessor is None or version is None:
            self._withdraw(mine)
            return
        if self._probed == (predecessor.path, version):
            return
        self._probed = (predecessor.path, version)
        chain = (*question.chain, (predecessor.path, version))
        error = self._probe()
        if self._closed or self._predecessor is None or self._predecessor.path != predecessor.path:
            return  # the line moved while we probed: the new predecessor is looked at next
        if mine is None or mine != self.election.candidate:
            return
        if error is None:
            self._reply(question, chain, mine)
        else:
            self._pass_on(question, chain, mine, error)

    def _question_of(self, predecessor: CandidateNode | None) -> tuple[_Question | None, int | None]:
        """The question in the predecessor's data as ZooKeeper has it now, and that data's version."""
        if predecessor is None or _parse(predecessor.data, self.election.path) is None:
            return None, None
        try:
            raw, stat = self.client.get(predecessor.path)
        except NoNodeError:
            return None, None
        data = _json(raw)
        question = _parse(data, self.election.path) if data is not None else None
        return question, stat.version

    def _reply(self, question: _Question, chain: Chain, mine: str) -> None:
        """We reach the broker: stop passing the question on, and answer it."""
        if self._passed_on == mine:
            self._passed_on = None
            self.election.annotate(None, candidate=mine)
        path = f"{self.answers}/{mine.rsplit('/', 1)[1]}"
        data = json.dumps({"identity": self.identity, "chain": [[p, v] for p, v in chain]}).encode()
        # Made anew each time, so the leader's watch on the children hears of every answer.
        try:
            try:
                self.client.create(path, data, ephemeral=True, makepath=True)
            except NodeExistsError:
                self.client.delete(path)
                self.client.create(path, data, ephemeral=True, makepath=True)
        except NoAuthError:
            self._denied()
            return
        self._answer = path
        self._log_once(question, "and this replica does: it answered")

    def _pass_on(self, question: _Question, chain: Chain, mine: str, error: Exception) -> None:
        self._delete_answer()
        passed = _Question(question.since, question.identity, question.epoch, question.asked, chain)
        if self.election.annotate(passed.as_data(), candidate=mine):
            self._passed_on = mine
        self._log_once(question, f"and neither does this replica ({error!r}); asking the next in line")

    def _log_once(self, question: _Question, what: str) -> None:
        outage = (question.identity, question.since)
        if outage in self._logged:
            return
        self._logged.add(outage)
        logger.info("zkbeat: %s has not reached the broker since %s, %s", question.identity, question.since, what)

    def _withdraw(self, mine: str | None) -> None:
        """The question is gone (the leader reached the broker, or the line moved): remove what we added."""
        self._delete_answer()
        if self._passed_on is None or self._passed_on != mine:
            return
        passed, self._passed_on = self._passed_on, None
        if not self.election.annotate(None, candidate=passed):
            self._passed_over()  # gone with the question: a handover deleted it with the leader's candidate

    def _passed_over(self) -> None:
        """Our candidate that passed a question on (our probe failed) is gone: we queue again, cut off."""
        if self._on_passed_over is not None and not self._closed:
            self._on_passed_over()

    def _delete_answer(self) -> None:
        if self._answer is None:
            return
        try:
            self.client.delete(self._answer)
        except NoNodeError:
            pass
        self._answer = None


def _json(raw: bytes | None) -> dict[str, Any] | None:
    try:
        return json_object(raw, empty_ok=True)
    except ValueError:
        return None


def _chain(raw: Any, election_path: str) -> Chain | None:
    """A chain of (candidate path, version) of this election, or None if it is not one zkbeat would write."""
    if not isinstance(raw, list) or len(raw) > _MAX_CHAIN:
        return None
    links = []
    for item in raw:
        if not isinstance(item, list) or len(item) != 2:
            return None
        path, version = item
        if not isinstance(path, str) or isinstance(version, bool) or not isinstance(version, int) or version < 0:
            return None
        parent, _, name = path.rpartition("/")
        if parent != election_path or parse_name(name) is None:
            return None  # only candidates of this election can be in a chain
        links.append((path, version))
    if len({path for path, _ in links}) != len(links):
        return None
    return tuple(links)


def _parse(data: dict[str, Any], election_path: str) -> _Question | None:
    """The question in a candidate's data, or None (none there, or not one zkbeat would write)."""
    raw = data.get(DATA_KEY)
    if not isinstance(raw, dict):
        return None
    since, identity, epoch, asked = raw.get("since"), raw.get("identity"), raw.get("epoch"), raw.get("asked", "")
    if not all(isinstance(text, str) for text in (since, identity, asked)):
        return None
    if epoch is not None and (isinstance(epoch, bool) or not isinstance(epoch, int)):
        return None
    chain = _chain(raw.get("chain", []), election_path)
    if chain is None:
        return None
    return _Question(since, identity, epoch, asked, chain)

"""The broker handover's question down the line, in-process: real elections on a real ZooKeeper, probes given.

Each replica is a LeaderElection with its BrokerHandover; whether a replica
reaches the broker is what its probe returns, so these tests show who
takes over, who passes the question on and what is left behind, without a
broker. tests/test_broker_partition.py does the same with real beat
processes and a real broker behind a proxy.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterator

import pytest
from kazoo.client import KazooClient
from kazoo.security import make_digest_acl

from tests.support.helpers import wait_for
from tests.support.servers import ZooKeeperServer
from tests.support.undecodable import UNDECODABLE, plant
from tests.test_election import Pool
from zkbeat.conf import DEFAULT_BROKER_HANDOVER_TIMEOUT, read_settings
from zkbeat.coordination.broker_handover import DATA_KEY, BrokerHandover
from zkbeat.coordination.election import LeaderElection
from zkbeat.exceptions import ConfigurationError

TIMEOUT = 0.5


class Replica:
    """An election, its broker handover, and whether it reaches the broker (what its probe says)."""

    def __init__(self, pool: Pool, name: str, reaches: bool) -> None:
        self.name = name
        self.reaches = reaches
        self.probes = 0
        self.election: LeaderElection = pool.election(start=False)
        self.annotations = 0
        annotate = self.election.annotate

        def counted(*args, **kwargs) -> bool:
            self.annotations += 1
            return annotate(*args, **kwargs)

        self.election.annotate = counted  # type: ignore[method-assign]
        answers = pool.path.rsplit("/", 1)[0] + "/handover"
        self.handover = BrokerHandover(
            self.election.client, self.election, answers, self.probe, TIMEOUT, name, on_handed_over=self.handed_over
        ).start()
        self.handed = 0
        self.election.add_predecessor_listener(self.handover.follow)
        self.election.start()
        wait_for(lambda: self.election.candidate is not None)

    def probe(self) -> Exception | None:
        self.probes += 1
        return None if self.reaches else ConnectionRefusedError("no route to the broker")

    def handed_over(self) -> None:
        self.handed += 1

    def cut_off(self) -> None:
        """As the beat loop reports it: leading, and the broker unreachable for longer than the timeout."""
        self.handover.leading(self.election.leadership, time.monotonic() - 2 * TIMEOUT)

    def reached(self) -> None:
        self.handover.leading(self.election.leadership, None)

    def close(self) -> None:
        self.handover.close()


@pytest.fixture
def line(zk_server: ZooKeeperServer, zk_root: str) -> Iterator[Callable[..., list[Replica]]]:
    pool = Pool(zk_server.hosts, f"{zk_root}/v1/election")
    made: list[Replica] = []

    def make(*reaches: bool) -> list[Replica]:
        for i, flag in enumerate(reaches):
            made.append(Replica(pool, f"r{i}", flag))
            if i == 0:
                wait_for(lambda: made[0].election.is_leader)
        wait_for(lambda: all(r.election.predecessor is not None for r in made[1:]))
        return made

    yield make
    for replica in made:
        replica.close()
    pool.close()


def question(client: KazooClient, path: str | None) -> dict | None:
    raw, _ = client.get(path)
    return json.loads(raw).get(DATA_KEY)


def test_the_next_replica_that_reaches_the_broker_takes_over(line, zk_client: KazooClient) -> None:
    """The leader is cut off, its successor reaches the broker and answers: the leader, still cut off, hands over."""
    leader, heir, last = line(False, True, True)
    old = leader.election.candidate
    leader.cut_off()
    wait_for(lambda: heir.election.is_leader, timeout=15)
    wait_for(lambda: leader.handed, timeout=15)  # said after the transaction commits: the heir may lead first
    assert leader.handed == 1 and heir.probes >= 1 and last.probes == 0, "one replica was asked, and it answered"
    wait_for(lambda: leader.election.candidate not in (None, old))
    names = [name for name, _ in heir.election.candidates()]
    assert names[-1] == leader.election.candidate.rsplit("/", 1)[1], "the cut leader queues again at the back"
    assert question(zk_client, heir.election.candidate) is None
    # Its beat loop has not said yet that it stopped leading (here: never): it asks nothing more meanwhile.
    done = leader.annotations
    assert not wait_for(lambda: leader.annotations > done, timeout=4 * TIMEOUT, raise_on_timeout=False)


def test_the_leader_that_hands_over_leaves_why_for_its_successor(line) -> None:
    """The departure note goes in the handover's transaction: the successor reads "broker unreachable", as a failure."""
    leader, heir = line(False, True)
    leader.cut_off()
    wait_for(lambda: heir.election.is_leader, timeout=15)
    handover = heir.election.handover(heir.election.leadership)
    assert handover is not None and handover.identity == "e0", handover
    assert handover.departure is not None, "no departure note: the successor would call it a crash"
    assert "broker unreachable" in handover.departure.why and handover.departure.failed, handover.departure
    assert "r1" in handover.departure.why, "it names the replica it handed over to"


def test_unreadable_and_malformed_answers_are_left_out(line, zk_client: KazooClient, caplog) -> None:
    """Strangers' children of handover/ (one denying READ, some malformed) are logged and skipped: the replica
    that reaches the broker still takes over, and the leader, reached again later, still cleans up."""
    leader, heir = line(False, True)
    answers = leader.handover.answers
    zk_client.ensure_path(answers)
    fake = "candidate-" + "0" * 32 + "-0000000000"
    zk_client.create(f"{answers}/{fake}", b"{}", acl=[make_digest_acl("someone-else", "secret", all=True)])
    zk_client.create(f"{answers}/not-json", b"\xff{")
    zk_client.create(f"{answers}/{fake[:-1]}1", b'{"chain": "not a list", "identity": 7}')
    zk_client.create(f"{answers}/a-list", b"[1, 2]")
    for name, data in UNDECODABLE.items():  # no data, nested past the recursion limit, a number, null, ...
        plant(zk_client, f"{answers}/undecodable-{name}", data)
    with caplog.at_level(logging.WARNING, logger="zkbeat"):
        leader.cut_off()
        wait_for(lambda: heir.election.is_leader, timeout=15, message=lambda: caplog.text)
        wait_for(lambda: leader.handed, timeout=15, message=lambda: caplog.text)  # said after the commit
    assert leader.handed == 1
    assert f"{answers}/{fake}" in caplog.text and "NoAuth" in caplog.text, caplog.text
    # Asking again and being reached again (the other path that reads every answer) survives them too.
    wait_for(lambda: leader.election.candidate is not None)
    heir.cut_off()
    wait_for(lambda: zk_client.get(heir.election.candidate)[0] and question(zk_client, heir.election.candidate),
             timeout=15)  # fmt: skip
    heir.reached()
    wait_for(lambda: question(zk_client, heir.election.candidate) is None, timeout=15, message=lambda: caplog.text)
    assert heir.election.is_leader
    strangers = [fake, "not-json", f"{fake[:-1]}1", "a-list"] + [f"undecodable-{name}" for name in UNDECODABLE]
    assert sorted(zk_client.get_children(answers)) == sorted(strangers)
    assert f"{answers}/undecodable-nested-past-the-recursion-limit" in caplog.text, caplog.text


def test_a_handover_node_zkbeat_may_not_use_is_said_once_and_stops_nothing(line, zk_client, caplog) -> None:
    """handover/ made first by someone else, for themselves alone: nobody can answer, so nobody hands over; each
    replica says so once at ERROR, no step fails over and over, and the leader keeps leading."""
    leader, heir = line(False, True)
    answers = leader.handover.answers
    zk_client.ensure_path(answers.rsplit("/", 1)[0])
    zk_client.create(answers, b"", acl=[make_digest_acl("someone-else", "secret", all=True)])
    with caplog.at_level(logging.DEBUG, logger="zkbeat"):
        leader.cut_off()
        wait_for(lambda: heir.probes >= 1 and caplog.text.count(f"may not use {answers}") >= 2, timeout=15,
                 message=lambda: caplog.text)  # fmt: skip
        wait_for(lambda: leader.annotations >= 3, timeout=15)  # it asked again, a timeout later, and again
    assert leader.election.is_leader and leader.handed == 0
    assert caplog.text.count(f"may not use {answers}") == 2, "once per replica"
    assert "ZooKeeper error" not in caplog.text and "failed" not in caplog.text, caplog.text


def test_a_question_passes_down_the_line_to_one_that_reaches_the_broker(line, zk_client: KazooClient) -> None:
    """Leader and successor cut off: the third answers, the leader deletes both candidates and the third leads."""
    leader, middle, third = line(False, False, True)
    leader.cut_off()
    wait_for(lambda: third.election.is_leader, timeout=15)
    wait_for(lambda: leader.handed, timeout=15)  # said after the transaction commits: the third may lead first
    assert leader.handed == 1 and middle.probes >= 1
    wait_for(lambda: len(third.election.candidates()) == 3)
    assert [data["identity"] for _, data in third.election.candidates()][0] == third.election._info["identity"]
    for replica in (leader, middle):
        wait_for(lambda r=replica: r.election.candidate is not None)
        assert question(zk_client, replica.election.candidate) is None, "a new candidate starts without a question"


def test_in_an_outage_nobody_moves_and_the_questions_go_once_it_ends(line, zk_client: KazooClient) -> None:
    """Nobody reaches the broker: no candidate is deleted, each asks again per timeout; reached, every mark goes."""
    leader, middle, last = line(False, False, False)
    before = [r.election.candidate for r in (leader, middle, last)]
    leader.cut_off()
    wait_for(lambda: last.probes >= 3, timeout=15)  # asked again while cut: each round goes down the line
    assert [r.election.candidate for r in (leader, middle, last)] == before
    assert leader.election.is_leader and leader.handed == 0
    assert question(zk_client, leader.election.candidate)["identity"] == "r0"
    chain = question(zk_client, last.election.candidate)["chain"]
    assert [path for path, _ in chain] == before[:2]
    leader.reached()
    for path in before:
        wait_for(lambda p=path: question(zk_client, p) is None, timeout=10, message=f"question left on {path}")
    assert [r.election.candidate for r in (leader, middle, last)] == before


def test_the_end_of_an_outage_moves_nobody(line, zk_client: KazooClient) -> None:
    """The broker back for all while the leader still counts itself cut off: a follower answers, the leader stays."""
    leader, middle, last = line(False, False, False)
    before = [r.election.candidate for r in (leader, middle, last)]
    leader.cut_off()
    wait_for(lambda: last.probes >= 1, timeout=15)
    for replica in (leader, middle, last):
        replica.reaches = True  # the outage ends; the leader's beat loop has not noticed yet
    wait_for(lambda: question(zk_client, leader.election.candidate) is None, timeout=15)
    assert middle.probes >= 2, "asked again, it answered"
    assert leader.election.is_leader and leader.handed == 0
    assert [r.election.candidate for r in (leader, middle, last)] == before
    for path in before:
        wait_for(lambda p=path: question(zk_client, p) is None, timeout=10, message=f"question left on {path}")
    answers = leader.handover.answers
    wait_for(lambda: not zk_client.exists(answers) or zk_client.get_children(answers) == [], timeout=10)


def test_an_idle_follower_does_nothing(line, zk_client: KazooClient) -> None:
    """Without a question followers never probe nor write: their candidates keep the data they were made with."""
    replicas = line(True, True, True)
    replicas[0].reached()

    def anything_done() -> bool:
        versions = [zk_client.get(r.election.candidate)[1].version for r in replicas]
        return versions != [0, 0, 0] or any(r.probes for r in replicas)

    # Several timeouts' worth: a periodic write or probe would show within one.
    assert not wait_for(anything_done, timeout=4 * TIMEOUT, raise_on_timeout=False)


def test_the_setting_is_validated_by_name() -> None:
    """zkbeat_broker_handover_timeout: seconds, 0 for never; anything else fails naming the setting."""
    assert read_settings({}).broker_handover_timeout == DEFAULT_BROKER_HANDOVER_TIMEOUT
    assert read_settings({"zkbeat_broker_handover_timeout": 0}).broker_handover_timeout == 0
    assert read_settings({"zkbeat_broker_handover_timeout": "7.5"}).broker_handover_timeout == 7.5
    for bad in (-1, "soon", float("nan"), True):
        with pytest.raises(ConfigurationError, match="zkbeat_broker_handover_timeout"):
            read_settings({"zkbeat_broker_handover_timeout": bad})

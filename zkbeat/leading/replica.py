"""A replica's place in every shard's election: joined once at start-up, left at close.

Joining opens the ZooKeeper client and the ledger, the liveness socket,
each shard's election with its liveness watch and broker handover, the
watchdog over the loop, the check of the other replicas' layout and
schedule (zkbeat.coordination.peers) and, with shards, the fair share;
leaving ends every term, settles what is pending and closes them in the
order that hands leadership over at once.

A mixin of the scheduler (``zkbeat.LeaderScheduleMixin``).
"""

from __future__ import annotations

import logging
import os
import socket
import sys
import time
from datetime import datetime, timezone
from typing import Any

import click
from kazoo.protocol.states import KazooState

from .. import __version__
from ..conf import unknown_settings
from ..coordination._zookeeper import make_client
from ..coordination.broker_handover import BrokerHandover
from ..coordination.election import LeaderElection, events
from ..coordination.liveness import Beacon, Watcher, default_host
from ..coordination.peers import LAYOUT, PeerCheck, schedule_hash
from ..coordination.shards import BROKER, REPLICA_KEY, FairShare, election_path, handover_path, unready_path
from ..exceptions import ConfigurationError
from ..ledger.store import Ledger
from .broker import load_transport
from .broker import probe as probe_broker
from .leadership import ZOOKEEPER_ERRORS
from .term import SIGNAL_HOLD_LIMIT
from .wakeup import Wakeup
from .watchdog import Watchdog

__all__ = ["Replica"]

logger = logging.getLogger("zkbeat.scheduler")


class BadSettingExit(ConfigurationError, click.ClickException):
    """A bad setting, raised inside the ``celery beat`` command: click prints one line and exits 1.

    Still a :class:`~zkbeat.exceptions.ConfigurationError` for whoever catches
    that; outside a click command the plain error is raised instead.
    """

    exit_code = 1

    def __init__(self, error: ConfigurationError) -> None:
        ConfigurationError.__init__(self, error.setting, error.value, error.reason)
        self.message = str(error)

    def __str__(self) -> str:
        return self.message

    def show(self, file: Any = None) -> None:
        click.echo(f"zkbeat: {self.message}", file=file, err=True)

    @classmethod
    def under_click(cls, error: ConfigurationError) -> ConfigurationError:
        """``error`` as one line and exit status 1 inside ``celery beat`` (a click command, not its traceback);
        elsewhere ``error`` itself."""
        return error if click.get_current_context(silent=True) is None else cls(error)

    @classmethod
    def exit_under_click(cls, error: ConfigurationError) -> None:
        """Inside ``celery beat``, end the process on ``error``'s one line, status 1; elsewhere return.

        For a setting only joining can judge: Celery builds the scheduler for
        its loop inside an ``except Exception`` that logs a traceback first,
        so the exit is a SystemExit, which it lets through.
        """
        if click.get_current_context(silent=True) is not None:
            bad = cls(error)
            bad.show(sys.__stderr__)  # by now Celery sends sys.stderr to its log
            raise SystemExit(bad.exit_code)


class Replica:
    """Join every shard's election, and leave them: see the module docstring."""

    #: Monotonic time close() began to leave (under its hold of shutdown signals), None before.
    _leaving_since: float | None = None

    def _warn_unknown_settings(self) -> None:
        """Name each ``zkbeat_*`` key zkbeat does not read, with the closest one it does: a typo is never silent."""
        try:
            unknown = unknown_settings(self.app.conf)
        except Exception:  # noqa: BLE001 - a configuration that cannot be listed: nothing to say
            logger.debug("zkbeat: could not list the app's settings", exc_info=True)
            return
        for key, suggestion in unknown:
            logger.warning(
                "zkbeat: ignoring the setting %s: zkbeat has no such setting%s",
                key,
                f"; did you mean {suggestion}?" if suggestion else " (docs/settings.md lists them)",
            )

    def _connect(self) -> None:
        settings = self.zk_settings
        if events.level == logging.NOTSET:
            # Who leads after whom, who follows, pauses and resumes: one line
            # each, shown at beat's default level (WARNING) too unless the
            # logger "zkbeat.events" is configured otherwise.
            events.setLevel(logging.INFO)
        self._warn_unknown_settings()
        try:
            # Before joining: a replica that cannot serve its /healthz must not lead with none to probe.
            self.metrics.serve()
        except ConfigurationError as exc:
            BadSettingExit.exit_under_click(exc)
            raise
        self.zk_client = make_client(settings, self.Client, report_unreachable=True)
        self.zk_client.add_listener(self._on_connection_state)
        self.ledger = Ledger(self.zk_client, settings.root, timeout=settings.session_timeout)
        self.beacon = self._open_beacon()
        data = {
            "identity": settings.identity,
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "started_at": datetime.now(timezone.utc).isoformat(),
            "version": __version__,
            # For rolling upgrades: a newer release sees our layout, and
            # the leader (and `zkbeat status`) sees whose schedule differs.
            "layout": LAYOUT,
            "schedule_hash": self._schedule_hash(),
            **(self.beacon.announcement.as_data() if self.beacon is not None else {}),
            # With shards, the fair share tells the replicas apart by this id (zkbeat.coordination.shards).
            **({REPLICA_KEY: self._replica} if self.sharded else {}),
        }
        for shard in self._shards:
            with self.shard_current(shard):
                self._join_shard(data)
        elections = [shard.election for shard in self._shards]
        self.watchdog = Watchdog(
            settings.stall_timeout,
            step_down=lambda: [
                election.step_down(hold=True, reason="its beat loop stalled past zkbeat_stall_timeout", failed=True)
                for election in elections
            ],
            resume=lambda: [election.resume() for election in elections],
            describe=lambda: f" ({settings.identity}, {self._describe_terms()})",
        ).start()
        self.peers = PeerCheck(
            self.zk_client, settings.root, elections[0].path, self._schedule_hash(), timeout=settings.session_timeout
        )
        if self.sharded:
            self._fair_share = FairShare(
                self.zk_client,
                [e.path for e in elections],
                self._replica,
                timeout=settings.session_timeout,
                on_change=self._wake.set,  # a sleeping replica wakes when the lines change (its share may move)
                unready=unready_path(settings.root),
                about={key: data[key] for key in ("identity", "host", "pid")},  # its mark names it out of line too
            )
        logger.info("zkbeat: joining the election at %s%s as %s", settings.hosts, settings.root, settings.identity)
        # start_async: an unreachable ZooKeeper is retried in the background;
        # until it answers this replica is simply a follower.
        self.zk_client.start_async()
        for election in elections:
            election.start()
        # While ZooKeeper answers: the first pass that leads publishes without importing it.
        load_transport(self.app)

    def _join_shard(self, data: dict[str, Any]) -> None:
        """The current shard's election, its liveness watch and its broker handover (not started yet)."""
        settings = self.zk_settings
        shard = self._shard
        self.election = LeaderElection(
            self.zk_client,
            election_path(settings.root, shard.index, shard.count),
            data,
            # Announced after the term's first pass (_leader_pass): `zkbeat
            # health` must not name a head that refuses to lead or never publishes.
            announce=False,
            label=f"shard {shard.index}/{shard.count}, " if shard.count > 1 else "",
        )
        self.election.add_listener(lambda leading: self._wake.set())
        if self.beacon is not None:
            self.watcher = Watcher(self.zk_client, on_gone=lambda candidate, why: self.metrics.deposal()).start()
            self.election.add_predecessor_listener(self.watcher.follow)
        if settings.broker_handover_timeout:
            self.broker_handover = BrokerHandover(
                self.zk_client,
                self.election,
                handover_path(settings.root, shard.index, shard.count),
                self._probe_broker,
                settings.broker_handover_timeout,
                settings.identity,
                on_handed_over=self._handed_over_for_the_broker,
                on_passed_over=self._passed_over_for_the_broker,
            ).start()
            self.election.add_predecessor_listener(self.broker_handover.follow)

    def _open_beacon(self) -> Beacon | None:
        """This replica's liveness socket, or None when it is off or cannot bind (then the session decides)."""
        settings = self.zk_settings
        if not settings.liveness:
            return None
        host, port = settings.liveness_address or (default_host(settings.hosts), 0)
        try:
            beacon = Beacon(host, port).start()
        except OSError as exc:
            logger.warning(
                "zkbeat: cannot listen on %s:%s for liveness (%r); a crash of this replica is seen at its "
                "session timeout instead (set zkbeat_liveness_address)",
                host,
                port,
                exc,
            )
            return None
        logger.info("zkbeat: liveness socket on %s:%s", beacon.host, beacon.port)
        return beacon

    def _handed_over_for_the_broker(self) -> None:
        """A shard's broker handover gave its leadership away (on that handover's thread): counted, and with
        shards this replica marked unready until the broker answers its probe (zkbeat.leading.sharded).

        The mark is written here, at once: written by beat's loop, it could come after a pass that waits
        for the broker in each shard still led here, and the replica that took the shard, now above its
        share, hands one back once the lines stood still for SETTLE_TIME.
        """
        self.metrics.broker_handover()
        self._mark_cut_off("it cannot reach the broker (it handed a shard over for that)")

    def _passed_over_for_the_broker(self) -> None:
        """A shard's candidate of this replica that passed a leader's question on (its probe of the broker
        failed) is gone, on that handover's thread: a broker handover deleted it with the leader's, and it
        queues again as cut off as the leader that marked itself; marked the same way."""
        self._mark_cut_off("it cannot reach the broker (its probe failed when a leader asked)")

    def _mark_cut_off(self, why: str) -> None:
        """With shards, mark this replica unready for the broker and write the mark now (see above)."""
        fair_share = self._fair_share
        if fair_share is None:
            return
        fair_share.mark_unready(why, BROKER)
        try:
            fair_share.keep_mark()
        except ZOOKEEPER_ERRORS as exc:  # beat's loop writes it at its next pass
            logger.debug("zkbeat: could not write this replica's unready mark: %r", exc)

    def _probe_broker(self) -> Exception | None:
        """Whether this replica reaches the broker now, on a connection of its own (broker_handover)."""
        return probe_broker(self.app)

    def _on_connection_state(self, state: str) -> None:
        """kazoo's listener: record and log only (it runs on kazoo's thread)."""
        self.metrics.connection(state)
        if self._closed:
            return  # our own close() ends the session: nothing to warn about
        term = self.term
        identity, epoch = self.zk_settings.identity, term.epoch if term is not None else None
        if state == KazooState.SUSPENDED:
            logger.warning("zkbeat: connection to ZooKeeper suspended; not publishing (%s, epoch %s)", identity, epoch)
        elif state == KazooState.LOST:
            logger.warning("zkbeat: ZooKeeper session lost; rejoining the election (%s, epoch %s)", identity, epoch)
        elif term is not None:
            logger.info("zkbeat: reconnected to ZooKeeper (%s)", identity)

    def _leave(self) -> None:
        """close(): the host's own record while still leading, the handover, then a write the host deferred.

        Its ``sync_at_close`` either writes at once or returns the write
        (zkbeat.contrib.django): nothing the host writes delays the
        successor then. Neither error stops the shutdown: the ledger holds the runs.
        """
        self._leaving_since = time.monotonic()
        late = None
        if self.leading or (self.sharded and any(shard.term is not None for shard in self._shards)):
            try:
                # Still leading (with shards, some shard: the host writes only those it leads): its own record.
                late = self.sync_at_close()
            except Exception:  # noqa: BLE001 - the ledger holds the runs; shutdown must finish
                logger.warning("zkbeat: could not sync the schedule at shutdown", exc_info=True)
        self._closed = True
        self._shut_down()
        if late is not None:
            try:
                late()
            except Exception:  # noqa: BLE001 - as above; the successor leads already
                logger.warning("zkbeat: could not sync the schedule after handing over", exc_info=True)

    def shutdown_hold_left(self) -> float | None:
        """Seconds left of close()'s hold of shutdown signals (SIGNAL_HOLD_LIMIT), None before close().

        A write the host deferred past the handover bounds itself by it: past
        the hold a second signal cuts it anyway, and without one nothing would.
        """
        if self._leaving_since is None:
            return None
        return SIGNAL_HOLD_LIMIT - (time.monotonic() - self._leaving_since)

    def _shut_down(self) -> None:
        for shard in self._shards:
            with self.shard_current(shard):
                if self.term is not None:
                    self._end_term("shutting down")
                self._release_pending(final=True)
        if self.watchdog is not None:
            self.watchdog.close()
        for shard in self._shards:
            if shard.election is not None:
                shard.election.close(self._stop_reason)
        for shard in self._shards:
            if shard.watcher is not None:
                # After the candidates are gone: a watch dialing a predecessor that does not answer is waited
                # for (up to DIAL_TIMEOUT each), and the shards this replica led must not wait with it.
                shard.watcher.close()
        for shard in self._shards:
            if shard.broker_handover is not None:
                # After the candidate is gone: a probe in flight must not delay the handover.
                shard.broker_handover.close()
        if self.beacon is not None:
            self.beacon.close()  # after the candidate is gone: nobody needs to delete it
        self.metrics.close()
        if self.zk_client is not None:
            try:
                self.zk_client.stop()
                self.zk_client.close()
            except Exception:  # noqa: BLE001 - shutdown must finish
                logger.debug("zkbeat: error stopping the ZooKeeper client", exc_info=True)
        if isinstance(self._wake, Wakeup):
            self._wake.close()  # after the client: no watch sets it any more

    def _schedule_hash(self) -> str | None:
        """The digest of this replica's schedule for its candidate data (zkbeat.coordination.peers)."""
        try:
            return schedule_hash(self.schedule)
        except Exception:  # noqa: BLE001 - a host whose schedule cannot be read yet just does not say
            logger.debug("zkbeat: could not hash the schedule", exc_info=True)
            return None

"""Security and hostile input against real ZooKeeper servers: digest ACLs, TLS,
secrets kept out of logs and output, and znodes or settings zkbeat did not write.

Schedulers run in-process (as in test_scheduler.py); the ``zkbeat`` command
runs in-process through click's runner with the app registered as a module.
"""

from __future__ import annotations

import json
import logging
import ssl
import subprocess
import sys
import traceback
import types
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import pytest
from celery import Celery
from click.testing import CliRunner, Result
from kazoo.client import KazooClient
from kazoo.exceptions import NoAuthError
from kazoo.security import ACL, Id, Permissions, make_acl, make_digest_acl, make_digest_acl_credential

from tests.support.helpers import Published, every, lead, wait_for
from tests.support.servers import JAVA_DIR, RedisServer, ZooKeeperServer, drop_connection, free_port, require_binary
from zkbeat import ConfigurationError, Scheduler
from zkbeat.ledger.store import EntryState, decode_name, encode_state
from zkbeat.ops.cli import main as zkbeat_command

USER, SECRET = "zkbeat", "s3cret"
CREDENTIAL = f"{USER}:{SECRET}"
AUTH = [("digest", CREDENTIAL)]
#: The digest ZooKeeper stores in the ACL; derived from the secret, so it is
#: kept out of logs and output just like the secret itself.
DIGEST_ID = make_digest_acl_credential(USER, SECRET)
OWNER_ACL = make_digest_acl(USER, SECRET, all=True)
LONG_AGO = datetime(2020, 1, 1, tzinfo=timezone.utc)


# --------------------------------------------------------------------------
# Fixtures and helpers
# --------------------------------------------------------------------------


def app_for(conf: dict) -> Celery:
    app = Celery("zkbeat-security", set_as_current=False)
    app.conf.update(conf)
    return app


def connect(hosts: str, auth: list[tuple[str, str]] | None = None) -> KazooClient:
    client = KazooClient(hosts, auth_data=auth)
    client.start(timeout=15)
    return client


@pytest.fixture
def owner(zk_server: ZooKeeperServer) -> Iterator[KazooClient]:
    """A client holding zkbeat's credential."""
    client = connect(zk_server.hosts, AUTH)
    yield client
    client.stop()
    client.close()


@pytest.fixture
def intruders(zk_server: ZooKeeperServer) -> Iterator[dict[str, KazooClient]]:
    """Clients without zkbeat's credential: anonymous, and another digest user."""
    clients = {
        "anonymous": connect(zk_server.hosts),
        "other digest user": connect(zk_server.hosts, [("digest", "mallory:guess")]),
    }
    yield clients
    for client in clients.values():
        client.stop()
        client.close()


def once(**spec) -> dict:
    """An hourly entry last run long ago: due exactly once (caught up), then not for an hour."""
    return every(3600, last_run_at=LONG_AGO, **spec)


def lead_and_publish(scheduler: Scheduler, published: Published, names: set[str] | None = None) -> None:
    """Tick until the scheduler leads and every entry in ``names`` (default: any) has been published."""

    def done() -> bool:
        scheduler.tick()
        return set(published.entries()) >= names if names else bool(published.headers)

    wait_for(done, timeout=20, message=lambda: f"published so far: {published.entries()}")


def subtree(client: KazooClient, path: str) -> list[str]:
    """``path`` and every znode below it."""
    found = [path]
    for child in client.get_children(path):
        found.extend(subtree(client, f"{path}/{child}"))
    return found


def run_cli(app: Celery | None, *args: str, monkeypatch: pytest.MonkeyPatch) -> Result:
    """Run the real `zkbeat` command in-process; with ``app``, as `zkbeat -A <module> ...`."""
    argv = list(args)
    if app is not None:
        module_name = f"zkbeat_security_app_{uuid.uuid4().hex[:8]}"
        module = types.ModuleType(module_name)
        module.app = app
        monkeypatch.setitem(sys.modules, module_name, module)
        argv = ["-A", module_name, *argv]
    kazoo_logger = logging.getLogger("kazoo")
    level = kazoo_logger.level
    try:
        return CliRunner().invoke(zkbeat_command, argv, catch_exceptions=False)
    finally:
        kazoo_logger.setLevel(level)  # the command quiets kazoo for good; other tests need it back


def output_of(result: Result) -> str:
    return result.stdout + result.stderr


# --------------------------------------------------------------------------
# 1. zkbeat_auth: digest ACLs on everything zkbeat creates
# --------------------------------------------------------------------------


def test_digest_auth_leader_protects_every_znode_it_creates(
    make_scheduler, published: Published, owner: KazooClient, intruders: dict[str, KazooClient], zk_root: str
) -> None:
    """With zkbeat_auth, every znode under zkbeat_root carries one ACL, for that identity, and others get NoAuth."""
    root = f"{zk_root}/proj"
    scheduler = make_scheduler({"tidy": once()}, zkbeat_root=root, zkbeat_auth=AUTH)
    lead_and_publish(scheduler, published)
    assert published.entries() == ["tidy"]

    paths = subtree(owner, root)
    candidate, entry = scheduler.election.candidate, scheduler.ledger.entry_path("tidy")
    assert {root, f"{root}/v1", f"{root}/v1/election", candidate, f"{root}/v1/entries", entry} <= set(paths)
    for path in paths:
        acls, _ = owner.get_acls(path)
        assert acls == [OWNER_ACL], (path, acls)
        assert acls[0].id == Id("digest", DIGEST_ID)

    for intruder in intruders.values():
        for path in paths:
            with pytest.raises(NoAuthError):
                intruder.get(path)
            with pytest.raises(NoAuthError):
                intruder.get_children(path)
            with pytest.raises(NoAuthError):
                intruder.set(path, b"{}")
            with pytest.raises(NoAuthError):
                intruder.set_acls(path, [make_acl("world", "anyone", all=True)])
            with pytest.raises(NoAuthError):
                intruder.create(f"{path}/intruder", b"")
        # Deleting needs DELETE on the parent: every parent below the root is zkbeat's.
        for path in paths[1:]:
            with pytest.raises(NoAuthError):
                intruder.delete(path)
        with pytest.raises(NoAuthError):
            # An intruder cannot slip a candidate of its own into the election.
            intruder.create(f"{root}/v1/election/candidate-0-", b"{}", ephemeral=True, sequence=True)
    assert sorted(owner.get_children(f"{root}/v1/election")) == [candidate.rsplit("/", 1)[1]]
    assert owner.get(entry)[1].version == 0, "no intruder changed the ledger"
    assert scheduler.election.is_leader


def test_ancestors_zkbeat_creates_let_other_apps_make_their_own_root(
    make_scheduler,
    published: Published,
    owner: KazooClient,
    zk_root: str,
    zk_server: ZooKeeperServer,
    redis_server: RedisServer,
) -> None:
    """An ancestor of zkbeat_root that zkbeat creates is the identity's, readable and creatable by all, nothing more."""
    scheduler = make_scheduler({"tidy": once()}, zkbeat_root=f"{zk_root}/proj", zkbeat_auth=AUTH)
    lead_and_publish(scheduler, published)
    acls, _ = owner.get_acls(zk_root)
    assert sorted(acls, key=str) == sorted(
        [OWNER_ACL, ACL(Permissions.READ | Permissions.CREATE, Id("world", "anyone"))], key=str
    )
    # A second app with its own credential (or none) shares the ancestor, not the root.
    other = make_scheduler(
        {"report": once()},
        zkbeat_root=f"{zk_root}/other",
        zkbeat_auth=[("digest", "other:pw")],
        zkbeat_identity="other-app",
    )
    lead_and_publish(other, published, {"tidy", "report"})
    anonymous = make_scheduler({"open": once()}, zkbeat_root=f"{zk_root}/open", zkbeat_identity="open-app")
    lead_and_publish(anonymous, published, {"tidy", "report", "open"})
    assert sorted(published.entries()) == ["open", "report", "tidy"]
    with pytest.raises(NoAuthError):
        owner.get(f"{zk_root}/other")
    stranger = connect(zk_server.hosts)
    try:
        with pytest.raises(NoAuthError):
            stranger.set(zk_root, b"mine")
        with pytest.raises(NoAuthError):
            stranger.set_acls(zk_root, [make_acl("world", "anyone", all=True)])
    finally:
        stranger.stop()
        stranger.close()


def test_zkbeat_command_reads_a_protected_root_with_the_apps_credentials(
    make_scheduler, published: Published, zk_server: ZooKeeperServer, zk_root: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`zkbeat -A app status/health/step-down` work on a protected root with its zkbeat_auth; others get NoAuth."""
    conf = {
        "zkbeat_hosts": zk_server.hosts,
        "zkbeat_root": zk_root,
        "zkbeat_auth": AUTH,
        "beat_schedule": {"tidy": once()},
    }
    scheduler = make_scheduler({"tidy": once()}, zkbeat_auth=AUTH, zkbeat_identity="guarded-leader")
    lead_and_publish(scheduler, published)
    app = app_for(conf)

    text = run_cli(app, "status", monkeypatch=monkeypatch)
    assert text.exit_code == 0, output_of(text)
    assert "leader: guarded-leader" in text.stdout
    as_json = run_cli(app, "status", "--json", monkeypatch=monkeypatch)
    assert as_json.exit_code == 0, output_of(as_json)
    found = json.loads(as_json.stdout)
    assert found["leader"]["identity"] == "guarded-leader"
    assert [(e["name"], e["total_run_count"]) for e in found["entries"]] == [("tidy", 1)]
    health = run_cli(app, "health", monkeypatch=monkeypatch)
    assert health.exit_code == 0, output_of(health)
    assert health.stdout.startswith("ok: guarded-leader leads")

    without = run_cli(None, "--hosts", zk_server.hosts, "--root", zk_root, "status", monkeypatch=monkeypatch)
    assert without.exit_code != 0
    assert without.stdout == ""
    assert len(without.stderr.strip().splitlines()) == 1
    assert "denied access" in without.stderr and "zkbeat_auth" in without.stderr, without.stderr
    denied = run_cli(None, "--hosts", zk_server.hosts, "--root", zk_root, "step-down", monkeypatch=monkeypatch)
    assert denied.exit_code == 2 and "denied access" in denied.stderr, output_of(denied)
    assert scheduler.election.is_leader, "without the credential nobody can unseat the leader"
    candidate = scheduler.election.candidate
    stepped = run_cli(app, "step-down", monkeypatch=monkeypatch)
    assert stepped.exit_code == 0, output_of(stepped)
    wait_for(lambda: scheduler.election.candidate not in (None, candidate), message="rejoined with a new candidate")
    for result in (text, as_json, health, without, denied, stepped):
        assert SECRET not in output_of(result) and DIGEST_ID not in output_of(result)


# --------------------------------------------------------------------------
# 3. Secrets stay out of logs, output and errors
# --------------------------------------------------------------------------


def test_secret_never_reaches_a_log_record(
    make_scheduler, published: Published, caplog: pytest.LogCaptureFixture
) -> None:
    """At DEBUG for zkbeat and kazoo, a scheduler that authenticates, leads, reconnects and closes logs no secret."""
    caplog.set_level(logging.DEBUG)
    for name in ("zkbeat", "kazoo"):
        caplog.set_level(logging.DEBUG, logger=name)
    scheduler = make_scheduler({"tidy": every(0.2)}, zkbeat_auth=AUTH)
    lead_and_publish(scheduler, published)
    drop_connection(scheduler.zk_client)  # kazoo sends the credential again on reconnect
    count = len(published.headers)
    wait_for(lambda: scheduler.tick() is not None and len(published.headers) > count, timeout=20)
    scheduler.close()

    loggers = {record.name.split(".")[0] for record in caplog.records}
    assert {"zkbeat", "kazoo"} <= loggers, loggers
    assert any(r.name.startswith("kazoo") and r.levelno == logging.DEBUG for r in caplog.records)
    assert any("became leader" in r.getMessage() for r in caplog.records)
    formatter = logging.Formatter()
    for record in caplog.records:
        text = formatter.format(record) + repr(record.args)
        assert SECRET not in text and DIGEST_ID not in text, text


@pytest.mark.parametrize(
    "conf",
    [
        {"zkbeat_auth": CREDENTIAL},  # a string, not a list of pairs
        {"zkbeat_auth": ("digest", CREDENTIAL)},  # one pair, not a list
        {"zkbeat_auth": [("digest", SECRET)]},  # no "user:"
        {"zkbeat_auth": [("digest", CREDENTIAL, "extra")]},
        {"zkbeat_auth": [(None, CREDENTIAL)]},
        {"zkbeat_auth": AUTH, "zkbeat_session_timeout": "soon"},  # good auth, another bad setting
        {"zkbeat_auth": AUTH, "zkbeat_ssl_ca": "/nonexistent/ca.pem"},
    ],
    ids=["string", "one-pair", "no-user", "triple", "no-scheme", "other-setting", "missing-ca"],
)
def test_configuration_error_never_shows_the_secret(
    conf: dict, redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A bad setting stops Scheduler() and `zkbeat -A` naming the setting; no message or traceback shows the secret."""
    app = app_for({"broker_url": redis_server.url, **conf})
    with pytest.raises(ConfigurationError) as info:
        Scheduler(app, lazy=True)
    error = info.value
    assert error.setting in str(error) and error.setting.startswith("zkbeat_")
    printed = "".join(traceback.format_exception(error)) + repr(error) + repr(error.args) + repr(error.value)
    assert SECRET not in printed and DIGEST_ID not in printed, printed

    result = run_cli(app, "status", monkeypatch=monkeypatch)
    assert result.exit_code == 2
    assert error.setting in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert SECRET not in output_of(result)


# --------------------------------------------------------------------------
# 2. TLS to ZooKeeper
# --------------------------------------------------------------------------

#: Debian's zookeeper.jar names netty-handler in its manifest's Class-Path but
#: not netty-codec, which Netty's SslHandler extends: without it the server
#: answers the first TLS client with NoClassDefFoundError ByteToMessageDecoder.
NETTY_CODEC_JAR = JAVA_DIR / "netty-codec.jar"

_OPENSSL_CONFIG = """\
[req]
distinguished_name = dn
prompt = no
[dn]
CN = unused
[ca]
basicConstraints = critical, CA:TRUE
keyUsage = critical, keyCertSign, cRLSign
subjectKeyIdentifier = hash
[leaf]
basicConstraints = critical, CA:FALSE
keyUsage = critical, digitalSignature, keyEncipherment
extendedKeyUsage = serverAuth, clientAuth
subjectAltName = IP:127.0.0.1
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid
"""


@dataclass(frozen=True)
class Pki:
    """A throw-away CA with a server and a client certificate, all PEM."""

    ca: Path
    server_pem: Path  # key + certificate in one file, as ZooKeeper's PEM keystore wants
    client_cert: Path
    client_key: Path
    other_ca: Path  # a CA that signed nothing here


def make_pki(directory: Path) -> Pki:
    """Generate the certificates with the openssl CLI (EC P-256 keys: quick to make)."""
    openssl = require_binary("openssl", "apt-get install -y openssl", what="OpenSSL")
    config = directory / "openssl.cnf"
    config.write_text(_OPENSSL_CONFIG)

    def run(*args: str) -> None:
        subprocess.run([openssl, *args], cwd=directory, check=True, capture_output=True)

    new_key = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-config", str(config))
    for name in ("ca", "other-ca"):
        run(
            "req",
            "-x509",
            *new_key,
            "-extensions",
            "ca",
            "-days",
            "2",
            "-subj",
            f"/CN=zkbeat test {name}",
            "-keyout",
            f"{name}.key",
            "-out",
            f"{name}.pem",
        )
    for serial, name in enumerate(("server", "client"), 1):
        run(
            "req", "-new", *new_key, "-subj", f"/CN=zkbeat test {name}", "-keyout", f"{name}.key", "-out", f"{name}.csr"
        )
        run(
            "x509",
            "-req",
            "-in",
            f"{name}.csr",
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-set_serial",
            str(serial),
            "-days",
            "2",
            "-extfile",
            str(config),
            "-extensions",
            "leaf",
            "-out",
            f"{name}.crt",
        )
    server_pem = directory / "server.pem"
    server_pem.write_text((directory / "server.key").read_text() + (directory / "server.crt").read_text())
    return Pki(
        ca=directory / "ca.pem",
        server_pem=server_pem,
        client_cert=directory / "client.crt",
        client_key=directory / "client.key",
        other_ca=directory / "other-ca.pem",
    )


class TlsZooKeeperServer(ZooKeeperServer):
    """A standalone ZooKeeper with a TLS client port beside the plain one.

    The plain port stays because the fixture's readiness check speaks
    four-letter words on it; zkbeat under test only gets ``secure_hosts``.
    """

    def __init__(self, pki: Pki) -> None:
        require_binary(str(NETTY_CODEC_JAR), "apt-get install -y libnetty-java", what="Netty's codec jar")
        self.secure_port = free_port()
        super().__init__(
            extra_cfg={
                "serverCnxnFactory": "org.apache.zookeeper.server.NettyServerCnxnFactory",
                "secureClientPort": self.secure_port,
                "secureClientPortAddress": "127.0.0.1",
                "ssl.keyStore.location": pki.server_pem,
                "ssl.keyStore.type": "PEM",
                "ssl.trustStore.location": pki.ca,
                "ssl.trustStore.type": "PEM",
                "ssl.clientAuth": "need",
            }
        )

    @property
    def secure_hosts(self) -> str:
        return f"127.0.0.1:{self.secure_port}"

    def _command(self) -> list[str]:
        command = super()._command()
        classpath = command.index("-cp") + 1
        command[classpath] = f"{command[classpath]}:{NETTY_CODEC_JAR}"
        return command


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def tls_server(pki: Pki) -> Iterator[TlsZooKeeperServer]:
    with TlsZooKeeperServer(pki) as server:
        yield server


def tls_settings(pki: Pki, **overrides) -> dict:
    settings = {
        "zkbeat_use_ssl": True,
        "zkbeat_ssl_ca": str(pki.ca),
        "zkbeat_ssl_cert": str(pki.client_cert),
        "zkbeat_ssl_key": str(pki.client_key),
    }
    settings.update(overrides)
    return {key: value for key, value in settings.items() if value is not None}


def test_scheduler_leads_and_publishes_over_tls(
    make_scheduler, published: Published, pki: Pki, tls_server: TlsZooKeeperServer
) -> None:
    """With zkbeat_use_ssl and the CA, cert and key, a scheduler leads and publishes through ZooKeeper's TLS port."""
    scheduler = make_scheduler({"tidy": once()}, zkbeat_hosts=tls_server.secure_hosts, **tls_settings(pki))
    lead_and_publish(scheduler, published)
    assert published.entries() == ["tidy"]
    sock = scheduler.zk_client._connection._socket  # kazoo has no public handle on it
    assert isinstance(sock, ssl.SSLSocket) and sock.version() in ("TLSv1.2", "TLSv1.3")
    assert sock.getpeername()[1] == tls_server.secure_port
    assert scheduler.ledger.load(["tidy"])["tidy"].state.total_run_count == 1


@pytest.mark.parametrize(
    ("case", "reason"),
    [
        ("plain client", "socket connection broken"),  # the server drops what is not a TLS record
        ("unknown CA", "CERTIFICATE_VERIFY_FAILED"),
        ("no client certificate", "SSL"),  # the server's alert: it requires one (ssl.clientAuth=need)
        ("name not in the server certificate", "Hostname mismatch"),
    ],
)
def test_scheduler_does_not_connect_over_a_bad_tls_setup(
    case: str,
    reason: str,
    make_scheduler,
    published: Published,
    pki: Pki,
    tls_server: TlsZooKeeperServer,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A scheduler that cannot complete TLS with the server never connects, stays a follower and publishes nothing."""
    hosts = tls_server.secure_hosts
    if case == "plain client":
        conf = {}
    elif case == "unknown CA":
        conf = tls_settings(pki, zkbeat_ssl_ca=str(pki.other_ca))
    elif case == "no client certificate":
        conf = tls_settings(pki, zkbeat_ssl_cert=None, zkbeat_ssl_key=None)
    else:
        hosts = f"localhost:{tls_server.secure_port}"  # loopback, but the certificate names only 127.0.0.1
        conf = tls_settings(pki)
    caplog.set_level(logging.DEBUG, logger="kazoo")  # zkbeat's clients log kazoo's failed attempts at DEBUG
    scheduler = make_scheduler({"tidy": every(0.1)}, zkbeat_hosts=hosts, **conf)

    def attempts_failed() -> bool:
        assert scheduler.tick() == 0
        return sum(reason in r.getMessage() for r in caplog.records if r.name.startswith("kazoo")) >= 3

    wait_for(attempts_failed, timeout=30, message=lambda: "\n".join(r.getMessage() for r in caplog.records))
    assert not scheduler.zk_client.connected
    assert scheduler.election.candidate is None
    assert published.headers == []


# --------------------------------------------------------------------------
# 4. Hostile or broken input
# --------------------------------------------------------------------------

MALLORY = [("digest", "mallory:pw")]
MALLORY_ACL = make_digest_acl("mallory", "pw", all=True)


@pytest.fixture
def mallory(zk_server: ZooKeeperServer) -> Iterator[KazooClient]:
    """Another ZooKeeper user, who got to zkbeat's znodes first."""
    client = connect(zk_server.hosts, MALLORY)
    yield client
    client.stop()
    client.close()


def zk_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name.startswith("zkbeat") and r.levelno >= logging.WARNING]


def test_root_owned_by_someone_else_is_logged_and_survived(
    make_scheduler, published: Published, mallory: KazooClient, zk_root: str, caplog: pytest.LogCaptureFixture
) -> None:
    """NoAuth on the root: the scheduler says why, keeps contending without crashing, and leads once it may."""
    mallory.create(zk_root, b"mine", acl=[MALLORY_ACL], makepath=True)
    caplog.set_level(logging.DEBUG, logger="zkbeat")
    scheduler = make_scheduler({"tidy": every(0.2)}, zkbeat_auth=AUTH)

    def refused_twice() -> bool:
        assert scheduler.tick() == 0
        return sum("NoAuth" in r.getMessage() for r in caplog.records if r.name.startswith("zkbeat")) >= 2

    wait_for(refused_twice, timeout=20, message=lambda: "\n".join(zk_warnings(caplog)))
    assert published.headers == []
    assert not scheduler.election.is_leader
    reason = next(m for m in zk_warnings(caplog) if "NoAuth" in m)
    assert zk_root in reason, reason

    mallory.set_acls(zk_root, [MALLORY_ACL, OWNER_ACL])  # access granted: the retrying replica now leads
    lead_and_publish(scheduler, published)
    assert set(published.entries()) == {"tidy"}


def test_ledger_owned_by_someone_else_is_logged_and_survived(
    make_scheduler, published: Published, mallory: KazooClient, zk_root: str, caplog: pytest.LogCaptureFixture
) -> None:
    """NoAuth on the ledger: the leader says where, publishes nothing, keeps contending, and publishes once allowed."""
    mallory.ensure_path(f"{zk_root}/v1")  # open to all, like a root zkbeat made without zkbeat_auth
    mallory.create(f"{zk_root}/v1/entries", b"", acl=[MALLORY_ACL])
    caplog.set_level(logging.DEBUG, logger="zkbeat")
    scheduler = make_scheduler({"tidy": every(0.2)}, zkbeat_auth=AUTH)

    def refused_twice() -> bool:
        scheduler.tick()
        return sum("NoAuth" in m for m in zk_warnings(caplog)) >= 2

    wait_for(refused_twice, timeout=20, message=lambda: "\n".join(zk_warnings(caplog)))
    assert published.headers == []
    assert any(zk_root in m for m in zk_warnings(caplog) if "NoAuth" in m), zk_warnings(caplog)
    mallory.set_acls(f"{zk_root}/v1/entries", [MALLORY_ACL, OWNER_ACL])
    lead_and_publish(scheduler, published)


def test_entry_someone_else_made_read_only_is_survived(
    make_scheduler, published: Published, mallory: KazooClient, zk_root: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A ledger entry zkbeat may read but not write: each refused claim is logged with its name, no busy loop."""
    entries = f"{zk_root}/v1/entries"
    mallory.ensure_path(entries)
    state = encode_state(EntryState(LONG_AGO, 3))
    mallory.create(f"{entries}/locked", state, acl=[MALLORY_ACL, ACL(Permissions.READ, Id("world", "anyone"))])
    caplog.set_level(logging.INFO, logger="zkbeat")
    # The refused entry is left out for max_interval each time (2 s here), the others go on.
    scheduler = make_scheduler({"locked": every(0.2)}, zkbeat_auth=AUTH, beat_max_loop_interval=2)
    scheduler._idle = lambda interval: interval  # tick() returns the sleep it wants instead of waiting it out
    lead(scheduler)
    claims: list[object] = []
    start_claim = scheduler.ledger.start_claim  # a leader's claims, each sent this way (Ledger.claim too)

    def counting_claim(*args, **kwargs):
        claims.append(args)
        return start_claim(*args, **kwargs)

    scheduler.ledger.start_claim = counting_claim
    delays = []

    def refused_three_times() -> bool:
        delays.append(scheduler.tick())
        return len(refusals()) >= 3

    def refusals() -> list[str]:
        return [m for m in zk_warnings(caplog) if "NoAuth" in m and "'locked'" in m]

    wait_for(refused_three_times, timeout=30, message=lambda: "\n".join(zk_warnings(caplog)))
    assert published.headers == []
    assert len(claims) <= len(refusals()) + 1, f"{len(claims)} claims, {len(refusals())} logged: a silent retry loop"
    assert any(delay >= 1 for delay in delays), f"a refused claim backs off instead of retrying at once: {delays}"
    assert mallory.get(f"{entries}/locked")[0] == state


def test_garbage_candidates_are_shown_unreadable_and_the_election_goes_on(
    make_scheduler,
    published: Published,
    zk_server: ZooKeeperServer,
    zk_client: KazooClient,
    zk_root: str,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Candidates holding bytes, a JSON list or ill-typed fields show as unreadable/unknown; leaders still lead.

    The junk is in nodes named as zkbeat names candidates and owned by a live
    session, so it keeps its place in line (a badly named or persistent node
    is a stranger and never ranks: see test_election_strangers.py); health
    says no leader while such a head stays silent.
    """
    election = f"{zk_root}/v1/election"
    first = make_scheduler({"tidy": every(0.2)}, zkbeat_identity="first")
    lead_and_publish(first, published)
    # A stranger's session puts junk in line behind the leader, and a node that is no candidate at all.
    stranger = connect(zk_server.hosts)
    junk = {
        "bytes": b"\xff\xfe\x00not json",
        "list": b"[1, 2, 3]",
        "types": json.dumps({"identity": ["x"], "pid": "12", "host": 7, "started_at": 3}).encode(),
        "forger": json.dumps({"identity": "evil\x1b[2J\nleader: mallory", "leader_since": "\r\x07"}).encode(),
    }
    try:
        for data in junk.values():
            stranger.create(f"{election}/candidate-{uuid.uuid4().hex}-", data, ephemeral=True, sequence=True)
        stranger.create(f"{election}/not-a-candidate", b"\x00")
        app = app_for({"zkbeat_hosts": zk_server.hosts, "zkbeat_root": zk_root, "zkbeat_session_timeout": 2})

        found = json.loads(run_cli(app, "status", "--json", monkeypatch=monkeypatch).stdout)
        forged = "evil\x1b[2J\nleader: mallory"
        assert [c["identity"] for c in found["candidates"]] == ["first", None, None, "['x']", forged]
        assert [c["readable"] for c in found["candidates"]] == [True, False, False, True, True]
        assert found["candidates"][3]["pid"] is None
        text = run_cli(app, "status", monkeypatch=monkeypatch)
        assert text.exit_code == 0 and text.stdout.count("<unreadable data>") == 2, text.stdout
        assert "evil\\x1b[2J\\nleader: mallory" in text.stdout, "shown escaped, on its own row"
        assert not any(ch in text.stdout for ch in "\x1b\r\x07")
        assert [line for line in text.stdout.splitlines() if line.startswith("leader:")] == [
            text.stdout.splitlines()[1]
        ], "no forged report line"

        count = len(published.headers)
        wait_for(lambda: first.tick() is not None and len(published.headers) > count, timeout=10)
        first.close()  # handover: the junk is next in line now
        second = make_scheduler({"tidy": every(0.2)}, zkbeat_identity="second")
        wait_for(lambda: second.election.candidate is not None)
        found = json.loads(run_cli(app, "status", "--json", monkeypatch=monkeypatch).stdout)
        assert found["leader"] is None and found["head"]["readable"] is False
        assert [c["identity"] for c in found["candidates"]][-1] == "second"
        health = run_cli(app, "health", monkeypatch=monkeypatch)
        assert health.exit_code == 1 and "has not taken the lead" in output_of(health), output_of(health)
        for _ in range(3):
            assert second.tick() == 0, "behind the junk, the new replica only waits"
    finally:
        stranger.stop()  # its session ends: the junk goes, as a crashed replica's candidate would
        stranger.close()
    count = len(published.headers)
    wait_for(lambda: second.tick() is not None and len(published.headers) > count, timeout=20)
    assert published.headers[-1]["zkbeat-epoch"] == second.election.epoch
    assert zk_client.exists(f"{election}/not-a-candidate") is not None
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


@pytest.mark.parametrize("case", ["missing", "foreign", "zookeeper"])
@pytest.mark.parametrize("command", ["status", "health"])
def test_a_root_that_is_not_zkbeats_is_refused_in_one_line(
    case: str,
    command: str,
    zk_server: ZooKeeperServer,
    zk_client: KazooClient,
    zk_root: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`zkbeat status`/`health` on a path that is missing or holds something else exit 1 with a one-line reason."""
    root = {"missing": zk_root, "foreign": zk_root, "zookeeper": "/zookeeper"}[case]
    if case == "foreign":
        zk_client.create(f"{zk_root}/locks/lock-0001", b"x", makepath=True)
        zk_client.create(f"{zk_root}/config", b'{"v1": true}')
    result = run_cli(None, "--hosts", zk_server.hosts, "--root", root, command, monkeypatch=monkeypatch)
    assert result.exit_code == 1, output_of(result)
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("zkbeat: ") and root in lines[0], result.stderr
    assert ("does not exist" if case == "missing" else "is not a zkbeat root") in lines[0]


HOSTILE_NAMES = [
    "reports/daily",
    "../../escape",
    ".",
    "..",
    "100%/done",
    "ünïcødé ☃ 日本語 🎉",
    "tab\tnew\nline",
    "x" * 1000,
    "日" * 1000,
]


def test_hostile_entry_names_are_published_once_and_listed(
    make_scheduler,
    published: Published,
    owner: KazooClient,
    zk_server: ZooKeeperServer,
    zk_root: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Entry names with '/', '..', unicode, control characters or 1000 characters run once each and show in status."""
    schedule = {name: once() for name in HOSTILE_NAMES}
    scheduler = make_scheduler(schedule)
    lead_and_publish(scheduler, published, set(HOSTILE_NAMES))
    for _ in range(5):
        scheduler.tick()
    assert sorted(published.entries()) == sorted(HOSTILE_NAMES), "each exactly once"
    stored = owner.get_children(f"{zk_root}/v1/entries")
    assert sorted(decode_name(child) for child in stored) == sorted(HOSTILE_NAMES), "one znode each, under entries/"
    assert all(owner.get_children(f"{zk_root}/v1/entries/{child}") == [] for child in stored)

    app = app_for({"zkbeat_hosts": zk_server.hosts, "zkbeat_root": zk_root, "beat_schedule": schedule})
    as_json = run_cli(app, "status", "--json", "--all", monkeypatch=monkeypatch)
    assert as_json.exit_code == 0, output_of(as_json)
    listed = {e["name"]: e for e in json.loads(as_json.stdout)["entries"]}
    assert sorted(listed) == sorted(HOSTILE_NAMES)
    assert all(e["total_run_count"] == 1 and e["readable"] and e["next_due"] for e in listed.values())
    text = run_cli(app, "status", "--all", monkeypatch=monkeypatch)
    assert text.exit_code == 0, output_of(text)
    for name in HOSTILE_NAMES:
        assert name.replace("\t", "\\t").replace("\n", "\\n") in text.stdout
    assert len(text.stdout.splitlines()) == 5 + 1 + 1 + len(HOSTILE_NAMES), "one line per entry"

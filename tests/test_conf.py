"""Unit tests for the zkbeat_* settings and the ledger's pure encoding helpers.

No servers: ``read_settings`` gets a plain dict as ``conf`` and an explicit
``environ`` so the machine's own environment never leaks into a result.
"""

from __future__ import annotations

import json
import math
import os
import socket
import traceback
from datetime import timedelta, timezone
from fractions import Fraction
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from zkbeat.conf import DEFAULT_HOSTS, DEFAULT_SESSION_TIMEOUT, Settings, read_settings
from zkbeat.exceptions import ConfigurationError
from zkbeat.ledger.store import EntryState, decode_name, decode_state, encode_name, encode_state

SECRET = "s3cret"
CREDENTIAL = f"user:{SECRET}"


def read(environ: dict[str, str] | None = None, app_name: str | None = "proj", **conf: Any) -> Settings:
    """read_settings with a clean environment and ``zkbeat_*`` keyword settings."""
    return read_settings({f"zkbeat_{key}": value for key, value in conf.items()}, app_name, environ or {})


def config_error(setting: str, value: Any) -> ConfigurationError:
    """Read ``{setting: value}`` and return the ConfigurationError it must raise."""
    with pytest.raises(ConfigurationError) as info:
        read_settings({setting: value}, "proj", {})
    return info.value


def assert_names_setting_and_value(error: ConfigurationError, setting: str, value: Any) -> None:
    message = str(error)
    assert error.setting == setting
    assert setting in message, message
    assert repr(value) in message, message


# --------------------------------------------------------------------------
# Defaults
# --------------------------------------------------------------------------


def test_defaults() -> None:
    """With nothing configured every setting takes its documented default."""
    settings_ = read()
    assert settings_.hosts == DEFAULT_HOSTS == "127.0.0.1:2181"
    assert settings_.root == "/zkbeat/proj"
    assert settings_.session_timeout == DEFAULT_SESSION_TIMEOUT == 10.0
    assert settings_.identity == f"{socket.gethostname()}:{os.getpid()}"
    assert settings_.misfire_grace_time is None
    assert settings_.auth == ()
    assert settings_.use_ssl is False
    assert (settings_.ssl_ca, settings_.ssl_cert, settings_.ssl_key) == (None, None, None)


@pytest.mark.parametrize("app_name", ["__main__", None, "", "  "])
def test_default_root_without_a_real_app_name(app_name: str | None) -> None:
    """An app without a usable name (``__main__``, None, blank) gets /zkbeat/default."""
    assert read(app_name=app_name).root == "/zkbeat/default"


def test_default_root_replaces_slashes_in_app_name() -> None:
    """An app name containing '/' still yields a single path component under /zkbeat."""
    assert read(app_name="team/proj").root == "/zkbeat/team_proj"


def test_explicit_values_are_kept() -> None:
    """Valid explicit settings come back unchanged (numbers as floats, identity stripped)."""
    settings_ = read(
        hosts="zk1:2181,zk2:2182/chroot",
        root="/custom/path",
        session_timeout=4,
        identity="  web-1 ",
        misfire_grace_time=30,
    )
    assert settings_.hosts == "zk1:2181,zk2:2182/chroot"
    assert settings_.root == "/custom/path"
    assert settings_.session_timeout == 4.0
    assert settings_.identity == "web-1"
    assert settings_.misfire_grace_time == 30.0


def test_numeric_strings_are_accepted() -> None:
    """Numbers given as strings (e.g. from environment variables) are parsed."""
    settings_ = read(session_timeout="2.5", misfire_grace_time="0")
    assert settings_.session_timeout == 2.5
    assert settings_.misfire_grace_time == 0.0


# --------------------------------------------------------------------------
# ZKBEAT_HOSTS
# --------------------------------------------------------------------------


def test_zkbeat_hosts_env_used_when_setting_unset() -> None:
    """ZKBEAT_HOSTS supplies the connect string when zkbeat_hosts is not set."""
    assert read(environ={"ZKBEAT_HOSTS": "zk-env:2281"}).hosts == "zk-env:2281"


def test_zkbeat_hosts_setting_wins_over_env() -> None:
    """An explicit zkbeat_hosts setting takes precedence over ZKBEAT_HOSTS."""
    assert read(environ={"ZKBEAT_HOSTS": "zk-env:2281"}, hosts="zk-conf:2181").hosts == "zk-conf:2181"


def test_zkbeat_hosts_env_is_validated() -> None:
    """A bad ZKBEAT_HOSTS fails like a bad setting, naming zkbeat_hosts and the value."""
    with pytest.raises(ConfigurationError) as info:
        read(environ={"ZKBEAT_HOSTS": "zk:99999"})
    assert_names_setting_and_value(info.value, "zkbeat_hosts", "zk:99999")


def test_process_environment_is_read_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without an explicit environ, read_settings reads ZKBEAT_HOSTS from os.environ."""
    monkeypatch.setenv("ZKBEAT_HOSTS", "zk-os-env:2181")
    assert read_settings({}, "proj").hosts == "zk-os-env:2181"


# --------------------------------------------------------------------------
# Bad values name the setting and the value
# --------------------------------------------------------------------------


@pytest.mark.parametrize("value", [-1, 0, 0.0, "abc", "", True, False, math.nan, math.inf, -math.inf, [10], {}])
def test_bad_session_timeout(value: Any) -> None:
    """A session timeout that is not a finite number > 0 is rejected, naming the value."""
    assert_names_setting_and_value(config_error("zkbeat_session_timeout", value), "zkbeat_session_timeout", value)


def test_huge_session_timeout_is_a_configuration_error() -> None:
    """An integer too large for a float is a ConfigurationError, not an OverflowError."""
    value = 10**400
    error = config_error("zkbeat_session_timeout", value)
    assert error.setting == "zkbeat_session_timeout"


@pytest.mark.parametrize(
    "value",
    ["", "   ", "a:b:c:notaport", "host:99999", "host:-1", "host:0", "zk:2181,,zk2:2181", 12, 1.5, b"zk"],
)
def test_bad_hosts(value: Any) -> None:
    """A connect string that cannot be parsed or has a bad host/port is rejected, naming it."""
    error = config_error("zkbeat_hosts", value)
    assert error.setting == "zkbeat_hosts"
    assert "zkbeat_hosts" in str(error)
    shown = {repr(value), repr(value.strip())} if isinstance(value, str) else {repr(value)}
    assert any(text in str(error) for text in shown), str(error)


def test_bad_chroot_in_hosts() -> None:
    """A connect string whose chroot is not a valid znode path is rejected, naming the chroot."""
    error = config_error("zkbeat_hosts", "zk:2181/a//b")
    assert error.setting == "zkbeat_hosts"
    assert "zkbeat_hosts" in str(error)
    assert "/a//b" in str(error)


@pytest.mark.parametrize(
    "value",
    [
        "relative",
        "zkbeat/proj",
        "/a//b",
        "/a/../b",
        "/a/./b",
        "/a/\x00b",
        "/a/\x1fb",
        # ZooKeeper itself refuses these characters in a path (BadArguments).
        "/a/\x7fb",
        "/a/\x9fb",
        "/a/\ue000b",
        "/a/\ufff0b",
        12,
        ["/a"],
    ],
)
def test_bad_root(value: Any) -> None:
    """A root that is not a valid absolute znode path is rejected at start-up, naming it."""
    assert_names_setting_and_value(config_error("zkbeat_root", value), "zkbeat_root", value)


@pytest.mark.parametrize(("value", "expected"), [("/a/", "/a"), ("/a/b/", "/a/b"), ("/", "/"), ("/a", "/a")])
def test_root_trailing_slash_is_normalised(value: str, expected: str) -> None:
    """A trailing slash on the root is dropped rather than rejected."""
    assert read(root=value).root == expected


@pytest.mark.parametrize("value", ["soon", -5, -0.1, timedelta(seconds=-1), True, math.nan, math.inf, [1]])
def test_bad_misfire_grace_time(value: Any) -> None:
    """A misfire grace time that is not None or a number of seconds >= 0 is rejected, naming it."""
    error = config_error("zkbeat_misfire_grace_time", value)
    shown = value.total_seconds() if isinstance(value, timedelta) else value
    assert error.setting == "zkbeat_misfire_grace_time"
    assert "zkbeat_misfire_grace_time" in str(error)
    assert repr(value) in str(error) or repr(shown) in str(error), str(error)


def test_misfire_grace_time_accepts_timedelta() -> None:
    """A timedelta misfire grace time is converted to seconds."""
    assert read(misfire_grace_time=timedelta(minutes=2, seconds=3)).misfire_grace_time == 123.0


@pytest.mark.parametrize("value", ["", "  ", 5, ["web-1"], "web\x01-1", "web\n1", "web\x7f"])
def test_bad_identity(value: Any) -> None:
    """An identity that is not a non-empty string of printable characters is rejected, naming it (logs and every
    run in the ledger carry it; JSON writes a control character as six bytes)."""
    assert_names_setting_and_value(config_error("zkbeat_identity", value), "zkbeat_identity", value)


@pytest.mark.parametrize("value", [-1, 11, 2.5, "10", True, [3]])
def test_bad_recent_runs(value: Any) -> None:
    """A number of recent runs that is not a whole number from 0 to 10 is rejected, naming it."""
    assert_names_setting_and_value(config_error("zkbeat_recent_runs", value), "zkbeat_recent_runs", value)


@pytest.mark.parametrize("value", ["maybe", 2, [True]])
def test_bad_use_ssl(value: Any) -> None:
    """A use_ssl value that is not a boolean (or boolean-like string) is rejected, naming it."""
    assert_names_setting_and_value(config_error("zkbeat_use_ssl", value), "zkbeat_use_ssl", value)


@pytest.mark.parametrize(("value", "expected"), [("yes", True), ("off", False), (True, True), (None, False)])
def test_use_ssl_accepts_boolean_like_values(value: Any, expected: bool) -> None:
    """use_ssl takes booleans and the usual true/false strings."""
    assert read(use_ssl=value).use_ssl is expected


@pytest.mark.parametrize("setting", ["zkbeat_ssl_ca", "zkbeat_ssl_cert", "zkbeat_ssl_key"])
def test_missing_ssl_file(setting: str, tmp_path: Any) -> None:
    """An SSL file setting naming a file that does not exist is rejected, naming the path."""
    missing = str(tmp_path / "nope.pem")
    assert_names_setting_and_value(config_error(setting, missing), setting, missing)


def test_existing_ssl_files_are_accepted(tmp_path: Any) -> None:
    """SSL file settings pointing at existing files are kept as paths."""
    paths = {}
    for name in ("ca", "cert", "key"):
        path = tmp_path / f"{name}.pem"
        path.write_text("x")
        paths[name] = path
    settings_ = read(use_ssl=True, ssl_ca=str(paths["ca"]), ssl_cert=paths["cert"], ssl_key=str(paths["key"]))
    assert settings_.use_ssl is True
    assert (settings_.ssl_ca, settings_.ssl_cert, settings_.ssl_key) == tuple(str(p) for p in paths.values())


# --------------------------------------------------------------------------
# Auth and secrets
# --------------------------------------------------------------------------


def test_auth_is_accepted_and_redacted_in_repr() -> None:
    """Valid auth pairs are kept, and repr(Settings) never shows the credential."""
    settings_ = read(auth=[("digest", CREDENTIAL), ["sasl", "other-" + SECRET]])
    assert settings_.auth == (("digest", CREDENTIAL), ("sasl", "other-" + SECRET))
    assert SECRET not in repr(settings_)
    assert SECRET not in str(settings_)
    assert "digest" in repr(settings_)


@pytest.mark.parametrize(
    "value",
    [
        CREDENTIAL,  # not a list
        ("digest", CREDENTIAL),  # one pair, not a list of pairs
        CREDENTIAL.encode(),
        5,
        {"digest": CREDENTIAL},
        [CREDENTIAL],
        [("digest",)],
        [("digest", CREDENTIAL, "extra")],
        [(1, CREDENTIAL)],
        [("", CREDENTIAL)],
        [("digest", "")],
        [("digest", CREDENTIAL.encode())],
        [("digest", SECRET)],  # digest without ':'
        [("digest", CREDENTIAL), ("digest", "user-" + SECRET)],
        [None],
        [5],
    ],
)
def test_bad_auth_never_shows_the_secret(value: Any) -> None:
    """A bad zkbeat_auth is a ConfigurationError naming the setting but never the credential."""
    error = config_error("zkbeat_auth", value)
    assert error.setting == "zkbeat_auth"
    assert "zkbeat_auth" in str(error)
    for text in (str(error), repr(error), repr(error.value), repr(error.args), repr(error.__cause__)):
        assert SECRET not in text, text
    assert error.__cause__ is None


# --------------------------------------------------------------------------
# Property tests
# --------------------------------------------------------------------------


@given(st.text(min_size=1))
@example(".")
@example("..")
@example("/")
@example("a/b/../c")
@example("%2E")
@example("%")
@example("x" * 1000)
def test_entry_name_round_trips_as_one_path_component(name: str) -> None:
    """Any non-empty entry name encodes to one valid znode path component and decodes back."""
    encoded = encode_name(name)
    assert decode_name(encoded) == name
    assert encoded
    assert "/" not in encoded
    assert encoded not in (".", "..")
    assert all(0x20 < ord(ch) < 0x7F for ch in encoded), encoded


def test_empty_entry_name_is_rejected() -> None:
    """The empty name has no znode component, so encode_name refuses it."""
    with pytest.raises(ValueError):
        encode_name("")


utc_datetimes = st.datetimes(timezones=st.just(timezone.utc))
entry_states = st.builds(
    EntryState,
    last_run_at=utc_datetimes,
    total_run_count=st.integers(min_value=0),
    epoch=st.none() | st.integers(),
    updated_at=st.none() | utc_datetimes,
    slot=st.none() | utc_datetimes,
)


@given(entry_states)
def test_entry_state_round_trips(state: EntryState) -> None:
    """encode_state/decode_state round-trip any EntryState with aware UTC datetimes."""
    raw = encode_state(state)
    assert isinstance(raw, bytes)
    json.loads(raw)  # always JSON, never pickle
    assert decode_state(raw) == state


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=5), children, max_size=3),
    max_leaves=8,
)
ledger_like_objects = st.fixed_dictionaries(
    {},
    optional={
        "last_run_at": json_values | st.just("2024-01-01T00:00:00+00:00"),
        "total_run_count": json_values,
        "epoch": json_values,
        "updated_at": json_values | st.just("2024-01-01T00:00:00+00:00"),
        "slot": json_values,
    },
)


foreign_znode_data = (
    st.binary()
    | json_values.map(lambda value: json.dumps(value).encode())
    | ledger_like_objects.map(lambda value: json.dumps(value).encode())
)


@given(foreign_znode_data)
@example(b'{"last_run_at": 12345}')
@example(b'{"last_run_at": "2024-01-01T00:00:00+00:00", "updated_at": 7}')
def test_decode_state_rejects_foreign_data_with_value_error_only(raw: bytes) -> None:
    """decode_state either parses a znode or raises ValueError, the one error the ledger handles."""
    try:
        state = decode_state(raw)
    except ValueError:
        return
    assert isinstance(state, EntryState)


arbitrary_values = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats()
    | st.text()
    | st.binary()
    | st.timedeltas()
    | st.decimals()
    | st.fractions()
    | st.lists(st.integers() | st.text(), max_size=3)
    | st.dictionaries(st.text(max_size=3), st.integers(), max_size=2)
)


ALL_SETTINGS = [
    "zkbeat_session_timeout",
    "zkbeat_misfire_grace_time",
    "zkbeat_hosts",
    "zkbeat_root",
    "zkbeat_identity",
    "zkbeat_auth",
    "zkbeat_use_ssl",
    "zkbeat_ssl_ca",
    "zkbeat_ssl_cert",
    "zkbeat_ssl_key",
    "zkbeat_metrics_port",
    "zkbeat_metrics_address",
]


@settings(max_examples=600)
@given(st.sampled_from(ALL_SETTINGS), arbitrary_values)
@example("zkbeat_session_timeout", 10**400)
@example("zkbeat_misfire_grace_time", 10**400)
@example("zkbeat_session_timeout", Fraction(10**400))
@example("zkbeat_metrics_port", math.inf)  # int(inf) is an OverflowError
@example("zkbeat_session_timeout", 10**5000)  # repr() of it raises ValueError
@example("zkbeat_ssl_ca", "a\x00b")
def test_read_settings_raises_only_configuration_error(setting: str, value: Any) -> None:
    """Whatever value a setting holds, read_settings returns Settings or raises ConfigurationError."""
    try:
        result = read_settings({setting: value}, "proj", {})
    except ConfigurationError as error:
        assert error.setting == setting
        return
    assert isinstance(result, Settings)


with_colon = st.sampled_from([CREDENTIAL, f" {CREDENTIAL} ", CREDENTIAL.encode()])
secret_values = with_colon | st.just(SECRET) | st.none() | st.floats()
schemes = st.sampled_from(["digest", "sasl", "", "DIGEST"]) | st.none() | st.integers()
auth_items = (
    st.tuples(schemes, secret_values)
    | st.lists(st.one_of(schemes, with_colon), max_size=3)  # any order: a swapped pair too
    | st.tuples(schemes, secret_values, secret_values)
    | secret_values
)
auth_values = (
    secret_values
    | st.lists(auth_items, max_size=3)
    | st.lists(auth_items, max_size=3).map(tuple)
    | st.dictionaries(st.sampled_from(["digest", "sasl"]), secret_values, max_size=2)
    | st.lists(auth_items, max_size=3).map(iter)
)


@settings(max_examples=300)
@given(auth_values)
@example([("digest", SECRET)])
@example([("digest", CREDENTIAL), ("digest", SECRET)])
@example([("digest", CREDENTIAL), ("digest", CREDENTIAL.encode())])
@example([[CREDENTIAL, "digest"]])
def test_zkbeat_auth_never_shows_the_secret_whatever_its_shape(value: Any) -> None:
    """Any zkbeat_auth value is accepted or refused with a ConfigurationError, and neither shows the secret."""
    try:
        result = read_settings({"zkbeat_auth": value}, "proj", {})
    except ConfigurationError as error:
        printed = "".join(traceback.format_exception(error)) + repr(error.args) + repr(error.value)
        assert SECRET not in printed, printed
        return
    assert SECRET not in repr(result) and SECRET not in str(result)


@pytest.mark.parametrize(
    "value", ["a:b", ":5", "host:70000", "[::1", "[::1]x", "0.0.0.0", "[::]:80", "two words", 5, ["127.0.0.1", 0]]
)
def test_a_bad_liveness_address_names_the_setting(value) -> None:
    """zkbeat_liveness_address must be 'host' or 'host:port' that other replicas can dial."""
    with pytest.raises(ConfigurationError, match="zkbeat_liveness_address"):
        read_settings({"zkbeat_liveness_address": value})


def test_liveness_settings_parse() -> None:
    """Liveness is on by default; an address takes an optional port (0 = any); [v6]:port works."""
    default = read_settings({})
    assert default.liveness is True and default.liveness_address is None and default.stall_timeout == 30.0
    assert read_settings({"zkbeat_liveness_address": "10.0.0.5"}).liveness_address == ("10.0.0.5", 0)
    assert read_settings({"zkbeat_liveness_address": "10.0.0.5:7000"}).liveness_address == ("10.0.0.5", 7000)
    assert read_settings({"zkbeat_liveness_address": "[fd00::1]:7000"}).liveness_address == ("fd00::1", 7000)
    assert read_settings({"zkbeat_liveness": "false"}).liveness is False


@pytest.mark.parametrize("value", [0, 5, -1, "soon", True, float("inf")])
def test_a_bad_stall_timeout_names_the_setting(value) -> None:
    """zkbeat_stall_timeout must be a number of seconds above the broker wait of one pass (5 s)."""
    with pytest.raises(ConfigurationError, match="zkbeat_stall_timeout"):
        read_settings({"zkbeat_stall_timeout": value})


def test_a_bad_liveness_switch_names_the_setting() -> None:
    """zkbeat_liveness takes true or false only."""
    with pytest.raises(ConfigurationError, match="zkbeat_liveness"):
        read_settings({"zkbeat_liveness": "maybe"})

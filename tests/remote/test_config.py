"""The `PARL_*` settings: each variable's range, one clear line for a bad value, defaults else.

`Settings` and `check_env` are read here in this process; `import parl_remote` and the `xparl`
command run as processes of their own, as a user starts them.
"""

from __future__ import annotations

import dataclasses
import os

import pytest

import parl
import parl_remote
from parl_remote import RemoteError, SettingError, check_env
from parl_remote._config import Settings, env_flag, settings, shm_max_bytes, shm_min_bytes
from parl_remote.master import _master
from parl_remote.security import _tls_context
from parl_remote.worker import _worker
from tests.remote.conftest import run_script
from tests.remote.test_cluster import xparl

VARIABLES = [
    *("PARL_" + f.name.upper() for f in dataclasses.fields(Settings)),
    "PARL_TLS",
    "PARL_SHM_MIN_BYTES",
    "PARL_SHM_MAX_BYTES",
]


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    """No `PARL_*` setting of the test run leaks into these tests (nor their processes)."""
    for name in VARIABLES:
        monkeypatch.delenv(name, raising=False)


def test_unset_and_empty_variables_mean_the_defaults(monkeypatch):
    assert Settings.from_env() == Settings()
    for name in VARIABLES:
        monkeypatch.setenv(name, "")
    assert Settings.from_env() == Settings()
    monkeypatch.setenv("PARL_PRELOAD_NICE", "  ")
    assert Settings.from_env().preload_nice == 10
    assert env_flag("PARL_TLS") is False
    assert shm_min_bytes() == 64 << 10 and shm_max_bytes() > 0
    check_env()


def test_values_in_range_are_taken_up_to_their_edges(monkeypatch):
    edges = {
        "PARL_HEARTBEAT_S": "0.2",
        "PARL_HEARTBEAT_TIMEOUT_S": "1",
        "PARL_MASTER_GRACE_S": "0",
        "PARL_RESOURCE_WAIT_S": "0",
        "PARL_MAX_MESSAGE_BYTES": str(1 << 20),
        "PARL_MAX_CONNECTIONS": "1",
        "PARL_LOG_LINES_PER_ACTOR": "0",
        "PARL_PRELOAD": "0",
        "PARL_PRELOAD_NICE": "19",
        "PARL_WARM_SPARES": "0",
        "PARL_SHM_MIN_BYTES": "0",
    }
    for name, value in edges.items():
        monkeypatch.setenv(name, value)
    got = Settings.from_env()
    assert (got.heartbeat_s, got.heartbeat_timeout_s, got.master_grace_s) == (0.2, 1.0, 0.0)
    assert (got.max_message_bytes, got.max_connections, got.log_lines_per_actor) == (1 << 20, 1, 0)
    assert (got.preload, got.preload_nice, got.warm_spares) == (0, 19, 0)
    assert shm_min_bytes() == 0
    monkeypatch.setenv("PARL_PRELOAD_NICE", "0")
    assert Settings.from_env().preload_nice == 0
    check_env()


@pytest.mark.parametrize(
    ("name", "value", "accepted"),
    [
        ("PARL_HEARTBEAT_S", "abc", "a number greater than 0"),
        ("PARL_HEARTBEAT_S", "0", "a number greater than 0"),
        ("PARL_CONNECT_TIMEOUT_S", "inf", "a number greater than 0"),
        ("PARL_IDLE_TIMEOUT_S", "nan", "a number greater than 0"),
        ("PARL_MASTER_GRACE_S", "-1", "a number of at least 0"),
        ("PARL_PRELOAD_MAX_MB", "lots", "a number of at least 0"),
        ("PARL_MAX_MESSAGE_BYTES", "1000", "an integer of at least 1048576"),
        ("PARL_MAX_MESSAGE_BYTES", "1.5e9", "an integer of at least 1048576"),
        ("PARL_MAX_CONNECTIONS", "0", "an integer of at least 1"),
        ("PARL_WARM_SPARES", "-1", "an integer of at least 0"),
        ("PARL_PRELOAD", "2", "0 or 1"),
        ("PARL_PRELOAD", "yes", "0 or 1"),
        ("PARL_PRELOAD_NICE", "99", "an integer from 0 to 19"),
        ("PARL_PRELOAD_NICE", "-1", "an integer from 0 to 19"),
    ],
)
def test_a_bad_value_is_one_message_naming_the_variable_and_its_range(
    name, value, accepted, monkeypatch
):
    monkeypatch.setenv(name, value)
    with pytest.raises(SettingError) as caught:
        Settings.from_env()
    message = str(caught.value)
    assert message.startswith(f"{name}={value!r} is not {accepted}: unset it for the default (")
    assert message.endswith(f") or give {accepted}")
    assert "\n" not in message
    assert isinstance(caught.value, ValueError) and isinstance(caught.value, RemoteError)
    with pytest.raises(SettingError, match=name):
        check_env()


def test_the_message_says_the_default_and_what_to_give(monkeypatch):
    monkeypatch.setenv("PARL_PRELOAD_NICE", "99")
    with pytest.raises(SettingError) as caught:
        check_env()
    assert str(caught.value) == (
        "PARL_PRELOAD_NICE='99' is not an integer from 0 to 19: unset it for the default (10) "
        "or give an integer from 0 to 19"
    )


def test_a_heartbeat_must_come_more_often_than_the_silence_that_loses_a_peer(monkeypatch):
    monkeypatch.setenv("PARL_HEARTBEAT_TIMEOUT_S", "0.5")  # PARL_HEARTBEAT_S: its default, 1
    with pytest.raises(SettingError, match=r"^PARL_HEARTBEAT_TIMEOUT_S='0.5' is not a number "):
        Settings.from_env()
    monkeypatch.setenv("PARL_HEARTBEAT_S", "0.5")  # equal: refused too, the timeout named
    with pytest.raises(SettingError, match=r"greater than PARL_HEARTBEAT_S \(0.5\)"):
        Settings.from_env()
    monkeypatch.delenv("PARL_HEARTBEAT_TIMEOUT_S")
    monkeypatch.setenv("PARL_HEARTBEAT_S", "10")  # against the timeout's default, 10
    with pytest.raises(SettingError) as caught:
        Settings.from_env()
    assert str(caught.value).startswith(
        "PARL_HEARTBEAT_S='10' is not a number less than PARL_HEARTBEAT_TIMEOUT_S (10, its "
        "default): unset it for the default (1)"
    )


def test_reload_refuses_a_bad_environment_and_keeps_the_settings(monkeypatch):
    before = dataclasses.replace(settings)
    monkeypatch.setenv("PARL_HEARTBEAT_S", "0.5")
    monkeypatch.setenv("PARL_WARM_SPARES", "-2")
    with pytest.raises(SettingError, match="PARL_WARM_SPARES='-2'"):
        settings.reload()
    assert settings == before


@pytest.mark.parametrize("value", ["1", "true", "YES", "on"])
def test_tls_on(value, monkeypatch):
    monkeypatch.setenv("PARL_TLS", value)
    assert _tls_context.enabled() is True


@pytest.mark.parametrize("value", ["0", "false", "No", "off", ""])
def test_tls_off(value, monkeypatch):
    monkeypatch.setenv("PARL_TLS", value)
    assert _tls_context.enabled() is False


def test_a_tls_value_neither_on_nor_off_is_refused_not_taken_as_off(monkeypatch):
    monkeypatch.setenv("PARL_TLS", "maybe")
    with pytest.raises(SettingError) as caught:
        _tls_context.enabled()
    assert str(caught.value).startswith("PARL_TLS='maybe' is not on or off (")
    assert str(caught.value).endswith("unset it for the default (off) or give 1 or 0")
    with pytest.raises(SettingError, match="PARL_TLS='maybe'"):
        check_env()


@pytest.mark.parametrize("name", ["PARL_SHM_MIN_BYTES", "PARL_SHM_MAX_BYTES"])
def test_a_bad_shared_memory_size_is_refused(name, monkeypatch):
    monkeypatch.setenv(name, "-1")
    with pytest.raises(SettingError, match=rf"^{name}='-1' is not an integer of at least 0: "):
        check_env()


def test_connect_refuses_a_bad_environment_before_it_connects(monkeypatch):
    monkeypatch.setenv("PARL_CONNECT_TIMEOUT_S", "soon")
    with pytest.raises(SettingError, match="PARL_CONNECT_TIMEOUT_S='soon'"):
        parl_remote.connect("127.0.0.1:9")  # nothing listens there: it would fail otherwise


def test_the_facade_gives_the_setting_and_cluster_errors():
    assert parl.SettingError is SettingError
    assert parl.ClusterError is parl_remote.ClusterError


@pytest.mark.parametrize(
    ("main", "argv"),
    [(_master.main, ["--port", "0"]), (_worker.main, ["--address", "127.0.0.1:9"])],
)
def test_the_master_and_the_worker_stop_with_one_line(main, argv, monkeypatch, capsys):
    monkeypatch.setenv("PARL_MAX_CONNECTIONS", "none")
    with pytest.raises(SystemExit) as stopped:
        main(argv)
    assert stopped.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert ": error: PARL_MAX_CONNECTIONS='none' is not an integer of at least 1: " in err


def test_import_with_a_bad_environment_does_not_raise():
    env = dict(os.environ, PARL_HEARTBEAT_S="abc", PARL_TLS="maybe")
    done = run_script(
        """
        import parl, parl_remote
        from parl_remote._config import settings
        print(settings.heartbeat_s)
        try:
            parl_remote.check_env()
        except parl.SettingError as exc:
            print(exc)
        """,
        env,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "1.0"  # the default until check_env says why
    assert lines[1].startswith("PARL_HEARTBEAT_S='abc' is not a number greater than 0")


@pytest.mark.parametrize(
    ("variables", "argv", "starts"),
    [
        ({"PARL_HEARTBEAT_S": "abc"}, ["status"], "PARL_HEARTBEAT_S='abc' is not a number"),
        ({"PARL_TLS": "maybe"}, ["stop", "--tls"], "PARL_TLS='maybe' is not on or off"),
    ],
)
def test_xparl_with_a_bad_setting_says_it_in_one_line(variables, argv, starts, tmp_path):
    env = dict(os.environ, PARL_HOME=str(tmp_path / "home"), **variables)
    done = xparl(*argv, env=env)
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr.count("\n") == 1
    assert done.stderr.startswith(f"xparl {argv[0]}: error: {starts}")
    assert not (tmp_path / "home").exists()  # nothing was done

"""A run whose servers listen on TCP, beyond loopback or on it, gets CURVE keys of its own, without a
step from its user; one on Unix sockets (the default on one host) needs none."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cadence.config import load_config
from cadence.launch.launcher import prepare
from cadence.transport.keys import CurveKeys


def saved_keys(out: Path) -> str:
    return str(json.loads((out / "config.json").read_text())["transport"]["keys"])


def test_a_run_bound_beyond_loopback_makes_its_own_keys(tmp_path: Path) -> None:
    cfg, _ = prepare(load_config(None, ["transport.host='0.0.0.0'"]), tmp_path / "run")
    folder = tmp_path / "run" / "keys"
    assert cfg.transport.keys == saved_keys(tmp_path / "run") == str(folder.resolve())
    assert folder.stat().st_mode & 0o777 == 0o700
    for secret in ("server.key_secret", "client.key_secret"):
        assert (folder / secret).stat().st_mode & 0o777 == 0o600
    keys = CurveKeys(folder)
    assert keys.server_pair()[0] and keys.client_pair()[0]
    prepare(load_config(None, ["transport.host='0.0.0.0'"]), tmp_path / "run", overwrite=True)
    assert CurveKeys(folder).server_pair() == keys.server_pair()  # a replaced run keeps them


@pytest.mark.parametrize(
    "overrides",
    [
        ["transport.listen='tcp'"],  # tcp on loopback: any other user of the host could connect
        ["transport.trainer_port=5601"],  # a fixed port (a tunnel's) listens on tcp
        ["transport.advertise_host='gw.example.org'"],  # told to others: tcp
    ],
    ids=["tcp", "fixed-port", "advertised"],
)
def test_a_run_on_tcp_loopback_makes_its_own_keys_too(tmp_path: Path, overrides: list[str]) -> None:
    cfg, _ = prepare(load_config(None, overrides), tmp_path / "run")
    assert cfg.transport.keys == saved_keys(tmp_path / "run") == str((tmp_path / "run" / "keys").resolve())


@pytest.mark.parametrize(
    ("overrides", "beyond", "want"),
    [
        ([], False, ""),  # loopback: Unix sockets in a 0700 folder, this user alone reaches them
        (["transport.listen='ipc'", "transport.host='0.0.0.0'"], False, ""),  # Unix sockets whatever the host
        (["transport.host='0.0.0.0'", "transport.unencrypted=true"], False, ""),  # opted out
        (["transport.listen='tcp'", "transport.unencrypted=true"], False, ""),  # opted out on loopback
        (["transport.keys='/given/keys'"], True, "/given/keys"),  # the user's own
    ],
    ids=["local", "ipc", "opted-out", "opted-out-loopback", "given"],
)
def test_no_keys_are_made_on_loopback_when_given_or_refused(
    tmp_path: Path, overrides: list[str], beyond: bool, want: str
) -> None:
    cfg, _ = prepare(load_config(None, overrides), tmp_path / "run", beyond=beyond)
    assert cfg.transport.keys == saved_keys(tmp_path / "run") == want
    assert not (tmp_path / "run" / "keys").exists()


def test_a_slurm_run_is_keyed_without_a_step_from_its_user(tmp_path: Path) -> None:
    cfg, _ = prepare(load_config(None), tmp_path / "run", beyond=True)  # what `cadence slurm submit` does
    assert saved_keys(tmp_path / "run") == str((tmp_path / "run" / "keys").resolve())

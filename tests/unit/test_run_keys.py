"""A run that binds beyond loopback gets CURVE keys of its own, without a step from its user."""

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
    ("overrides", "beyond", "want"),
    [
        ([], False, ""),  # loopback: nobody else reaches it
        (["transport.host='0.0.0.0'", "transport.unencrypted=true"], False, ""),  # opted out
        (["transport.keys='/given/keys'"], True, "/given/keys"),  # the user's own
    ],
    ids=["loopback", "opted-out", "given"],
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

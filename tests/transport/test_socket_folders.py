"""The folders of Unix sockets: one a server, removed by its close, and those of killed processes
removed by the next one, never anything else."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from cadence.transport.socket_folders import PREFIX, pid_namespace, sweep_stale


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def _with_socket(folder: Path) -> Path:
    folder.mkdir(mode=0o700)
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(folder / "s"))  # a short name: a socket's path has at most 107 bytes
    sock.close()
    return folder


@pytest.fixture
def base() -> Iterator[Path]:
    """A short folder of the test's own (pytest's tmp_path can be too long for a socket's path)."""
    folder = Path(tempfile.mkdtemp(prefix="cs-"))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def test_the_folders_of_dead_processes_go_and_nothing_else(base: Path) -> None:
    dead, space = _dead_pid(), pid_namespace()
    stale = _with_socket(base / f"{PREFIX}{space}-{dead}-abc")
    live = _with_socket(base / f"{PREFIX}{space}-{os.getppid()}-abc")  # pytest's parent runs
    ours = _with_socket(base / f"{PREFIX}{space}-{os.getpid()}-abc")
    with_a_file = _with_socket(base / f"{PREFIX}{space}-{dead}-def")
    (with_a_file / "notes.txt").write_text("a user's")
    elsewhere = _with_socket(base / f"{PREFIX}1{space}-{dead}-abc")  # another pid namespace's
    other = _with_socket(base / f"cadence-{dead}-abc")  # not a socket folder's name
    assert sweep_stale(base, space) == 1
    assert not stale.exists()
    assert live.exists() and ours.exists() and with_a_file.exists() and elsewhere.exists() and other.exists()
    assert sweep_stale(base, space) == 0


def test_a_local_server_s_folder_is_named_after_its_process_and_gone_with_its_close() -> None:
    from cadence.transport.zmq_socket import LOCAL, ZmqNetwork

    net = ZmqNetwork()
    try:
        server = net.bind("dispatcher", LOCAL)
        folder = Path(server.address.removeprefix("ipc://")).parent
        assert folder.name.startswith(f"{PREFIX}{pid_namespace()}-{os.getpid()}-") and folder.exists()
        server.close()
        assert not folder.exists()
    finally:
        net.close()

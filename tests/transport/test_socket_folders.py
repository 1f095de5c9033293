"""The folders of Unix sockets: one a server, removed by its close, and those of killed processes
removed by the next one, never anything else."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

from cadence.transport.socket_folders import PREFIX, sweep_stale


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def _with_socket(folder: Path) -> Path:
    folder.mkdir(mode=0o700)
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(folder / "dispatcher.sock"))
    sock.close()
    return folder


def test_the_folders_of_dead_processes_go_and_nothing_else(tmp_path: Path) -> None:
    dead = _dead_pid()
    stale = _with_socket(tmp_path / f"{PREFIX}{dead}-abc")
    live = _with_socket(tmp_path / f"{PREFIX}{os.getppid()}-abc")  # pytest's parent runs
    ours = _with_socket(tmp_path / f"{PREFIX}{os.getpid()}-abc")
    with_a_file = _with_socket(tmp_path / f"{PREFIX}{dead}-def")
    (with_a_file / "notes.txt").write_text("a user's")
    other = _with_socket(tmp_path / f"cadence-{dead}-abc")  # not a socket folder's name
    assert sweep_stale(tmp_path) == 1
    assert not stale.exists()
    assert live.exists() and ours.exists() and with_a_file.exists() and other.exists()
    assert sweep_stale(tmp_path) == 0


def test_a_local_server_s_folder_is_named_after_its_process_and_gone_with_its_close() -> None:
    from cadence.transport.zmq_socket import LOCAL, ZmqNetwork

    net = ZmqNetwork()
    try:
        server = net.bind("dispatcher", LOCAL)
        folder = Path(server.address.removeprefix("ipc://")).parent
        assert folder.name.startswith(f"{PREFIX}{os.getpid()}-") and folder.exists()
        server.close()
        assert not folder.exists()
    finally:
        net.close()

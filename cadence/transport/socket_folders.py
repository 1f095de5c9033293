"""The folders of a process's Unix sockets (`transport.listen = "ipc"` or "auto" on one host, and the
same-host socket every server adds): one folder of mode 0700 a server, named after the process.

Invariant: a folder is removed by its server's `close`; one left by a process that was killed (no
close ran) is removed by the next process of the same user that makes one, once no process of that
pid runs. Only folders named `cadence-sock-<pid namespace>-<pid>-…` of this process's own pid
namespace (a pid means nothing in another's: containers sharing /tmp), owned by this user and holding
nothing but sockets, are ever removed: nothing else in the temporary folder is touched.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import tempfile
from pathlib import Path

import structlog

log = structlog.get_logger()

PREFIX = "cadence-sock-"


def new_socket_folder() -> str:
    """A new folder of this process's own, mode 0700, after removing those of dead processes."""
    space = pid_namespace()
    if space:
        swept = sweep_stale(Path(tempfile.gettempdir()), space)
        if swept:
            log.info(
                "socket_folders_removed", folders=swept, why="their processes ended without closing them"
            )
    return tempfile.mkdtemp(prefix=f"{PREFIX}{space or 'x'}-{os.getpid()}-")


def pid_namespace() -> str:
    """This process's pid namespace (its inode), "" where /proc does not say: then nothing is swept."""
    try:
        return str(os.stat("/proc/self/ns/pid").st_ino)
    except OSError:
        return ""


def sweep_stale(base: Path, space: str) -> int:
    """Remove this user's socket folders in `base` made in pid namespace `space` by a process that no
    longer runs; how many."""
    removed = 0
    for folder in base.glob(f"{PREFIX}{space}-*"):
        pid = _pid_of(folder.name, space)
        if pid is None or pid == os.getpid() or _alive(pid):
            continue
        if _only_sockets_of_mine(folder):
            shutil.rmtree(folder, ignore_errors=True)
            removed += 1
    return removed


def _pid_of(name: str, space: str) -> int | None:
    head = name.removeprefix(f"{PREFIX}{space}-").split("-", 1)[0]
    return int(head) if head.isdigit() else None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process runs under that pid
        return True
    return True


def _only_sockets_of_mine(folder: Path) -> bool:
    with contextlib.suppress(OSError):
        info = folder.lstat()
        if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid():
            return False
        return all(stat.S_ISSOCK(entry.lstat().st_mode) for entry in folder.iterdir())
    return False

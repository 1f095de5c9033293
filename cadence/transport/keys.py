"""CURVE key files of a run: made once by `cadence keys DIR`, read by every `ZmqNetwork` given the folder.

Invariant: a secret key file is never readable by anyone but its owner, not even while it is written
(the pairs are made in a private temporary folder, made 0600, then moved into place).

```
DIR/server.key          server public key      every host
DIR/server.key_secret   server secret key      hosts that bind: dispatcher, trainer, publisher
DIR/client.key          client public key      every host
DIR/client.key_secret   client secret key      every host (every actor connects as a client)
DIR/authorized/*.key    client public keys the servers accept (client.key; add others here)
```
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import zmq.auth

SERVER = "server"
CLIENT = "client"
AUTHORIZED = "authorized"

ROLES = {
    f"{SERVER}.key": "server public key (every host)",
    f"{SERVER}.key_secret": "server secret key (hosts of the dispatcher, trainer, publisher)",
    f"{CLIENT}.key": "client public key (every host)",
    f"{CLIENT}.key_secret": "client secret key (every host)",
    f"{AUTHORIZED}/{CLIENT}.key": "client keys the servers accept (add more *.key files here)",
}


class KeysError(ValueError):
    """A keys folder that cannot be used; the message names the file and how to make it."""


def make_keys(folder: Path, force: bool = False) -> list[Path]:
    """Write a server and a client key pair into `folder`; the files written."""
    targets = [folder / name for name in ROLES]
    present = [str(p.relative_to(folder)) for p in targets if p.exists()]
    if present and not force:
        raise KeysError(f"{folder} already holds {', '.join(present)}; --force replaces them")
    (folder / AUTHORIZED).mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=folder, prefix=".keys-") as tmp:  # mode 0700
        for role in (SERVER, CLIENT):
            public, secret = zmq.auth.create_certificates(tmp, role)
            os.chmod(secret, 0o600)
        (Path(tmp) / AUTHORIZED).mkdir()
        shutil.copyfile(Path(tmp) / f"{CLIENT}.key", Path(tmp) / AUTHORIZED / f"{CLIENT}.key")
        for target in targets:
            os.replace(Path(tmp) / target.relative_to(folder), target)
    return targets


class CurveKeys:
    """The key files of one folder, read when a socket needs them."""

    def __init__(self, folder: Path) -> None:
        if not folder.is_dir():
            raise KeysError(
                f"transport.keys: {folder} is not a folder; make one with `cadence keys {folder}`"
            )
        self.folder = folder
        self.authorized = folder / AUTHORIZED

    def server_pair(self) -> tuple[bytes, bytes]:
        """A server's public and secret key."""
        return self._pair(SERVER)

    def client_pair(self) -> tuple[bytes, bytes]:
        """A client's public and secret key."""
        return self._pair(CLIENT)

    def server_public(self) -> bytes:
        """The key a client checks its server by."""
        return self._load(f"{SERVER}.key")[0]

    def check_authorized(self) -> None:
        """A server refuses every client unless this folder has at least one client key."""
        if not list(self.authorized.glob("*.key")):
            raise KeysError(f"{self.authorized}: no client *.key files, so every client would be refused")

    def _pair(self, role: str) -> tuple[bytes, bytes]:
        public, secret = self._load(f"{role}.key_secret")
        if secret is None:
            raise KeysError(f"{self.folder / role}.key_secret holds no secret key")
        return public, secret

    def _load(self, name: str) -> tuple[bytes, bytes | None]:
        path = self.folder / name
        try:
            return zmq.auth.load_certificate(path)
        except (OSError, ValueError) as err:
            raise KeysError(f"{path}: {err}; make the keys with `cadence keys {self.folder}`") from None

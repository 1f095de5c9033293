"""CURVE keys on real loopback sockets, and the files `cadence keys` writes.

Keyed peers talk; a peer without keys, with a client key the servers do not know, or with another
run's keys delivers nothing and is logged as `peer_refused`, with its address where ZAP tells it.
"""

from __future__ import annotations

import asyncio
import re
import shutil
import stat
from collections.abc import AsyncIterator, Callable, Iterator, MutableMapping
from pathlib import Path
from typing import Any

import pytest
import structlog
import uvloop
import zmq.auth

from cadence import cli
from cadence.transport.curve import PeerRefusals
from cadence.transport.keys import ROLES, KeysError, make_keys
from cadence.transport.zmq_socket import LOCAL, ZmqNetwork, ZmqServer, beyond_loopback
from cadence.wire.messages import Heartbeat, WorkRequest

RUN = "run-k"
ADDRESS = "tcp://127.0.0.1:*"
WAIT = 5.0  # a bound on waiting for what should come; never a timing claim
NOTHING_WITHIN = 1.0  # a refused peer's message has not arrived after this long
NO_KEYS_REASON = re.compile("no CURVE key|left during the handshake")

pytestmark = pytest.mark.timeout(30)

Networks = Callable[[Path | None], ZmqNetwork]


@pytest.fixture
def keys(tmp_path: Path) -> Path:
    make_keys(tmp_path / "keys")
    return tmp_path / "keys"


@pytest.fixture
async def networks() -> AsyncIterator[Networks]:
    made: list[ZmqNetwork] = []

    def make(folder: Path | None) -> ZmqNetwork:
        made.append(ZmqNetwork(RUN, keys=folder))
        return made[-1]

    try:
        yield make
    finally:
        for net in made:
            net.close()


@pytest.fixture
def logs() -> Iterator[list[MutableMapping[str, Any]]]:
    with structlog.testing.capture_logs() as captured:
        yield captured


async def keyed_exchange(server_net: ZmqNetwork, client_net: ZmqNetwork) -> None:
    server = server_net.bind("dispatcher", ADDRESS)
    client = client_net.connect("worker-1", server.address)
    await client.send(WorkRequest(2))
    peer, env = await asyncio.wait_for(server.recv(), WAIT)
    assert (peer, env.message, env.sender) == (client.route, WorkRequest(2), "worker-1")
    await server.send(peer, Heartbeat("dispatcher"))
    assert (await asyncio.wait_for(client.recv(), WAIT)).message == Heartbeat("dispatcher")


async def nothing_arrives(
    server: ZmqServer, client_net: ZmqNetwork, logs: list[MutableMapping[str, Any]]
) -> MutableMapping[str, Any]:
    """The client's message never reaches `server`; the refusal logged for it."""
    client = client_net.connect("intruder", server.address)
    await client.send(WorkRequest(1))
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(server.recv(), NOTHING_WITHIN)
    for _ in range(int(WAIT / 0.05)):
        refused = [e for e in logs if e["event"] == "peer_refused"]
        if refused:
            return refused[0]
        await asyncio.sleep(0.05)
    raise AssertionError(f"no peer_refused in {logs}")


def foreign_client(tmp_path: Path, keys: Path) -> Path:
    """A folder with its own client pair that knows this run's server key."""
    folder = tmp_path / "foreign-client"
    make_keys(folder)
    shutil.copyfile(keys / "server.key", folder / "server.key")
    return folder


async def test_keyed_client_and_server_exchange_messages(keys: Path, networks: Networks) -> None:
    server_net = networks(keys)
    await keyed_exchange(server_net, networks(keys))
    assert server_net.gate is not None and server_net.gate.refused == 0


async def test_the_unix_socket_of_a_keyed_server_takes_keyed_clients_only(
    keys: Path, networks: Networks, logs: list[MutableMapping[str, Any]]
) -> None:
    server_net = networks(keys)
    server = server_net.bind("publisher", ADDRESS)
    local = server.bind_local()
    client = networks(keys).connect("worker-1", local)
    await client.send(WorkRequest(2))
    peer, env = await asyncio.wait_for(server.recv(), WAIT)
    assert (peer, env.message) == (client.route, WorkRequest(2))
    intruder = networks(None).connect("intruder", local)
    await intruder.send(WorkRequest(1))
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(server.recv(), NOTHING_WITHIN)


async def test_a_client_without_keys_delivers_nothing_and_is_logged(
    keys: Path, networks: Networks, logs: list[MutableMapping[str, Any]]
) -> None:
    server = networks(keys).bind("dispatcher", ADDRESS)
    event = await nothing_arrives(server, networks(None), logs)
    # whichever side sees the mismatched greetings first: the server, or the client, which hangs up
    assert event["channel"] == "dispatcher" and NO_KEYS_REASON.search(event["reason"])
    assert event["endpoint"] == server.address  # libzmq names no peer before ZAP


async def test_a_foreign_client_key_delivers_nothing_and_is_logged_with_its_address(
    tmp_path: Path, keys: Path, networks: Networks, logs: list[MutableMapping[str, Any]]
) -> None:
    intruder = foreign_client(tmp_path, keys)
    server = networks(keys).bind("trainer", ADDRESS)
    event = await nothing_arrives(server, networks(intruder), logs)
    public, _ = zmq.auth.load_certificate(intruder / "client.key")
    assert event["channel"] == "trainer" and event["reason"] == "client key not in authorized/"
    assert event["address"] == "127.0.0.1" and event["client_key"] == public.decode()


async def test_another_runs_keys_deliver_nothing_and_are_logged(
    tmp_path: Path, keys: Path, networks: Networks, logs: list[MutableMapping[str, Any]]
) -> None:
    other = tmp_path / "other-run"
    make_keys(other)
    server = networks(keys).bind("publisher", ADDRESS)
    event = await nothing_arrives(server, networks(other), logs)
    assert event["channel"] == "publisher" and "does not decrypt" in event["reason"]
    assert event["endpoint"] == server.address


async def test_a_keyed_client_cannot_talk_to_a_server_without_keys(keys: Path, networks: Networks) -> None:
    server = networks(None).bind("dispatcher", ADDRESS)
    client = networks(keys).connect("worker-1", server.address)
    await client.send(WorkRequest(1))
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(server.recv(), NOTHING_WITHIN)


def test_the_zap_handler_works_on_the_uvloop_actors_run_on(tmp_path: Path, keys: Path) -> None:
    async def scenario(logs: list[MutableMapping[str, Any]]) -> MutableMapping[str, Any]:
        nets = [ZmqNetwork(RUN, keys=keys) for _ in range(2)]
        nets.append(ZmqNetwork(RUN, keys=foreign_client(tmp_path, keys)))
        try:
            await keyed_exchange(nets[0], nets[1])
            return await nothing_arrives(nets[0].bind("trainer", ADDRESS), nets[2], logs)
        finally:
            for net in nets:
                net.close()

    with structlog.testing.capture_logs() as logs:
        event = uvloop.run(scenario(logs))
    assert event["address"] == "127.0.0.1" and event["channel"] == "trainer"


def test_refusals_are_counted_and_a_few_a_second_logged() -> None:
    now = [0.0]
    refusals = PeerRefusals(per_second=5, clock=lambda: now[0])
    with structlog.testing.capture_logs() as logs:
        for _ in range(20):
            refusals.refuse("dispatcher", "no CURVE key", endpoint="tcp://127.0.0.1:1")
        now[0] = 1.5
        refusals.refuse("dispatcher", "no CURVE key", endpoint="tcp://127.0.0.1:1")
    assert refusals.total == 21
    assert len(logs) == 6 and logs[-1]["suppressed"] == 15 and logs[-1]["refused_total"] == 21


async def test_missing_key_files_are_named(tmp_path: Path, keys: Path) -> None:
    with pytest.raises(KeysError, match="is not a folder; make one with `cadence keys"):
        ZmqNetwork(RUN, keys=tmp_path / "nowhere")
    worker_host = tmp_path / "worker-host"  # what a rollout-only host holds: no server secret
    worker_host.mkdir()
    for name in ("server.key", "client.key", "client.key_secret"):
        shutil.copyfile(keys / name, worker_host / name)
    net = ZmqNetwork(RUN, keys=worker_host)
    try:
        net.connect("worker-1", "tcp://127.0.0.1:1").close()
        with pytest.raises(KeysError, match="server.key_secret"):
            net.bind("dispatcher", ADDRESS)
        (worker_host / "server.key_secret").write_bytes((keys / "server.key_secret").read_bytes())
        with pytest.raises(KeysError, match="no client \\*.key files"):
            net.bind("dispatcher", ADDRESS)
    finally:
        net.close()


def test_cadence_keys_writes_private_secrets_and_keeps_keys_unless_forced(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / "run-keys"
    assert cli.main(["keys", str(folder)]) == 0
    printed = capsys.readouterr().out
    for name in ROLES:
        assert (folder / name).is_file() and str(folder / name) in printed
        mode = stat.S_IMODE((folder / name).stat().st_mode)
        if name.endswith("_secret"):
            assert mode == 0o600, name
    assert sorted(p.name for p in folder.iterdir()) == sorted(
        ["authorized", "client.key", "client.key_secret", "server.key", "server.key_secret"]
    )
    assert (folder / "authorized" / "client.key").read_bytes() == (folder / "client.key").read_bytes()
    server_public, server_secret = zmq.auth.load_certificate(folder / "server.key_secret")
    assert server_secret is not None and zmq.auth.load_certificate(folder / "server.key")[0] == server_public

    before = {name: (folder / name).read_bytes() for name in ROLES}
    assert cli.main(["keys", str(folder)]) == 2
    assert "already holds server.key" in capsys.readouterr().err
    assert {name: (folder / name).read_bytes() for name in ROLES} == before

    assert cli.main(["keys", str(folder), "--force"]) == 0
    assert (folder / "server.key").read_bytes() != before["server.key"]
    assert stat.S_IMODE((folder / "client.key_secret").stat().st_mode) == 0o600


@pytest.mark.parametrize(
    ("address", "exposed"),
    [
        ("tcp://127.0.0.1:*", False),
        ("tcp://127.0.0.2:5555", False),
        ("tcp://localhost:5555", False),
        ("tcp://[::1]:5555", False),
        ("tcp://0.0.0.0:*", True),
        ("tcp://*:5555", True),
        ("tcp://10.0.0.1:5555", True),
        ("tcp://eth0:5555", True),
        ("inproc://dispatcher", False),
    ],
)
def test_what_binds_beyond_loopback(address: str, exposed: bool) -> None:
    assert beyond_loopback(address) is exposed


async def test_binding_on_tcp_without_keys_warns_with_the_fix(
    keys: Path, networks: Networks, logs: list[MutableMapping[str, Any]]
) -> None:
    networks(None).bind("dispatcher", LOCAL)
    networks(keys).bind("dispatcher", "tcp://0.0.0.0:*")
    networks(keys).bind("publisher", "tcp://127.0.0.1:*")
    assert not [e for e in logs if e["event"] == "unencrypted_bind"]  # a Unix socket, or keyed: no warning
    networks(None).bind("trainer", "tcp://0.0.0.0:*")
    networks(None).bind("publisher", "tcp://127.0.0.1:*")
    beyond, loopback = [e for e in logs if e["event"] == "unencrypted_bind"]
    assert beyond["log_level"] == "warning" and beyond["server"] == "trainer"
    assert beyond["address"] == "tcp://0.0.0.0:*" and beyond["risk"].startswith("anyone who can reach")
    assert "can join the run" in beyond["risk"] and "encrypted" in beyond["risk"]
    assert "cadence keys" in beyond["fix"] and "transport.keys" in beyond["fix"]
    assert loopback["server"] == "publisher" and loopback["risk"].startswith("any other user of this host")
    assert "transport.listen" in loopback["fix"]

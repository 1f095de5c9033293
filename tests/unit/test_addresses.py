"""What a server tells the others: its bound address, or the one they reach it at."""

from __future__ import annotations

import socket

from cadence.config import load_config
from cadence.launch.processes import advertised


def test_advertised_address_replaces_the_host_and_keeps_the_port() -> None:
    plain = load_config(None, [])
    assert advertised("tcp://127.0.0.1:5601", plain) == "tcp://127.0.0.1:5601"
    assert advertised("tcp://0.0.0.0:5601", plain) == f"tcp://{socket.gethostname()}:5601"
    nat = load_config(None, ["transport.advertise_host='203.0.113.7'"])
    assert advertised("tcp://0.0.0.0:5601", nat) == "tcp://203.0.113.7:5601"
    assert advertised("tcp://10.0.0.2:40123", nat) == "tcp://203.0.113.7:40123"
    assert advertised("inproc://trainer", nat) == "inproc://trainer"

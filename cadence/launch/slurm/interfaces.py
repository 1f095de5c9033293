"""Which address a node advertises: the IPv4 address of the interface that routes to a target (the
cluster's other nodes, the host the job came from), or of the interface the user named.

Invariant: never a loopback address and never a bare host name: no usable interface is a
`SlurmError` naming `--ifname`. Reading the machine's interfaces and routes is passed in, so the
choice is a pure function tested without a network.
"""

from __future__ import annotations

import fcntl
import ipaddress
import socket
import struct
from collections.abc import Callable, Mapping

from cadence.launch.slurm.allocation import SlurmError

_SIOCGIFADDR = 0x8915
_SIOCGIFFLAGS = 0x8913
_IFF_UP = 0x1


def interface_addresses() -> dict[str, str]:
    """Every interface that is up and has an IPv4 address, loopback left out: name ─► address."""
    found: dict[str, str] = {}
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for _, name in socket.if_nameindex():
            packed = struct.pack("256s", name.encode()[:15])
            try:
                flags = struct.unpack("H", fcntl.ioctl(s.fileno(), _SIOCGIFFLAGS, packed)[16:18])[0]
                address = socket.inet_ntoa(fcntl.ioctl(s.fileno(), _SIOCGIFADDR, packed)[20:24])
            except OSError:  # no IPv4 address
                continue
            if flags & _IFF_UP and not ipaddress.ip_address(address).is_loopback:
                found[name] = address
    return found


def source_address(target: str) -> str | None:
    """The local address the kernel sends from toward `target` (an address or a name), None when there
    is no route or the name does not resolve. Sends nothing."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((target, 9))
            return str(s.getsockname()[0])
    except OSError:
        return None


def choose_address(
    ifname: str,
    toward: list[str],
    interfaces: Callable[[], Mapping[str, str]] = interface_addresses,
    route: Callable[[str], str | None] = source_address,
) -> tuple[str, str]:
    """(interface, address) to advertise: `ifname`'s when given; else that of the interface the kernel
    routes the first reachable of `toward` through (loopback routes skipped); else the only one, or
    the first by name, of the interfaces that are up."""
    table = dict(interfaces())
    if ifname:
        if ifname not in table:
            known = ", ".join(sorted(table)) or "none"
            raise SlurmError(f"--ifname {ifname}: no such interface with an IPv4 address here (up: {known})")
        return ifname, table[ifname]
    by_address = {address: name for name, address in table.items()}
    for target in toward:
        local = route(target) if target else None
        if local is not None and local in by_address:
            return by_address[local], local
    if not table:
        raise SlurmError(
            f"no network interface with an IPv4 address beyond loopback on {socket.gethostname()}: name"
            " one with --ifname"
        )
    name = sorted(table)[0]
    return name, table[name]

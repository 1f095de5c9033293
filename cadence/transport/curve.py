"""The door of a keyed network's servers: CURVE encryption, a ZAP handler holding the authorized
client keys, and a `peer_refused` log event for every peer turned away.

Invariant: a keyed server socket is bound only after its context's ZAP handler is (libzmq lets every
CURVE client in while no handler is bound), and every refused handshake is counted in `refused` and
logged (a few a second; the count of the rest rides on the next one as `suppressed`).

Where a refusal's fields come from:

```
peer with a CURVE key the servers do not know ─► ZAP request (peer IP, its public key) ─► reply 400
    ─► peer_refused  channel  reason  address=IP  client_key=Z85
peer without keys, or holding another run's server.key ─► handshake fails before ZAP
    ─► monitor event HANDSHAKE_FAILED_PROTOCOL, or _NO_DETAIL when the peer without keys hangs up
       first ─► peer_refused  channel  reason  endpoint=ours
```

libzmq 4.3's monitor events (the only ones without its draft API) name the listening endpoint, not
the peer, so the second kind carries `endpoint` and no `address`.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable

import structlog
import zmq
import zmq.asyncio
from zmq.auth.asyncio import AsyncioAuthenticator
from zmq.utils import z85
from zmq.utils.monitor import parse_monitor_message

from cadence.log import Throttle
from cadence.transport.keys import AUTHORIZED, CurveKeys

log = structlog.get_logger()

_HANDSHAKE_REASONS: dict[int, str] = {
    zmq.PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH: "peer offers no CURVE key (no transport.keys?)",
    zmq.PROTOCOL_ERROR_ZMTP_CRYPTOGRAPHIC: "peer's handshake does not decrypt (another server.key?)",
}


class PeerRefusals:
    """Counts refused peers; logs a few a second."""

    def __init__(self, per_second: int = 5, clock: Callable[[], float] = time.monotonic) -> None:
        self.total = 0
        self._throttle = Throttle(per_second, clock)

    def refuse(self, channel: str, reason: str, **where: str) -> None:
        self.total += 1
        shown, held = self._throttle.allow()
        if not shown:
            return
        extra: dict[str, object] = {"suppressed": held} if held else {}
        log.warning(
            "peer_refused", channel=channel, reason=reason, **where, refused_total=self.total, **extra
        )


class _Zap(AsyncioAuthenticator):
    """pyzmq's ZAP handler on the actor's event loop, reporting each refusal with the peer's address."""

    def __init__(self, ctx: zmq.asyncio.Context, refusals: PeerRefusals) -> None:
        super().__init__(ctx)
        self.refusals = refusals
        self._request: list[bytes] = []

    async def handle_zap_message(self, msg: list[bytes]) -> None:
        self._request = msg  # requests are handled one at a time
        await super().handle_zap_message(msg)

    def _send_zap_reply(
        self, request_id: bytes, status_code: bytes, status_text: bytes, user_id: str = "anonymous"
    ) -> None:
        if status_code != b"200" and len(self._request) >= 6:
            domain, address = (f.decode("utf-8", "backslashreplace") for f in self._request[2:4])
            key = self._request[6] if len(self._request) > 6 else b""
            reason = status_text.decode("utf-8", "backslashreplace")
            if status_text == b"Unknown key":
                reason = f"client key not in {AUTHORIZED}/"
            where = {"address": address}
            if len(key) == 32:
                where["client_key"] = z85.encode(key).decode()
            self.refusals.refuse(domain, reason, **where)
        super()._send_zap_reply(request_id, status_code, status_text, user_id)


class CurveGate:
    """Makes the ROUTER sockets of one context CURVE servers that accept only authorized clients."""

    def __init__(self, ctx: zmq.asyncio.Context, keys: CurveKeys) -> None:
        self.ctx = ctx
        self.keys = keys
        self.refusals = PeerRefusals()
        self._zap: _Zap | None = None
        self._watches: dict[zmq.asyncio.Socket, tuple[zmq.asyncio.Socket, asyncio.Future[None]]] = {}

    @property
    def refused(self) -> int:
        return self.refusals.total

    def guard(self, sock: zmq.asyncio.Socket, channel: str) -> None:
        """Before `sock` binds: its server keys, the ZAP handler, and a watch on failed handshakes."""
        public, secret = self.keys.server_pair()
        if self._zap is None:
            self.keys.check_authorized()
            zap = _Zap(self.ctx, self.refusals)
            zap.start()
            self._zap = zap
        self._zap.configure_curve(domain=channel, location=str(self.keys.authorized))  # ZAP domain: channel
        sock.curve_secretkey = secret
        sock.curve_publickey = public
        sock.curve_server = True
        sock.zap_domain = channel.encode()
        monitor = sock.get_monitor_socket(
            zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
        )
        self._watches[sock] = (monitor, asyncio.ensure_future(self._watch(monitor, channel)))

    async def _watch(self, monitor: zmq.asyncio.Socket, channel: str) -> None:
        while True:
            event = parse_monitor_message(await monitor.recv_multipart())
            code = int(event["value"])
            if event["event"] == zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL:
                # what a peer without keys does when it sees the server's CURVE greeting first
                reason = (
                    f"peer left during the handshake ({os.strerror(code) if code else 'closed'}; no keys?)"
                )
            else:
                reason = _HANDSHAKE_REASONS.get(code, f"handshake protocol error {code:#x}")
            self.refusals.refuse(channel, reason, endpoint=event["endpoint"].decode())

    def release(self, sock: zmq.asyncio.Socket) -> None:
        """Stop watching `sock` (before it closes)."""
        watch = self._watches.pop(sock, None)
        if watch is None:
            return
        monitor, task = watch
        task.cancel()
        sock.disable_monitor()
        monitor.close(linger=0)

    def close(self) -> None:
        for sock in list(self._watches):
            self.release(sock)
        if self._zap is not None:
            self._zap.stop()
            self._zap = None

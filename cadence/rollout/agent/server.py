"""The worker's OpenAI-compatible endpoint for one batch of agent episodes, with aiohttp, on loopback
(a port the system picks) or on a Unix socket (`unix`: in a folder of its own, mode 0700, removed at
`close`): `POST /v1/chat/completions` and `GET /v1/models`. Each episode calls with a key of its own
(the client's `api_key`), valid from the episode's start until its end.

```
 Authorization: Bearer <key> ─► the episode being played under that key? else 401
 body ─► decode_request (else 400) ─► model served? (else 404) ─► EpisodeCalls.complete ─► 200 JSON
                                                                         stream: true ─► 200 events
 a refusal (401, 400, 404, 413, ...) ─► agent_call_refused logged (status, code, param, reason)
 anything else raised ─► logged with its traceback, 500 in OpenAI's error body
```

Invariant: the endpoint exists only while its batch is played, with the version the batch holds, and
serves a key only between `open` and `end`: a call after its episode (or the batch) ended cannot be
answered by any other version. Every failure is an OpenAI error body; none reaches the worker.
"""

from __future__ import annotations

import os
import secrets
import shutil
import tempfile
from typing import Any

import structlog
from aiohttp import web

from cadence.rollout.agent.calls import EpisodeCalls
from cadence.rollout.agent.chat import ApiError, decode_request, models
from cadence.rollout.agent.stream import chunks, send

log = structlog.get_logger()
MAX_BODY = 16 << 20
SOCKET_NAME = "endpoint.sock"
MAX_SOCKET_PATH = 100  # a Unix socket's path is at most 107 bytes on Linux


class Endpoint:
    """Serves the calls of the episodes opened on it, as `model`, on `host` (port chosen by the system),
    or with `unix` on a Unix socket (`socket`, its path, once started)."""

    def __init__(self, model: str, host: str = "127.0.0.1", unix: bool = False) -> None:
        self.model = model
        self.host = host
        self.unix = unix
        self.socket = ""
        self.episodes: dict[str, EpisodeCalls] = {}
        self.ended: set[str] = set()
        self.app = web.Application(middlewares=[self._errors], client_max_size=MAX_BODY)
        self.app.router.add_post("/v1/chat/completions", self._complete)
        self.app.router.add_get("/v1/models", self._models)
        self.runner: web.AppRunner | None = None
        self.base_url = ""

    async def start(self) -> str:
        """Listen; the base URL a client is given."""
        # a handler whose client left is cancelled; one still running at close is given a second
        self.runner = web.AppRunner(
            self.app, access_log=None, handler_cancellation=True, shutdown_timeout=1.0
        )
        await self.runner.setup()
        if self.unix:
            self.socket = os.path.join(_folder(), SOCKET_NAME)
            await web.UnixSite(self.runner, self.socket).start()
            self.base_url = "http://localhost/v1"
            return self.base_url
        site = web.TCPSite(self.runner, self.host, 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.base_url = f"http://{self.host}:{port}/v1"
        return self.base_url

    async def close(self) -> None:
        self.episodes.clear()
        if self.runner is not None:
            await self.runner.cleanup()
            self.runner = None
        if self.socket:
            shutil.rmtree(os.path.dirname(self.socket), ignore_errors=True)

    def open(self, calls: EpisodeCalls) -> str:
        """A new key, serving `calls` until `end`."""
        key = secrets.token_urlsafe(24)
        self.episodes[key] = calls
        return key

    def end(self, key: str) -> None:
        """No call of this key is answered from now on."""
        self.episodes.pop(key, None)
        self.ended.add(key)

    def _episode(self, request: web.Request) -> EpisodeCalls:
        key = request.headers.get("Authorization", "").removeprefix("Bearer ").strip()
        calls = self.episodes.get(key)
        if calls is not None:
            return calls
        why = "its episode has ended" if key in self.ended else "no episode being played holds it"
        raise ApiError(401, f"the API key is not served: {why}", param=None, code="invalid_api_key")

    async def _complete(self, request: web.Request) -> web.StreamResponse:
        calls = self._episode(request)
        chat, said = decode_request(await request.read())
        if chat.model != self.model:
            raise ApiError(
                404,
                f"the model {chat.model!r} does not exist: this endpoint serves {self.model!r}",
                param="model",
                code="model_not_found",
            )
        body = await calls.complete(chat, said)
        if chat.stream:  # made whole, so a refusal above is still one error body
            return await send(request, chunks(body, chat.usage_streamed))
        return web.json_response(body)

    async def _models(self, request: web.Request) -> web.Response:
        self._episode(request)
        return web.json_response(models(self.model))

    @web.middleware
    async def _errors(self, request: web.Request, handler: Any) -> web.StreamResponse:
        try:
            response: web.StreamResponse = await handler(request)
            return response
        except ApiError as refused:
            _refused(request, refused)
            return web.json_response(refused.body(), status=refused.status)
        except web.HTTPException as exc:  # no such route, wrong method, body too large
            http = ApiError(exc.status, exc.reason or "refused", code=str(exc.status))
            _refused(request, http)
            return web.json_response(http.body(), status=exc.status)
        except Exception as exc:
            log.warning(
                "agent_call_failed", path=request.path, error=f"{type(exc).__name__}: {exc}", exc_info=True
            )
            failed = ApiError(500, f"the call failed: {type(exc).__name__}: {exc}", kind="server_error")
            return web.json_response(failed.body(), status=500)


def _refused(request: web.Request, refused: ApiError) -> None:
    """Warn of a call the endpoint refused, with what it refused (throttled: `cadence.log.THROTTLED`)."""
    log.warning(
        "agent_call_refused",
        method=request.method,
        path=request.path[:200],
        status=refused.status,
        code=refused.code,
        param=refused.param,
        reason=refused.message[:500],
    )


def _folder() -> str:
    """A new folder only this user may enter (mode 0700), short enough for a socket's path."""
    base = tempfile.gettempdir()
    if len(base) + 40 > MAX_SOCKET_PATH:
        base = "/tmp"
    return tempfile.mkdtemp(prefix="cadence-agent-", dir=base)

"""An episode's environment on an event loop of its own, in a thread of its own, so that what an
environment does (a synchronous, CPU-heavy step; a `time.sleep`) never holds the worker's event loop:
its heartbeats, its session and the other episodes' steps go on.

```
 worker's loop                                   the episode's thread
   await EpisodeLoop.run(make) ─ run_coroutine_threadsafe ─► its loop: await make()
     (the runner's timeout bounds the wait here)            (a cancel reaches it once it awaits)
   close() ─ call_soon_threadsafe(stop) ─────────────────► loop ends, default executor shut down
```

Invariant: every call of one episode runs on the same loop, one after another (an environment may keep
loop-bound resources across its calls: a client session, a subprocess); a wait past its timeout is
given up on the worker's loop whatever the environment's code does. A blocking call cannot be
stopped: it holds its own episode's thread until it returns (the episode's later calls wait behind it,
each bounded by its own timeout), never another episode's and never the worker's loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Awaitable, Callable
from itertools import count
from typing import TypeVar

T = TypeVar("T")
_numbers = count()


class EpisodeLoop:
    """A daemon thread running an event loop for one episode's environment calls."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self._serve, name=f"environment-{next(_numbers)}", daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            self.loop.run_forever()
            self.loop.run_until_complete(self.loop.shutdown_asyncgens())
            self.loop.run_until_complete(self.loop.shutdown_default_executor())
        finally:
            self.loop.close()

    async def run(self, make: Callable[[], Awaitable[T]]) -> T:
        """`await make()` on the episode's loop, awaited from the caller's."""

        async def call() -> T:
            return await make()

        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(call(), self.loop))

    def close(self) -> None:
        """Stop the loop once what runs on it yields (the thread then ends by itself)."""
        with contextlib.suppress(RuntimeError):  # already closed
            self.loop.call_soon_threadsafe(self.loop.stop)

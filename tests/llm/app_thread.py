"""An aiohttp application served on 127.0.0.1 (a free port) from a background thread.

    with AppThread(app) as url:   # url = http://127.0.0.1:PORT
        ...

Its own event loop runs in the thread, so a synchronous test (or worker subprocesses) can
talk to it while the test body blocks.
"""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass, field

from aiohttp import web


@dataclass
class AppThread:
    app: web.Application
    url: str = ""
    _loop: asyncio.AbstractEventLoop | None = field(default=None, repr=False)
    _thread: threading.Thread | None = field(default=None, repr=False)

    def __enter__(self) -> str:
        ready = threading.Event()

        def main() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            runner = web.AppRunner(self.app, access_log=None)
            loop.run_until_complete(runner.setup())
            site = web.TCPSite(runner, "127.0.0.1", 0)
            loop.run_until_complete(site.start())
            self.url = f"http://127.0.0.1:{runner.addresses[0][1]}"
            ready.set()
            loop.run_forever()
            loop.run_until_complete(runner.cleanup())
            loop.close()

        self._thread = threading.Thread(target=main, daemon=True)
        self._thread.start()
        if not ready.wait(30):
            raise RuntimeError("the test HTTP server did not start within 30 s")
        return self.url

    def __exit__(self, *_: object) -> None:
        assert self._loop is not None and self._thread is not None
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

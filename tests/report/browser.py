"""Open a page in a real headless Chromium over the DevTools protocol: console errors, uncaught
exceptions, failed loads, images that did not decode, and a full-page screenshot.

Chromium is Debian's package (scripts/test.sh installs it as root). Each call starts its own
browser with a fresh profile and stops its process group.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--no-first-run", "--disable-sync", "--disable-dev-shm-usage",
         "--hide-scrollbars", "--remote-debugging-port=0", "--window-size=1280,1000")
IMAGES_LOADED = "JSON.stringify(Array.from(document.images).map(i => [i.getAttribute('src'), i.complete && i.naturalWidth > 0]))"


def chromium_binary() -> str | None:
    return next((found for name in ("chromium", "chromium-browser", "google-chrome") if (found := shutil.which(name))), None)


@dataclass
class PageCheck:
    errors: list[str] = field(default_factory=list)       # console errors, exceptions, failed loads
    images: dict[str, bool] = field(default_factory=dict)  # src -> decoded with a size
    title: str = ""


def check_page(page: Path, screenshot: Path, timeout_s: float = 90.0) -> PageCheck:
    binary = chromium_binary()
    assert binary, "chromium is not installed: run scripts/test.sh as root, or apt-get install chromium"
    profile = Path(tempfile.mkdtemp(prefix="chromium-profile-"))
    process = subprocess.Popen([binary, *FLAGS, f"--user-data-dir={profile}", "about:blank"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        port = _devtools_port(profile, process, timeout_s)
        return asyncio.run(asyncio.wait_for(_inspect(port, page, screenshot), timeout_s))
    finally:
        try:
            os.killpg(process.pid, signal.SIGTERM)
            process.wait(10)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(10)
        shutil.rmtree(profile, ignore_errors=True)


def _devtools_port(profile: Path, process: subprocess.Popen[bytes], timeout_s: float) -> int:
    marker = profile / "DevToolsActivePort"
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise AssertionError(f"chromium exited with {process.returncode} before it listened")
        if marker.exists() and marker.read_text().strip():
            return int(marker.read_text().splitlines()[0])
        time.sleep(0.05)
    raise AssertionError(f"chromium did not write {marker} within {timeout_s} s")


async def _inspect(port: int, page: Path, screenshot: Path) -> PageCheck:
    result = PageCheck()
    async with aiohttp.ClientSession() as http:
        async with http.get(f"http://127.0.0.1:{port}/json/list") as response:
            targets = await response.json()
        target = next(t for t in targets if t.get("type") == "page")
        async with http.ws_connect(target["webSocketDebuggerUrl"], max_msg_size=0) as socket:
            session = _Session(socket, result)
            for domain in ("Runtime", "Log", "Page"):
                await session.call(f"{domain}.enable")
            loaded = session.expect("Page.loadEventFired")
            await session.call("Page.navigate", url=page.resolve().as_uri())
            await loaded
            await asyncio.sleep(0.5)  # late console messages and image decodes
            evaluated = await session.call("Runtime.evaluate", expression=IMAGES_LOADED, returnByValue=True)
            result.images = dict(json.loads(evaluated["result"]["value"]))
            title = await session.call("Runtime.evaluate", expression="document.title", returnByValue=True)
            result.title = title["result"]["value"]
            metrics = await session.call("Page.getLayoutMetrics")
            size = metrics["cssContentSize"]
            shot = await session.call("Page.captureScreenshot", format="png", captureBeyondViewport=True,
                                      clip={"x": 0, "y": 0, "width": size["width"], "height": size["height"], "scale": 1})
            screenshot.write_bytes(base64.b64decode(shot["data"]))
            session.stop()
    return result


class _Session:
    """Commands with ids; events of interest collected as errors while waiting for answers."""

    def __init__(self, socket: aiohttp.ClientWebSocketResponse, result: PageCheck) -> None:
        self.socket, self.result = socket, result
        self.next_id = 0
        self.waiting: dict[int, asyncio.Future[Any]] = {}
        self.expected: dict[str, asyncio.Future[Any]] = {}
        self.reader = asyncio.get_running_loop().create_task(self._read())

    async def call(self, method: str, **params: Any) -> Any:
        self.next_id += 1
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self.waiting[self.next_id] = future
        await self.socket.send_json({"id": self.next_id, "method": method, "params": params})
        return await future

    def expect(self, method: str) -> asyncio.Future[Any]:
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self.expected[method] = future
        return future

    def stop(self) -> None:
        self.reader.cancel()

    async def _read(self) -> None:
        async for message in self.socket:
            data = json.loads(message.data)
            if "id" in data:
                future = self.waiting.pop(data["id"])
                if "error" in data:
                    future.set_exception(AssertionError(f"DevTools error: {data['error']}"))
                else:
                    future.set_result(data.get("result", {}))
                continue
            method, params = data.get("method"), data.get("params", {})
            if method in self.expected and not self.expected[method].done():
                self.expected[method].set_result(params)
            if method == "Runtime.exceptionThrown":
                details = params["exceptionDetails"]
                self.result.errors.append(f"uncaught: {details.get('exception', {}).get('description') or details.get('text')}")
            elif method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
                self.result.errors.append("console: " + " ".join(str(a.get("value", a.get("description"))) for a in params["args"]))
            elif method == "Log.entryAdded" and params["entry"].get("level") == "error":
                entry = params["entry"]
                self.result.errors.append(f"{entry.get('source')}: {entry.get('text')} {entry.get('url', '')}".strip())

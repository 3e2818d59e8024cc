"""What the viewtape-client tests share: waiting with a deadline, comparing a view with the
server's ``GET /views/{name}``, recording a view's events, and a fault-injecting TCP proxy."""

from __future__ import annotations

import asyncio
import re
import time
from typing import Any

import httpx

import viewtape


async def until(predicate: Any, what: str, seconds: float = 30.0) -> None:
    deadline = time.monotonic() + seconds
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.025)


async def matches_server(base: str, view: viewtape.View, name: str = "notes") -> None:
    """Waits until ``GET {base}/views/{name}`` is at the view's cursor; requires the same entries."""
    async with httpx.AsyncClient() as client:
        deadline = time.monotonic() + 30
        while True:
            server = (await client.get(f"{base}/views/{name}")).json()
            if server["cursor"] == view.cursor:
                break
            assert time.monotonic() < deadline, f"client at {view.cursor}, server at {server['cursor']}"
            await asyncio.sleep(0.05)
    assert dict(view.state) == server["entries"], f"client {dict(view.state)} != server {server['entries']}"


class Record:
    def __init__(self, view: viewtape.View) -> None:
        self.live: list[viewtape.Change] = []
        self.resets: list[Any] = []
        self.errors: list[viewtape.ViewError] = []
        self.swaps = 0
        view.on("change", lambda c: None if c.from_state else self.live.append(c))
        view.on("reset", self.resets.append)
        view.on("error", self.errors.append)
        view.on("synced", lambda _: setattr(self, "swaps", self.swaps + 1))

    def batches(self) -> list[int]:
        return [c.value["batch"] for c in self.live if not c.deleted]

    def applied_once(self) -> None:
        cursors = [c.cursor for c in self.live]
        assert len(cursors) == len(set(cursors)), "a cursor applied twice"


_RETRY = re.compile(rb"(?:^|\n)retry: ?(\d+)\r?\n")


async def sse_connections(base: str) -> int:
    """The server's count of open SSE streams (``viewtape_sse_connections`` on /metrics)."""
    async with httpx.AsyncClient() as client:
        text = (await client.get(f"{base}/metrics", timeout=10)).text
    line = next(line for line in text.splitlines() if line.startswith("viewtape_sse_connections "))
    return int(float(line.split()[1]))


async def until_server(base: str, predicate: Any, what: str, seconds: float = 10.0) -> None:
    """Waits until ``predicate(sse_connections)`` holds, polling the server's metrics."""
    deadline = time.monotonic() + seconds
    while not predicate(count := await sse_connections(base)):
        assert time.monotonic() < deadline, f"timed out waiting for {what} (the server counts {count} streams)"
        await asyncio.sleep(0.05)


class CuttingProxy:
    """A TCP proxy; each new connection takes the next fault from `plan` (else `pass`): `503`
    (Retry-After: 1), `cut` (cut in the middle of its first `event: update` frame), `strip-ids`
    (every `id:` field renamed `ix:`, same length, as a proxy that mangles SSE would), `buffer`
    (the response head, then nothing), `html` (a `200 text/html` login page of its own). Each
    request's time and mode go to `requests`, its request line to `lines`; each `retry:` hint a
    passed-through stream carried goes to `hints` as (its connection's index, ms)."""

    def __init__(self, target: str) -> None:
        self.host, port = target.split(":")
        self.port_to = int(port)
        self.plan: list[str] = []
        self.requests: list[tuple[float, str]] = []
        self.lines: list[str] = []
        self.hints: list[tuple[int, int]] = []
        self.writers: set[asyncio.StreamWriter] = set()

    async def start(self) -> str:
        self.server = await asyncio.start_server(self.accept, "127.0.0.1", 0)
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    def retarget(self, target: str) -> None:
        """New connections go to ``target`` (``host:port``), as a load balancer that moves a
        client to another node; open ones stay until ``drop_all``."""
        self.host, port = target.split(":")
        self.port_to = int(port)

    def drop_all(self) -> None:
        for writer in list(self.writers):
            writer.transport.abort()

    async def accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.writers.add(writer)
        mode = self.plan.pop(0) if self.plan else "pass"
        head = await reader.readuntil(b"\r\n\r\n")
        index = len(self.requests)
        self.requests.append((time.monotonic(), mode))
        self.lines.append(head.split(b"\r\n", 1)[0].decode("latin-1"))
        if mode == "html":
            body = b"<html>please log in</html>"
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Length: %d\r\n"
                         b"Connection: close\r\n\r\n%s" % (len(body), body))
            await writer.drain()
            writer.close()
            return
        if mode == "503":
            body = b'{"error":"unavailable","message":"later"}'
            writer.write(b"HTTP/1.1 503 Service Unavailable\r\nRetry-After: 1\r\nContent-Type: application/json\r\n"
                         b"Content-Length: %d\r\nConnection: close\r\n\r\n%s" % (len(body), body))
            await writer.drain()
            writer.close()
            return
        up_reader, up_writer = await asyncio.open_connection(self.host, self.port_to)
        self.writers.add(up_writer)
        up_writer.write(head)

        async def upstream() -> None:
            while data := await reader.read(65536):
                up_writer.write(data)
            up_writer.close()

        pump = asyncio.create_task(upstream())
        held = False
        try:
            while data := await up_reader.read(65536):
                if mode == "buffer":
                    if not held and (end := data.find(b"\r\n\r\n")) >= 0:
                        writer.write(data[: end + 4])
                        await writer.drain()
                        held = True
                    continue
                at = data.find(b"event: update") if mode == "cut" else -1
                if at >= 0:
                    writer.write(data[: at + 20])
                    await writer.drain()
                    writer.transport.abort()
                    up_writer.transport.abort()
                    return
                self.hints += [(index, int(ms)) for ms in _RETRY.findall(data)]
                if mode == "strip-ids":
                    data = data.replace(b"\nid:", b"\nix:")
                writer.write(data)
                await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            pump.cancel()
            writer.transport.abort()
            up_writer.transport.abort()

"""How a view ends, without a server: the view's requests are answered from a plan by an
``httpx.MockTransport`` (a stream of SSE frames, or an error status). Run with ``python3 -m pytest
clients/python/tests/test_view_end.py``.

A view the server retires (``event: retired``, no ``id:``, then the end of the stream) and a view
the server does not have (``404``, on the first connection or on a reconnection) close: status
``closed``, one fatal ``ViewError`` with a stable code, ``synced()`` raises it, ``changes()`` ends,
and no further request is made. A stream that merely ends is reconnected, in the same harness."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import viewtape  # noqa: E402

EPOCH = "00000000000000e1"


def frame(event: str, data: Any, cursor: str | None = None) -> str:
    """One SSE frame."""
    head = f"id: {cursor}\n" if cursor is not None else ""
    return f"{head}event: {event}\ndata: {json.dumps(data)}\n\n"


def synced(entries: dict[str, Any], cursor: str) -> list[str]:
    return [frame("state", {"key": k, "value": v}) for k, v in entries.items()] + [frame("synced", {}, cursor)]


class Scripted:
    """Answers the n-th request with ``plan[n]``: a list of frames (a ``200`` stream the server
    then ends), an ``int`` status (with the server's JSON error body), or, past the plan, a stream
    held open. ``urls`` records what was asked."""

    def __init__(self, plan: list[list[str] | int]) -> None:
        self.plan = plan
        self.urls: list[str] = []
        self.client = httpx.AsyncClient(transport=httpx.MockTransport(self.answer))

    async def answer(self, request: httpx.Request) -> httpx.Response:
        self.urls.append(str(request.url))
        step = self.plan[len(self.urls) - 1] if len(self.urls) <= len(self.plan) else None
        if isinstance(step, int):
            name = request.url.path.split("/")[2]
            return httpx.Response(step, json={"error": "not_found", "message": f"no view named {name}"})
        headers = {"content-type": "text/event-stream"}
        return httpx.Response(200, headers=headers, content=self.stream(step))

    @staticmethod
    async def stream(frames: list[str] | None) -> AsyncIterator[bytes]:
        yield b": open\n\n"
        if frames is None:
            await asyncio.Event().wait()  # held open until the view cancels it
        for f in frames or []:
            yield f.encode()


def opened(server: Scripted, name: str) -> viewtape.View:
    """View ``name`` on the scripted server, with backoff delays of 5..10 ms."""
    return viewtape.View("http://viewtape.test", name, client=server.client, min_delay=0.005, max_delay=0.01)


def recorded(view: viewtape.View) -> tuple[list[str], list[viewtape.ViewError]]:
    statuses: list[str] = []
    errors: list[viewtape.ViewError] = []
    view.on("status", statuses.append)
    view.on("error", errors.append)
    return statuses, errors


async def until_closed(view: viewtape.View) -> None:
    for _ in range(400):
        if view.status == "closed":
            return
        await asyncio.sleep(0.005)
    pytest.fail(f"the view did not close: {view.status}")


async def test_event_retired_closes_the_view_with_a_fatal_retired_error_and_no_reconnection() -> None:
    server = Scripted([
        [
            *synced({"AAPL": {"price": 1}}, f"{EPOCH}-1"),
            frame("update", {"key": "AAPL", "value": {"price": 2}}, f"{EPOCH}-2"),
            frame("retired", {"view": "prices", "reason": "runtime demo was deleted"}),
        ]
    ])
    async with server.client, opened(server, "prices") as view:
        statuses, errors = recorded(view)
        changes: list[viewtape.Change] = []

        async def iterate() -> None:
            async for change in view.changes():
                changes.append(change)

        iterating = asyncio.create_task(iterate())
        await until_closed(view)
        await asyncio.wait_for(iterating, 2)  # changes() ends with the view
        await asyncio.sleep(0.1)  # many backoff delays: a reconnection would have happened
        assert len(server.urls) == 1, server.urls
        assert statuses == ["syncing", "live", "closed"]
        assert [(e.code, e.fatal, e.reason) for e in errors] == [("retired", True, "runtime demo was deleted")]
        assert 'retired the view "prices": runtime demo was deleted' in errors[0].message
        assert view.error is errors[0]
        assert view.cursor == f"{EPOCH}-2" and dict(view.state) == {"AAPL": {"price": 2}}
        assert [(c.key, c.value) for c in changes if not c.from_state] == [("AAPL", {"price": 2})]
        with pytest.raises(viewtape.ViewError) as raised:
            await view.synced()
        assert raised.value is errors[0]


async def test_event_retired_before_synced_raises_from_a_waiting_synced_even_with_data_not_json() -> None:
    server = Scripted([[frame("state", {"key": "a", "value": 1}), "event: retired\ndata: gone\n\n"]])
    async with server.client, opened(server, "chat.room1") as view:
        _, errors = recorded(view)
        with pytest.raises(viewtape.ViewError) as raised:
            await asyncio.wait_for(view.synced(), 2)
        assert (raised.value.code, raised.value.reason) == ("retired", None)
        assert '"chat.room1"' in raised.value.message
        assert view.status == "closed"
        assert [e.code for e in errors] == ["retired"]
        assert dict(view.state) == {}, "a staged state is never swapped in without synced"
        await asyncio.sleep(0.05)
        assert len(server.urls) == 1


async def test_a_stream_that_just_ends_is_reconnected_from_its_cursor() -> None:
    """What ``retired`` prevents, in the same harness."""
    server = Scripted([synced({"AAPL": 1}, f"{EPOCH}-1")])
    async with server.client, opened(server, "prices") as view:
        statuses, errors = recorded(view)
        for _ in range(400):
            if len(server.urls) >= 2:
                break
            await asyncio.sleep(0.005)
        assert len(server.urls) == 2, server.urls
        assert server.urls[1].endswith(f"?cursor={EPOCH}-1")
        assert "closed" not in statuses
        assert all(not e.fatal for e in errors)


async def test_a_404_on_the_first_connection_closes_the_view_with_a_fatal_not_found() -> None:
    server = Scripted([404])
    async with server.client, opened(server, "nope") as view:
        statuses, errors = recorded(view)
        with pytest.raises(viewtape.ViewError) as raised:
            await asyncio.wait_for(view.synced(), 2)
        await asyncio.sleep(0.1)
        assert len(server.urls) == 1, server.urls
        assert view.status == "closed" and statuses == ["closed"]
        assert raised.value is errors[0]
        assert (raised.value.code, raised.value.status, raised.value.fatal) == ("not_found", 404, True)
        assert 'no view "nope" (404): no view named nope; not retrying' in raised.value.message


async def test_a_404_on_a_reconnection_closes_the_view_keeping_its_last_state() -> None:
    server = Scripted([synced({"k": "v"}, f"{EPOCH}-3"), 404])
    async with server.client, opened(server, "prices") as view:
        statuses, errors = recorded(view)
        await until_closed(view)
        await asyncio.sleep(0.1)
        assert len(server.urls) == 2, server.urls
        assert server.urls[1].endswith(f"?cursor={EPOCH}-3")
        assert statuses == ["syncing", "live", "reconnecting", "closed"]
        assert [(e.code, e.fatal) for e in errors] == [("not_found", True)]
        assert view.error is errors[-1]
        assert dict(view.state) == {"k": "v"}

"""viewtape-client against the real server, faults injected. Run by tests/tests/clients.rs as
``python3 clients/python/tests/test_client.py <base-url>`` (the demo ticker and the ``misbehave``
fixture configured, a pinned port); the tests ask the driver to ``kill9-restart`` and
``kill9-wipe-restart`` the server by printing control lines. Batches go to ``fixture`` as
``publish notes k<i mod 5> {"batch": i}``, so the view's live changes name every batch published.
After every scenario the view's dict equals ``GET /views/notes`` at the same cursor. Then: leaving
``async with`` ends the view's tasks and its stream (the server's ``viewtape_sse_connections``
drops); a stream's ``retry:`` hint is the floor of the one reconnection after it; ``keys``
narrow the view (its dict equals ``GET /views/notes?keys=`` at the same cursor), and ``keys``
with ``prefix``, which the server refuses with 400, close it with a fatal error, no retry."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import viewtape  # noqa: E402
from support import CuttingProxy, Record, matches_server, until, until_server  # noqa: E402

BASE = os.environ.get("VIEWTAPE_URL", "")
FAST: dict[str, Any] = {"min_delay": 0.1, "max_delay": 1.0}


async def control(command: str) -> None:
    print(f"\n@@ctl {command}", flush=True)
    reply = await asyncio.to_thread(sys.stdin.readline)
    assert reply.startswith("ok"), f"{command}: {reply!r}"


def batch(i: int) -> str:
    return f"publish notes k{i % 5} {json.dumps({'batch': i})}\n"


class LossyTransport(httpx.AsyncBaseTransport):
    """Forwards to the real server; the answers to `drop` requests are read, then lost: the
    batch committed, the producer sees a timeout and must retry."""

    def __init__(self) -> None:
        self.inner = httpx.AsyncHTTPTransport()
        self.drop = 0

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        response = await self.inner.handle_async_request(request)
        if self.drop > 0:
            self.drop -= 1
            await response.aread()
            raise httpx.ReadTimeout("the answer was lost", request=request)
        return response


async def test_kill9_twice_and_a_producer_through_lost_answers(tmp_path: Path) -> None:
    store = viewtape.FileStore(tmp_path)
    lossy = LossyTransport()
    retries: list[str] = []
    async with viewtape.View(BASE, "notes", cursor_store=store, **FAST) as view, httpx.AsyncClient(transport=lossy) as client:
        record = Record(view)
        await view.synced()
        async with viewtape.Producer(BASE, "fixture", producer_id="py-a", store=store, client=client,
                                     timeout=3, on_retry=lambda s, r: retries.append(r), **FAST) as producer:
            receipts: list[dict[str, Any]] = []

            async def sending() -> None:
                for i in range(45):
                    if i % 15 == 7:
                        lossy.drop += 1
                    receipts.append(await producer.send(batch(i)))

            task = asyncio.create_task(sending())
            await until(lambda: len(receipts) >= 15, "15 receipts")
            await control("kill9-restart")
            await until(lambda: len(receipts) >= 30, "30 receipts")
            await control("kill9-restart")
            await task
        await matches_server(BASE, view)
        assert record.resets == []
        record.applied_once()
        assert record.batches() == list(range(45))
        assert [r["seq"] for r in receipts] == list(range(45))
        assert sum(r["duplicate"] for r in receipts) >= 3, receipts
        assert any("lost" in r for r in retries)
        cursor = view.cursor

    # A restart of this process: the file store resumes it with no state transfer.
    async with viewtape.View(BASE, "notes", cursor_store=store, **FAST) as again:
        record = Record(again)
        await again.synced()
        assert again.cursor == cursor and len(again.state) == 5
        async with viewtape.Producer(BASE, "fixture", producer_id="py-a", store=store) as producer:
            for i in range(45, 48):
                await producer.send(batch(i))
        await matches_server(BASE, again)
        assert record.swaps == 0 and record.resets == []
        assert record.batches() == [45, 46, 47]


async def test_data_dir_deleted_between_lives(tmp_path: Path) -> None:
    gaps: list[tuple[int, int]] = []
    async with viewtape.View(BASE, "notes", cursor_store=viewtape.FileStore(tmp_path), **FAST) as view, \
            viewtape.Producer(BASE, "fixture", producer_id="py-b", store=viewtape.FileStore(tmp_path),
                              on_gap=lambda s, e: gaps.append((s, e)), **FAST) as producer:
        record = Record(view)
        for i in range(8):
            await producer.send(batch(i))
        await matches_server(BASE, view)
        await control("kill9-wipe-restart")
        seqs = [(await producer.send(batch(i)))["seq"] for i in range(100, 103)]
        await matches_server(BASE, view)
        assert len(record.resets) == 1, record.resets
        assert record.resets[0]["reason"] in ("stale_epoch", "ahead", "expired")
        assert sorted(view.state) == ["k0", "k1", "k2"]
        assert gaps == [(8, 0)] and seqs == [0, 1, 2]
        record.applied_once()


async def test_through_a_faulty_proxy() -> None:
    proxy = CuttingProxy(BASE.removeprefix("http://"))
    url = await proxy.start()
    proxy.plan = ["503"]
    async with viewtape.View(url, "notes", first_byte_timeout=1.0, **FAST) as view, \
            viewtape.Producer(BASE, "fixture", producer_id="py-c") as producer:
        record = Record(view)
        await view.synced()
        (refused, _), (retried, _) = proxy.requests[:2]
        assert retried - refused >= 1.0, "Retry-After honoured"
        assert record.errors[0].status == 503
        proxy.plan = ["cut"]
        proxy.drop_all()
        await until(lambda: len(proxy.requests) >= 3, "a reconnection through the cutting proxy")
        for i in range(6):
            await producer.send(batch(i))
        await matches_server(BASE, view)
        assert any(e.code == "network" for e in record.errors)

        # Ids stripped: httpx-sse repeats the last id on an event without one; the client must
        # not take that for a replayed event (and skip it), but refuse it and reconnect.
        proxy.plan = ["strip-ids"]
        stripped = len(proxy.requests)
        proxy.drop_all()
        await until(lambda: len(proxy.requests) > stripped, "a reconnection through the id-stripping proxy")
        for i in range(6, 9):
            await producer.send(batch(i))
        await until(lambda: any(e.code == "missing_id" for e in record.errors), "missing_id")
        await matches_server(BASE, view)

        # A buffering proxy, then a login page again and again: each is named, then the guard.
        proxy.plan = ["buffer"]
        proxy.drop_all()
        await until(lambda: any(e.code == "stream_buffered" for e in record.errors), "stream_buffered")
        proxy.plan = ["html"] * 6
        proxy.drop_all()
        await until(lambda: any(e.code == "fast_retry_loop" for e in record.errors), "fast_retry_loop")
        assert any(e.code == "bad_content_type" for e in record.errors)
        for i in range(9, 11):
            await producer.send(batch(i))
        await matches_server(BASE, view)
        assert record.resets == []
        record.applied_once()
        assert record.batches() == list(range(11))
    proxy.server.close()


async def ingest(i: int) -> None:
    async with httpx.AsyncClient() as client:
        response = await client.post(f"{BASE}/runtimes/fixture/ingest", content=batch(i), timeout=10)
        assert response.status_code == 200, response.text


async def server_cursor() -> str:
    async with httpx.AsyncClient() as client:
        return str((await client.get(f"{BASE}/views/notes", timeout=10)).json()["cursor"])


async def test_closing_a_view_releases_its_connection_and_cancels_its_tasks() -> None:
    await until_server(BASE, lambda n: n == 0, "no stream open before the test")
    saves: list[str] = []

    class Recording(viewtape.MemoryStore):
        async def save(self, key: str, value: Any) -> None:
            saves.append(value["cursor"])
            await super().save(key, value)

    before = asyncio.all_tasks()
    fired: list[str] = []
    seen: list[viewtape.Change] = []
    # save_interval 60 s: at exit a write-behind task is still sleeping.
    async with viewtape.View(BASE, "notes", cursor_store=Recording(), save_interval=60, **FAST) as view:
        for event in ("change", "status", "error", "synced", "reset"):
            view.on(event, lambda _, event=event: fired.append(event))

        async def consume() -> None:
            async for change in view.changes():
                seen.append(change)

        consumer = asyncio.create_task(consume())
        await asyncio.wait_for(view.synced(), 30)
        await ingest(0)
        head = await server_cursor()
        await until(lambda: view.cursor == head, "the batch applied")
        await until_server(BASE, lambda n: n == 1, "the server to count the view's stream")
        run, save = view._task, view._save_task
        assert run is not None and not run.done(), "the connection task runs"
        assert save is not None and not save.done(), "a write-behind is pending"
        cursor = view.cursor
    # The context has exited: the tasks are over, the last position written, the stream closed.
    assert run.done() and save.done(), f"tasks left running: run {run}, save {save}"
    await asyncio.wait_for(consumer, 2)  # changes() ended
    left = asyncio.all_tasks() - before
    assert not left, f"tasks left after the view closed: {left}"
    assert view.status == "closed"
    assert saves and saves[-1] == cursor, f"the last position written at close: {saves} vs {cursor}"
    await until_server(BASE, lambda n: n == 0, "the server to count the stream closed", seconds=5)
    # The server goes on; nothing reaches the closed view.
    count, changes = len(fired), len(seen)
    for i in range(1, 4):
        await ingest(i)
    assert await server_cursor() != cursor
    await asyncio.sleep(0.5)
    assert len(fired) == count and len(seen) == changes, f"fired after close: {fired[count:]}"
    assert view.cursor == cursor


async def test_a_retry_hint_is_the_floor_of_the_next_reconnection_only() -> None:
    proxy = CuttingProxy(BASE.removeprefix("http://"))
    url = await proxy.start()
    # max_delay 0.4: without a hint, no attempt waits more than 0.4 s.
    async with viewtape.View(url, "notes", min_delay=0.1, max_delay=0.4) as view:
        record = Record(view)
        await asyncio.wait_for(view.synced(), 30)
        await until(lambda: bool(proxy.hints), "the stream's retry: hint")
        hint = proxy.hints[-1][1] / 1000
        assert hint >= 1.5, f"the server hints {hint} s (its default [server] retry is 2 s); this test needs >= 1.5 s"
        # The stream is cut; then three answers that are no stream (no hint), then a stream.
        proxy.plan = ["html", "html", "html", "pass"]
        cut = time.monotonic()
        proxy.drop_all()
        await until(lambda: len(proxy.requests) >= 5, "four reconnections")
        await asyncio.wait_for(view.synced(), 30)
        at = [t for t, _ in proxy.requests]
        assert at[1] - cut >= hint - 0.02, f"the first reconnection waited {at[1] - cut:.3f} s < the hint {hint} s"
        gaps = [at[i] - at[i - 1] for i in range(2, 5)]
        assert all(g < hint - 0.5 for g in gaps), f"the hint was used once; later gaps {gaps}"
        assert sum(e.code == "bad_content_type" for e in record.errors) == 3
    proxy.server.close()


async def test_a_producer_without_a_store_run_twice_publishes_both_runs() -> None:
    epochs = []
    for run in (0, 1):
        async with viewtape.Producer(BASE, "fixture", producer_id="py-twice", **FAST) as producer:
            line = f"publish notes twice-{run} {json.dumps({'batch': 1000 + run})}\n"
            receipt = await producer.send(line)
            assert not receipt["duplicate"] and receipt["seq"] == 0, receipt
            epochs.append(producer.epoch)
    assert epochs[1] > epochs[0], f"the second run claimed a newer epoch: {epochs}"
    async with httpx.AsyncClient() as client:
        notes = (await client.get(f"{BASE}/views/notes", timeout=10)).json()
    for run in (0, 1):
        assert notes["entries"][f"twice-{run}"]["batch"] == 1000 + run, notes["entries"]


async def test_keys_narrow_a_view_to_those_keys() -> None:
    async with viewtape.View(BASE, "notes", keys=["k1", "k3"], **FAST) as view, \
            viewtape.Producer(BASE, "fixture", producer_id="py-k", **FAST) as producer:
        record = Record(view)
        await asyncio.wait_for(view.synced(), 30)
        # Batches over k0..k4; the last one is k1's, so the narrowed cursor reaches the head.
        for i in range(12):
            await producer.send(batch(i))
        await matches_server(BASE, view, "notes?keys=k1,k3")
        assert {c.key for c in record.live} == {"k1", "k3"}, [c.key for c in record.live]
        assert set(view.state) <= {"k1", "k3"}, dict(view.state)
        record.applied_once()


async def test_keys_and_prefix_together_refused_with_400_close_the_view_without_retrying() -> None:
    proxy = CuttingProxy(BASE.removeprefix("http://"))
    url = await proxy.start()
    async with viewtape.View(url, "notes", keys=["k1", "k2"], prefix="k", after=1, **FAST) as view:
        with pytest.raises(viewtape.ViewError) as refused:
            await asyncio.wait_for(view.synced(), 10)
        assert proxy.lines[0] == "GET /views/notes/events?keys=k1%2Ck2&prefix=k&after=1 HTTP/1.1", proxy.lines[0]
        error = refused.value
        assert (error.code, error.status, error.fatal) == ("bad_request", 400, True), error
        assert "keys" in str(error), error
        assert view.status == "closed"
        await asyncio.sleep(1.5)  # min_delay 0.1: a view that retried would have asked again by now
        assert len(proxy.requests) == 1, proxy.lines
    proxy.server.close()


async def test_an_empty_batch_is_refused_without_taking_a_seq() -> None:
    """The server refuses an empty batch (400): the producer refuses it first, taking no seq, so
    the next batch goes out as if it had never been asked for (seq 0 of a fresh producer)."""
    async with viewtape.Producer(BASE, "fixture", producer_id="py-empty", **FAST) as producer:
        for empty in ([], "", b""):
            with pytest.raises(viewtape.ProducerError) as refused:
                await producer.send(empty)
            assert refused.value.code == "rejected", refused.value
        receipt = await producer.send(batch(0))
        assert receipt["events"] == {"notes": 1}, receipt


if __name__ == "__main__":
    os.environ["VIEWTAPE_URL"] = sys.argv[1]
    sys.exit(pytest.main([__file__, "-s", "-v", "-p", "no:cacheprovider", "-o", "asyncio_mode=auto"]))

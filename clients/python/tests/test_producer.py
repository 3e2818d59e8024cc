"""The idempotent producer with no viewtape server: an ``httpx.MockTransport`` that answers as the
server's producer contract does (``POST /runtimes/{runtime}/producers/{id}`` claims the next
epoch; ingest commits seq last + 1, answers a resent seq with its original receipt, a seq reused
for another body with ``409 producer_seq_reused``, a seq past the next with
``409 producer_out_of_order``, an older epoch with ``403 producer_fenced``), with answers that can
be replaced one request at a time. Run with ``python3 -m pytest clients/python/tests/test_producer.py``."""

from __future__ import annotations

import asyncio
import sys
import time
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import viewtape  # noqa: E402

BASE = "http://viewtape.test"
FAST: dict[str, Any] = {"min_delay": 0.001, "max_delay": 0.005}

Planned = httpx.Response | Callable[[httpx.Request], httpx.Response | None] | Exception


def answer(status: int, body: dict[str, Any], **headers: str) -> httpx.Response:
    return httpx.Response(status, json=body, headers={k.replace("_", "-"): v for k, v in headers.items()})


@dataclass
class Known:
    epoch: int
    last: int = -1
    bodies: dict[int, bytes] = field(default_factory=dict)
    receipts: dict[int, dict[str, Any]] = field(default_factory=dict)


class FakeServer:
    """The server's side of the producer contract, in memory. ``requests`` records every request;
    ``plan`` holds answers (a response, an exception to raise, or a function of the request
    returning a response or None for the model's) that replace the model's, in order."""

    def __init__(self) -> None:
        self.requests: list[httpx.Request] = []
        self.plan: list[Planned] = []
        self.producers: dict[str, Known] = {}
        self.published: list[bytes] = []
        self.transport = httpx.MockTransport(self.handle)

    def client(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(transport=self.transport)

    def claims(self) -> list[httpx.Request]:
        return [r for r in self.requests if "/producers/" in r.url.raw_path.decode()]

    def batches(self) -> list[httpx.Request]:
        return [r for r in self.requests if r.url.path.endswith("/ingest")]

    def handle(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        if self.plan:
            planned = self.plan.pop(0)
            if isinstance(planned, Exception):
                raise planned
            replaced = planned(request) if callable(planned) else planned
            if replaced is not None:
                return replaced
        parts = request.url.raw_path.decode().split("/")
        if len(parts) == 5 and parts[1] == "runtimes" and parts[3] == "producers":
            return self.claim(f"{urllib.parse.unquote(parts[2])}/{urllib.parse.unquote(parts[4])}")
        if len(parts) == 4 and parts[1] == "runtimes" and parts[3] == "ingest":
            return self.ingest(urllib.parse.unquote(parts[2]), request)
        return answer(404, {"error": "not_found", "message": "no such path"})

    def claim(self, key: str) -> httpx.Response:
        known = self.producers.get(key)
        epoch = known.epoch + 1 if known else 1
        self.producers[key] = Known(epoch)
        return answer(200, {"producer": key.split("/", 1)[1], "epoch": epoch, "seq": 0, "position": None, "durability": None})

    def ingest(self, runtime: str, request: httpx.Request) -> httpx.Response:
        key = f"{runtime}/{request.headers['producer-id']}"
        epoch, seq = int(request.headers["producer-epoch"]), int(request.headers["producer-seq"])
        body = request.content
        known = self.producers.get(key)
        if known is None or epoch > known.epoch:
            known = self.producers[key] = Known(epoch)
        if epoch < known.epoch:
            return answer(403, {"error": "producer_fenced", "message": "fenced"})
        following = known.last + 1
        if seq < following:
            if known.bodies.get(seq) != body:
                return answer(409, {"error": "producer_seq_reused", "message": "reused", "next_seq": following},
                              producer_expected_seq=str(following))
            return answer(200, known.receipts[seq], producer_duplicate="true")
        if seq > following:
            return answer(409, {"error": "producer_out_of_order", "message": "out of order", "next_seq": following},
                          producer_expected_seq=str(following))
        self.published.append(body)
        receipt = {"events": {"prices": 1}, "gaps": [], "position": len(self.published), "durability": "fsync"}
        known.last = seq
        known.bodies[seq] = body
        known.receipts[seq] = receipt
        return answer(200, receipt)


class RecordingStore(viewtape.MemoryStore):
    """A memory store that records every value saved, in order."""

    def __init__(self) -> None:
        super().__init__()
        self.saves: list[Any] = []

    async def save(self, key: str, value: Any) -> None:
        self.saves.append(value)
        await super().save(key, value)


def headers_of(requests: list[httpx.Request], name: str) -> list[str]:
    return [r.headers[name] for r in requests]


async def test_a_run_without_a_store_claims_a_new_epoch_so_a_second_run_publishes_its_batches() -> None:
    """Guards against a second run without a store starting again at epoch 0 / seq 0: the server
    took its first batches for the first run's duplicates and never published them."""
    server = FakeServer()
    async with server.client() as client:
        async with viewtape.Producer(BASE, "demo", producer_id="p1", client=client, **FAST) as first:
            await first.send(['{"run":1}'])
        async with viewtape.Producer(BASE, "demo", producer_id="p1", client=client, **FAST) as second:
            receipt = await second.send(['{"run":2}'])
            assert (second.epoch, second.next_seq) == (2, 1)
    assert receipt["duplicate"] is False
    assert server.published == [b'{"run":1}\n', b'{"run":2}\n']
    assert [(r.method, r.url.path) for r in server.requests] == [
        ("POST", "/runtimes/demo/producers/p1"),
        ("POST", "/runtimes/demo/ingest"),
        ("POST", "/runtimes/demo/producers/p1"),
        ("POST", "/runtimes/demo/ingest"),
    ]
    batches = server.batches()
    assert list(zip(headers_of(batches, "producer-epoch"), headers_of(batches, "producer-seq"))) == [("1", "0"), ("2", "0")]


async def test_the_claim_goes_first_with_the_token_and_the_claimed_epoch_is_stored_before_the_batch() -> None:
    server = FakeServer()
    server.producers["demo/feed/1?a#b"] = Known(6, last=40)
    store = RecordingStore()
    async with server.client() as client, viewtape.Producer(
        BASE, "demo", producer_id="feed/1?a#b", token="ingest-token", store=store, client=client, **FAST
    ) as producer:
        receipt = await producer.send(b"x\n")
    claim, batch = server.requests
    assert claim.url.raw_path == b"/runtimes/demo/producers/feed%2F1%3Fa%23b"
    assert claim.method == "POST" and claim.content == b""
    assert claim.headers["authorization"] == "Bearer ingest-token"
    assert (batch.headers["producer-epoch"], batch.headers["producer-seq"]) == ("7", "0")
    assert batch.headers["authorization"] == "Bearer ingest-token"
    assert (receipt["epoch"], receipt["seq"], receipt["duplicate"]) == (7, 0, False)
    assert store.saves[0] == {"epoch": 7, "nextSeq": 0}
    assert store.saves[1]["pending"]["seq"] == 0 and store.saves[2] == {"epoch": 7, "nextSeq": 1}


async def test_ready_claims_the_epoch_and_later_sends_claim_none() -> None:
    server = FakeServer()
    async with server.client() as client, viewtape.Producer(BASE, "demo", producer_id="p1", client=client, **FAST) as producer:
        assert await producer.ready() is None
        assert producer.epoch == 1 and server.batches() == []
        await producer.send("x\n")
        await producer.send("y\n")
    assert len(server.claims()) == 1


async def test_an_explicit_epoch_claims_nothing() -> None:
    server = FakeServer()
    async with server.client() as client, viewtape.Producer(BASE, "demo", producer_id="p1", epoch=3, client=client, **FAST) as producer:
        receipt = await producer.send("x\n")
    assert server.claims() == []
    assert headers_of(server.batches(), "producer-epoch") == ["3"]
    assert (receipt["epoch"], receipt["seq"]) == (3, 0)


async def test_a_stored_position_claims_nothing_and_resumes() -> None:
    server = FakeServer()
    server.producers["demo/p1"] = Known(4, last=8)
    store = viewtape.MemoryStore()
    await store.save("demo/p1", {"epoch": 4, "nextSeq": 9})
    async with server.client() as client, viewtape.Producer(BASE, "demo", producer_id="p1", store=store, client=client, **FAST) as producer:
        receipt = await producer.send("x\n")
    assert server.claims() == []
    assert (receipt["epoch"], receipt["seq"], receipt["duplicate"]) == (4, 9, False)
    assert await store.load("demo/p1") == {"epoch": 4, "nextSeq": 10}


async def test_a_claim_answered_503_waits_out_retry_after_and_a_lost_answer_is_claimed_again() -> None:
    server = FakeServer()
    server.plan = [
        answer(503, {"error": "unavailable", "message": "later"}, retry_after="0.2"),
        httpx.ReadTimeout("the answer was lost"),
    ]
    retries: list[tuple[int, str]] = []
    started = time.monotonic()
    async with server.client() as client, viewtape.Producer(
        BASE, "demo", producer_id="p1", client=client, on_retry=lambda s, r: retries.append((s, r)), **FAST
    ) as producer:
        receipt = await producer.send("x\n")
    assert time.monotonic() - started >= 0.2, "Retry-After honoured"
    assert len(server.claims()) == 3
    assert [(s, r.split(":")[0]) for s, r in retries] == [(0, "epoch claim"), (0, "epoch claim")]
    assert "status 503" in retries[0][1] and "ReadTimeout" in retries[1][1]
    assert receipt["epoch"] == 1


async def test_a_claim_refused_for_the_token_asks_again_and_an_unknown_runtime_fails_plainly() -> None:
    server = FakeServer()
    server.plan = [lambda r: None if r.headers["authorization"] == "Bearer good" else answer(403, {"error": "forbidden", "message": "no"})]
    tokens = ["view-only", "good"]
    async with server.client() as client, viewtape.Producer(
        BASE, "demo", producer_id="p1", token=lambda: tokens.pop(0), client=client, **FAST
    ) as producer:
        await producer.send("x\n")
    assert headers_of(server.claims(), "authorization") == ["Bearer view-only", "Bearer good"]

    missing = FakeServer()
    missing.plan = [answer(404, {"error": "not_found", "message": "no runtime nope"})]
    async with missing.client() as client, viewtape.Producer(BASE, "nope", producer_id="p1", client=client, **FAST) as lost:
        with pytest.raises(viewtape.ProducerError) as raised:
            await lost.send("x\n")
    assert (raised.value.code, raised.value.status) == ("rejected", 404)
    assert missing.batches() == []


async def test_close_during_a_claim_that_keeps_failing_ends_it_with_closed() -> None:
    server = FakeServer()
    server.plan = [answer(503, {"error": "unavailable", "message": "later"}) for _ in range(1000)]
    client = server.client()
    producer = viewtape.Producer(BASE, "demo", producer_id="p1", client=client, **FAST)
    sending = asyncio.create_task(producer.send("x\n"))
    for _ in range(1000):
        if len(server.requests) >= 3:
            break
        await asyncio.sleep(0.001)
    await producer.close()
    with pytest.raises(viewtape.ProducerError) as raised:
        await asyncio.wait_for(sending, 5)
    assert raised.value.code == "closed"
    assert server.batches() == []
    await client.aclose()


async def test_a_duplicate_is_a_success_with_the_original_receipt() -> None:
    server = FakeServer()

    def commit_then_lose(request: httpx.Request) -> httpx.Response:
        server.handle(request)
        raise httpx.ReadTimeout("the answer was lost", request=request)

    async with server.client() as client, viewtape.Producer(BASE, "demo", producer_id="p1", client=client, **FAST) as producer:
        original = await producer.send("x\n")
        server.plan = [commit_then_lose]
        retried = await producer.send("y\n")
    assert original["duplicate"] is False
    assert (retried["seq"], retried["duplicate"], retried["position"]) == (1, True, 2)
    assert server.published == [b"x\n", b"y\n"]


async def test_409_producer_seq_reused_raises_seq_reused_without_renumbering_and_keeps_the_batch_pending() -> None:
    """Guards against a seq the server committed for another body being renumbered or taken for
    a success: the batch was not published."""
    server = FakeServer()
    server.producers["demo/p1"] = Known(3, last=4, bodies={2: b"another\n"})
    store = viewtape.MemoryStore()
    await store.save("demo/p1", {"epoch": 3, "nextSeq": 2})
    gaps: list[tuple[int, int]] = []
    async with server.client() as client, viewtape.Producer(
        BASE, "demo", producer_id="p1", store=store, client=client, on_gap=lambda s, e: gaps.append((s, e)), **FAST
    ) as producer:
        with pytest.raises(viewtape.ProducerError) as raised:
            await producer.send("mine\n")
    assert (raised.value.code, raised.value.status, raised.value.expected_seq) == ("seq_reused", 409, 5)
    assert len(server.batches()) == 1 and gaps == [] and server.published == []
    saved = await store.load("demo/p1")
    assert saved is not None
    assert (saved["epoch"], saved["nextSeq"], saved["pending"]["seq"]) == (3, 2, 2)


async def test_the_body_error_code_decides_seq_reused_with_a_lower_expected_seq_is_not_renumbered() -> None:
    server = FakeServer()
    server.plan = [answer(409, {"error": "producer_seq_reused", "message": "reused", "next_seq": 3}, producer_expected_seq="3")]
    store = viewtape.MemoryStore()
    await store.save("demo/p1", {"epoch": 2, "nextSeq": 5})
    gaps: list[tuple[int, int]] = []
    async with server.client() as client, viewtape.Producer(
        BASE, "demo", producer_id="p1", store=store, client=client, on_gap=lambda s, e: gaps.append((s, e)), **FAST
    ) as producer:
        with pytest.raises(viewtape.ProducerError) as raised:
            await producer.send("x\n")
    assert (raised.value.code, raised.value.expected_seq) == ("seq_reused", 3)
    assert gaps == [] and len(server.batches()) == 1


async def test_409_producer_seq_stale_raises_seq_stale() -> None:
    server = FakeServer()
    server.plan = [answer(409, {"error": "producer_seq_stale", "message": "stale", "next_seq": 900}, producer_expected_seq="900")]
    async with server.client() as client, viewtape.Producer(BASE, "demo", producer_id="p1", epoch=2, client=client, **FAST) as producer:
        with pytest.raises(viewtape.ProducerError) as raised:
            await producer.send("x\n")
    assert (raised.value.code, raised.value.status, raised.value.expected_seq) == ("seq_stale", 409, 900)
    assert len(server.batches()) == 1


async def test_409_producer_out_of_order_renumbers_as_before() -> None:
    server = FakeServer()
    store = viewtape.MemoryStore()
    await store.save("demo/p1", {"epoch": 5, "nextSeq": 7})
    gaps: list[tuple[int, int]] = []
    async with server.client() as client:
        async with viewtape.Producer(BASE, "demo", producer_id="p1", store=store, client=client,
                                     on_gap=lambda s, e: gaps.append((s, e)), **FAST) as producer:
            receipt = await producer.send("x\n")
        assert gaps == [(7, 0)]
        assert headers_of(server.batches(), "producer-seq") == ["7", "0"]
        assert (receipt["epoch"], receipt["seq"]) == (5, 0)

        server.plan = [answer(409, {"error": "producer_out_of_order", "message": "ahead", "next_seq": 0}, producer_expected_seq="0")]
        async with viewtape.Producer(BASE, "demo", producer_id="p2", epoch=5, renumber=False, client=client, **FAST) as strict:
            with pytest.raises(viewtape.ProducerError) as raised:
                await strict.send("y\n")
        assert (raised.value.code, raised.value.expected_seq) == ("out_of_order", 0)


async def test_an_older_epoch_is_fenced() -> None:
    server = FakeServer()
    server.producers["demo/p1"] = Known(9)
    async with server.client() as client, viewtape.Producer(BASE, "demo", producer_id="p1", epoch=8, client=client, **FAST) as producer:
        with pytest.raises(viewtape.ProducerError) as raised:
            await producer.send("x\n")
    assert (raised.value.code, raised.value.status) == ("fenced", 403)

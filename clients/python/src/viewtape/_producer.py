"""A runtime as an idempotent producer.

Every batch goes out with ``Producer-Id``/``-Epoch``/``-Seq``. The store gets the batch as
``pending`` before it is sent and the next seq after the ``200``, so a retry after a timeout, a
``503``, a server restart or a restart of this process sends the same bytes under the same seq,
and the server runs it once (``Producer-Duplicate: true`` is a success). A ``409`` whose
``Producer-Expected-Seq`` is lower than ours means the server lost batches it had acknowledged:
nothing at or after that seq was committed, so the pending batch is renumbered to it (``on_gap``
is told; ``renumber=False`` raises instead).
"""

from __future__ import annotations

import asyncio
import base64
import inspect
import urllib.parse
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

import httpx

from ._backoff import Backoff, retry_after
from ._errors import ProducerError
from ._store import MemoryStore, Store

TokenSource = str | Callable[[], str | Awaitable[str]]
Batch = str | bytes | Iterable[str]

_RETRY_STATUSES = {408, 425, 429, 500, 502, 503, 504}


class Producer:
    """``async with Producer(url, "demo", producer_id="p1") as p: receipt = await p.send(lines)``"""

    def __init__(
        self,
        base_url: str,
        runtime: str,
        *,
        producer_id: str,
        epoch: int | None = None,
        token: TokenSource | None = None,
        store: Store | None = None,
        client: httpx.AsyncClient | None = None,
        timeout: float = 30.0,
        min_delay: float = 0.25,
        max_delay: float = 30.0,
        renumber: bool = True,
        on_gap: Callable[[int, int], None] | None = None,
        on_retry: Callable[[int, str], None] | None = None,
    ) -> None:
        if not producer_id:
            raise ValueError("a producer needs an id")
        self.base_url = base_url.rstrip("/")
        self.runtime = runtime
        self.producer_id = producer_id
        self._epoch = epoch
        self._token_source = token
        self._token: str | None = None
        self._store: Store = store if store is not None else MemoryStore()
        self._store_key = f"{runtime}/{producer_id}"
        self._client = client
        self._own_client = client is None
        self._timeout = timeout
        self._min_delay = min_delay
        self._max_delay = max_delay
        self._renumber = renumber
        self._on_gap = on_gap
        self._on_retry = on_retry
        self._saved: dict[str, Any] | None = None
        self._lock = asyncio.Lock()
        self._closed = False

    @property
    def next_seq(self) -> int | None:
        return None if self._saved is None else int(self._saved["nextSeq"])

    async def __aenter__(self) -> Producer:
        if self._client is None:
            self._client = httpx.AsyncClient()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        self._closed = True
        if self._own_client and self._client is not None:
            await self._client.aclose()

    async def ready(self) -> dict[str, Any] | None:
        """Loads the store and sends a batch a previous life left pending; its receipt or None."""
        async with self._lock:
            await self._load()
            assert self._saved is not None
            pending = self._saved.get("pending")
            return await self._deliver(pending["seq"], _decode(pending)) if pending else None

    async def send(self, batch: Batch) -> dict[str, Any]:
        """Sends one batch (lines joined with newlines); returns the receipt once it is durable.
        Raises ``ProducerError`` (``fenced``, ``unauthorized``, ``rejected``, ``out_of_order``); an
        empty batch is refused here (``rejected``), as the server refuses it, without taking a seq."""
        body = _body(batch)
        if not body:
            raise ProducerError("rejected", "an empty batch: the server takes none; nothing was sent")
        async with self._lock:
            await self._load()
            assert self._saved is not None
            pending = self._saved.get("pending")
            if pending:
                await self._deliver(pending["seq"], _decode(pending))
            seq = int(self._saved["nextSeq"])
            await self._write({**self._saved, "pending": _encode(seq, body)})
            return await self._deliver(seq, body)

    async def _load(self) -> None:
        if self._saved is not None:
            return
        stored = await self._store.load(self._store_key)
        epoch = self._epoch if self._epoch is not None else (stored or {}).get("epoch", 0)
        if stored and stored.get("epoch") == epoch:
            self._saved = dict(stored)
        elif stored and stored.get("epoch", 0) > epoch:
            raise ProducerError("fenced", f"the store holds epoch {stored['epoch']}, newer than {epoch}")
        else:
            self._saved = {"epoch": epoch, "nextSeq": 0}

    async def _write(self, saved: dict[str, Any]) -> None:
        await self._store.save(self._store_key, saved)
        self._saved = saved

    async def _deliver(self, seq: int, body: bytes) -> dict[str, Any]:
        assert self._saved is not None and self._client is not None, "use `async with Producer(...)`"
        backoff = Backoff(self._min_delay, self._max_delay)
        renewed = False
        url = f"{self.base_url}/runtimes/{urllib.parse.quote(self.runtime, safe='')}/ingest"
        while True:
            if self._closed:
                raise ProducerError("closed", f"the producer was closed before batch {seq} was acknowledged")
            epoch = int(self._saved["epoch"])
            headers = {
                "Content-Type": "application/x-ndjson",
                "Producer-Id": self.producer_id,
                "Producer-Epoch": str(epoch),
                "Producer-Seq": str(seq),
            }
            token = await self._current_token()
            if token is not None:
                headers["Authorization"] = f"Bearer {token}"
            try:
                response = await self._client.post(url, content=body, headers=headers, timeout=self._timeout)
            except httpx.TransportError as error:
                reason = f"{type(error).__name__}: {error}"
                delay = backoff.next()
                if self._on_retry:
                    self._on_retry(seq, reason)
                await asyncio.sleep(delay)
                continue
            status = response.status_code
            if status == 200:
                receipt = dict(response.json())
                receipt.update(seq=seq, epoch=epoch, duplicate=response.headers.get("producer-duplicate") == "true")
                await self._write({"epoch": epoch, "nextSeq": seq + 1})
                return receipt
            code = _error_code(response)
            if status == 409 and (expected := response.headers.get("producer-expected-seq", "")).isdigit():
                wanted = int(expected)
                if wanted >= seq or not self._renumber:
                    raise ProducerError("out_of_order", f"the server expects seq {wanted}, this batch is {seq}", status=409, expected_seq=wanted)
                if self._on_gap:
                    self._on_gap(seq, wanted)
                seq = wanted
                await self._write({"epoch": epoch, "nextSeq": seq, "pending": _encode(seq, body)})
                continue
            if status == 403 and code == "producer_fenced":
                raise ProducerError("fenced", f"epoch {epoch} of producer {self.producer_id} is fenced by a newer one", status=403)
            if status in (401, 403):
                if callable(self._token_source) and not renewed:
                    renewed = True
                    self._token = None
                    continue
                raise ProducerError("unauthorized", f"the server refused the token ({status})", status=status)
            if status in _RETRY_STATUSES:
                delay = backoff.next(retry_after(response.headers.get("retry-after")))
                if self._on_retry:
                    self._on_retry(seq, f"status {status}")
                await asyncio.sleep(delay)
                continue
            raise ProducerError("rejected", f"the server rejected batch {seq} ({status}): {response.text[:200]}", status=status)

    async def _current_token(self) -> str | None:
        source = self._token_source
        if source is None or isinstance(source, str):
            return source
        if self._token is None:
            token = source()
            self._token = await token if inspect.isawaitable(token) else token
        return self._token


def _body(batch: Batch) -> bytes:
    if isinstance(batch, bytes):
        return batch
    if isinstance(batch, str):
        return batch.encode()
    return "".join(f"{line}\n" for line in batch).encode()


def _encode(seq: int, body: bytes) -> dict[str, Any]:
    return {"seq": seq, "body": base64.b64encode(body).decode(), "base64": True}


def _decode(pending: dict[str, Any]) -> bytes:
    body = pending["body"]
    return base64.b64decode(body) if pending.get("base64") else str(body).encode()


def _error_code(response: httpx.Response) -> str | None:
    try:
        data = response.json()
    except ValueError:
        return None
    return data.get("error") if isinstance(data, dict) else None

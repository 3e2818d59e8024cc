"""A runtime as an idempotent producer.

Epochs: a producer with no stored position (no entry in its store for this runtime and id; the
default ``MemoryStore`` starts empty) and no ``epoch`` argument first claims a new epoch,
``POST /runtimes/{runtime}/producers/{id}``: one more than the highest the server knows for the
id, which fences every older holder. So a second run under the same id without a store starts a
new numbering instead of having its batches taken for the first run's duplicates. The claimed
epoch (and next seq 0) is written to the store before the first batch; a producer that finds its
position in the store, or is given an ``epoch``, goes on under that epoch and claims none.

Exactly once: every batch goes out with ``Producer-Id``/``-Epoch``/``-Seq``. The store gets the
batch as ``pending`` before it is sent and the next seq after the ``200``, so a retry after a
timeout, a ``503``, a server restart or a restart of this process sends the same bytes under the
same seq, and the server runs it once (``Producer-Duplicate: true`` is a success; the receipt is
the original one).

Out of order: a ``409`` ``producer_out_of_order`` whose expected seq is lower than ours means the
server lost batches it had acknowledged: nothing at or after that seq was committed, so the
pending batch is renumbered to it (``on_gap`` is told; ``renumber=False`` raises instead).

Reused and stale seqs: a ``409`` ``producer_seq_reused`` says the server committed another body
under this epoch and seq (someone else writes under this id and epoch, or a run without a store
was given an ``epoch`` a previous run used); a ``409`` ``producer_seq_stale`` says the seq is so
old that the server no longer keeps its receipt. Neither is a retry the server can confirm, so
neither is renumbered or taken for a success: ``send`` raises ``seq_reused`` / ``seq_stale`` with
the server's next seq as ``expected_seq``, and the batch stays pending.
"""

from __future__ import annotations

import asyncio
import base64
import inspect
import urllib.parse
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import httpx

from ._backoff import Backoff, retry_after
from ._errors import ProducerError
from ._store import MemoryStore, Store

TokenSource = str | Callable[[], str | Awaitable[str]]
Batch = str | bytes | Iterable[str]

_RETRY_STATUSES = {408, 425, 429, 500, 502, 503, 504}
_T = TypeVar("_T")


class Producer:
    """``async with Producer(url, "demo", producer_id="p1") as p: receipt = await p.send(lines)``

    Without a ``store`` every run claims a new epoch; with one (``FileStore``) a restart resumes
    the stored epoch and next seq. ``on_retry(seq, reason)`` is told of every failed attempt that
    will be retried; an epoch claim's come with seq 0 (the seq the first batch takes) and a reason
    that starts with ``epoch claim:``."""

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
        """The seq the next batch goes under (after ``ready()``)."""
        return None if self._saved is None else int(self._saved["nextSeq"])

    @property
    def epoch(self) -> int | None:
        """The epoch the batches go under (after ``ready()``): the given, stored or claimed one."""
        return None if self._saved is None else int(self._saved["epoch"])

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
        """Loads the store (claiming a new epoch when it holds no position and no ``epoch`` was
        given) and sends a batch a previous life left pending; its receipt or None."""
        async with self._lock:
            await self._load()
            assert self._saved is not None
            pending = self._saved.get("pending")
            return await self._deliver(pending["seq"], _decode(pending)) if pending else None

    async def send(self, batch: Batch) -> dict[str, Any]:
        """Sends one batch (lines joined with newlines); returns the receipt once it is durable.
        Raises ``ProducerError`` (``fenced``, ``unauthorized``, ``rejected``, ``out_of_order``,
        ``seq_reused``, ``seq_stale``, ``closed``); an empty batch is refused here (``rejected``),
        as the server refuses it, without taking a seq."""
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
        if stored is None and self._epoch is None:
            await self._write({"epoch": await self._claim(), "nextSeq": 0})
            return
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

    def _runtime_url(self) -> str:
        return f"{self.base_url}/runtimes/{urllib.parse.quote(self.runtime, safe='')}"

    async def _claim(self) -> int:
        """Claims a new epoch for this id (one more than the highest the server knows)."""
        url = f"{self._runtime_url()}/producers/{urllib.parse.quote(self.producer_id, safe='')}"

        async def step() -> int | _Retry | _Renew:
            answer = await self._request(url, {}, None)
            if not isinstance(answer, httpx.Response):
                return answer
            if answer.status_code != 200:
                return _refusal(answer, "the epoch claim")
            epoch = _json(answer).get("epoch")
            if isinstance(epoch, int) and not isinstance(epoch, bool) and epoch >= 0:
                return epoch
            raise ProducerError(
                "rejected", f"the answer to the epoch claim names no epoch: {answer.text[:200]}", status=200
            )

        return await self._until_done(lambda: "the epoch claim", lambda: 0, "epoch claim: ", step)

    async def _deliver(self, initial_seq: int, body: bytes) -> dict[str, Any]:
        """Sends ``body`` as ``seq`` until the server commits it (or refuses it for good)."""
        seq = initial_seq
        url = f"{self._runtime_url()}/ingest"

        async def step() -> dict[str, Any] | _Retry | _Renew | _Again:
            nonlocal seq
            assert self._saved is not None
            epoch = int(self._saved["epoch"])
            headers = {
                "Content-Type": "application/x-ndjson",
                "Producer-Id": self.producer_id,
                "Producer-Epoch": str(epoch),
                "Producer-Seq": str(seq),
            }
            answer = await self._request(url, headers, body)
            if not isinstance(answer, httpx.Response):
                return answer
            status = answer.status_code
            if status == 200:
                receipt = dict(answer.json())
                receipt.update(seq=seq, epoch=epoch, duplicate=answer.headers.get("producer-duplicate") == "true")
                await self._write({"epoch": epoch, "nextSeq": seq + 1})
                return receipt
            code = _json(answer).get("error")
            if status == 409:
                expected = _expected_seq(answer)
                if code == "producer_seq_reused":
                    raise ProducerError(
                        "seq_reused",
                        f"seq {seq} of epoch {epoch} was already used for another batch; the server's next seq is {expected}",
                        status=409,
                        expected_seq=expected,
                    )
                if code == "producer_seq_stale":
                    raise ProducerError(
                        "seq_stale",
                        f"seq {seq} of epoch {epoch} is older than the receipts the server keeps; its next seq is {expected}",
                        status=409,
                        expected_seq=expected,
                    )
                if code == "producer_out_of_order":
                    if expected is None or expected >= seq or not self._renumber:
                        raise ProducerError(
                            "out_of_order", f"the server expects seq {expected}, this batch is {seq}", status=409, expected_seq=expected
                        )
                    if self._on_gap:
                        self._on_gap(seq, expected)
                    seq = expected
                    await self._write({"epoch": epoch, "nextSeq": seq, "pending": _encode(seq, body)})
                    return _AGAIN
            if status == 403 and code == "producer_fenced":
                raise ProducerError("fenced", f"epoch {epoch} of producer {self.producer_id} is fenced by a newer one", status=403)
            return _refusal(answer, f"batch {seq}")

        return await self._until_done(lambda: f"batch {seq}", lambda: seq, "", step)

    async def _until_done(
        self,
        what: Callable[[], str],
        seq: Callable[[], int],
        reason_prefix: str,
        step: Callable[[], Awaitable[_T | _Retry | _Renew | _Again]],
    ) -> _T:
        """Runs ``step`` until it is done or raises: retries with backoff (``Retry-After`` is the
        floor), asks a token callback once more after a refusal, stops when the producer closes."""
        assert self._client is not None, "use `async with Producer(...)`"
        backoff = Backoff(self._min_delay, self._max_delay)
        renewed = False
        while True:
            if self._closed:
                raise ProducerError("closed", f"the producer was closed before {what()} was acknowledged")
            result = await step()
            if isinstance(result, _Again):
                continue
            if isinstance(result, _Renew):
                if renewed or not callable(self._token_source):
                    raise result.error
                renewed = True
                self._token = None
                continue
            if isinstance(result, _Retry):
                renewed = False
                delay = backoff.next(result.floor)
                if self._on_retry:
                    self._on_retry(seq(), reason_prefix + result.reason)
                await asyncio.sleep(delay)
                continue
            return result

    async def _request(self, url: str, headers: dict[str, str], body: bytes | None) -> httpx.Response | _Retry:
        """One POST with the token and the time limit; a failure to get an answer is a retry."""
        assert self._client is not None, "use `async with Producer(...)`"
        sent = dict(headers)
        token = await self._current_token()
        if token is not None:
            sent["Authorization"] = f"Bearer {token}"
        try:
            return await self._client.post(url, content=body, headers=sent, timeout=self._timeout)
        except httpx.TransportError as error:
            return _Retry(0.0, f"{type(error).__name__}: {error}")

    async def _current_token(self) -> str | None:
        source = self._token_source
        if source is None or isinstance(source, str):
            return source
        if self._token is None:
            token = source()
            self._token = await token if inspect.isawaitable(token) else token
        return self._token


@dataclass(frozen=True)
class _Retry:
    """Try again after at least ``floor`` seconds."""

    floor: float
    reason: str


@dataclass(frozen=True)
class _Renew:
    """The token was refused: ask the token callback for a new one once, else raise ``error``."""

    error: ProducerError


class _Again:
    """Send again at once (the batch was renumbered)."""


_AGAIN = _Again()


def _refusal(response: httpx.Response, what: str) -> _Retry | _Renew:
    """A refusal that is not particular to the request: a token refused, a retryable status, or a
    4xx (raised)."""
    status = response.status_code
    if status in (401, 403):
        return _Renew(ProducerError("unauthorized", f"the server refused the token ({status})", status=status))
    if status in _RETRY_STATUSES:
        return _Retry(retry_after(response.headers.get("retry-after")), f"status {status}")
    raise ProducerError("rejected", f"the server rejected {what} ({status}): {response.text[:200]}", status=status)


def _expected_seq(response: httpx.Response) -> int | None:
    """The seq a 409 says the server expects next: the body's ``next_seq``, else the header."""
    from_body = _json(response).get("next_seq")
    if isinstance(from_body, int) and not isinstance(from_body, bool) and from_body >= 0:
        return from_body
    header = response.headers.get("producer-expected-seq", "")
    return int(header) if header.isdigit() else None


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


def _json(response: httpx.Response) -> dict[str, Any]:
    """The answer's JSON object, or an empty one."""
    try:
        data = response.json()
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}

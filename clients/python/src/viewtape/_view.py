"""A view as a live dict.

Consistency: ``state`` is always a state the server had at ``cursor``. ``state`` events are staged
and swapped in at ``synced``; a ``reset`` restages (the old dict and cursor stay until its
``synced``); an ``update``/``delete`` at or before the cursor is never applied twice, and the
cursor moves before anyone hears of the change.

Reconnection resumes from the cursor with full-jitter backoff (``min_delay``..``max_delay``), at
least a ``Retry-After``, and after a stream that sent ``retry:``, at least its last hint (for that
one reconnection); ``401``/``403`` and ``reauth`` call the ``token`` callback again. A run of
connections that end without progress raises ``fast_retry_loop`` and backs off harder.

Closing: a view closes at ``close()`` (or leaving ``async with``), or when the server says it will
never serve it: ``event: retired`` (its runtime deleted, or no longer declaring it), a ``404`` (no
such view), a ``400``-like refusal, a ``401``/``403`` with no token callback. Then ``status`` is
``closed``, ``error`` listeners hear the fatal ``ViewError`` (``retired``, ``not_found``, ...),
``synced()`` raises it, ``changes()`` ends, and nothing reconnects. ``state`` and ``cursor`` keep
the last state the view had.

One file past 500 lines: the stream's events, the reconnection and the staged dict are one state
machine, and each of its transitions reads the others.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import logging
import re
import time
import urllib.parse
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Literal

import httpx
from httpx_sse import EventSource, ServerSentEvent

from ._backoff import Backoff, retry_after
from ._errors import ViewError
from ._store import Store

Status = Literal["connecting", "syncing", "live", "reconnecting", "closed"]
TokenSource = str | Callable[[], str | Awaitable[str]]

_log = logging.getLogger("viewtape")
_CURSOR = re.compile(r"^([0-9a-f]{16})-(\d{1,16})$")
_FAST_LOOP_RUN = 5
_HEALTHY_AFTER = 10.0


def parse_cursor(cursor: str | None) -> tuple[str, int] | None:
    """``(epoch, offset)`` of a cursor ``<16 hex digits>-<offset>``, or None."""
    match = _CURSOR.match(cursor or "")
    return (match.group(1), int(match.group(2))) if match else None


@dataclass(frozen=True)
class Change:
    """One key's change; ``value`` is None when ``deleted``. ``from_state``: from a swap at
    ``synced`` (or the stored state) rather than a live event."""

    key: str
    value: Any
    deleted: bool
    cursor: str
    from_state: bool


class _Stop(Exception):
    """Ends one connection; carries the error to report, or None for ``reauth``."""

    def __init__(self, error: ViewError | None) -> None:
        super().__init__(str(error))
        self.error = error


class View:
    """A live, consistent copy of one view. ``async with View(url, name) as view: ...``"""

    def __init__(
        self,
        base_url: str,
        name: str,
        *,
        token: TokenSource | None = None,
        cursor_store: Store | None = None,
        store_key: str | None = None,
        keys: Iterable[str] | None = None,
        prefix: str | None = None,
        after: int | None = None,
        client: httpx.AsyncClient | None = None,
        min_delay: float = 0.5,
        max_delay: float = 30.0,
        first_byte_timeout: float = 10.0,
        stall_timeout: float = 45.0,
        save_interval: float = 1.0,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.name = name
        self._token_source = token
        self._token: str | None = None
        self._store = cursor_store
        self._store_key = store_key or name
        self._keys = list(keys) if keys is not None else None
        self._prefix = prefix
        self._after = after
        self._client = client
        self._own_client = client is None
        self._backoff = Backoff(min_delay, max_delay)
        self._first_byte_timeout = first_byte_timeout
        self._stall_timeout = stall_timeout
        self._save_interval = save_interval

        self._state: dict[str, Any] = {}
        self._staging: dict[str, Any] | None = None
        self._cursor: str | None = None
        self._parsed: tuple[str, int] | None = None
        self._status: Status = "connecting"
        self.error: ViewError | None = None
        self._listeners: dict[str, list[Callable[[Any], None]]] = {}
        self._queues: set[asyncio.Queue[Change | None]] = set()
        self._retry_hint = 0.0
        self._reset_pending = False
        self._closed = False
        self._live_applied = 0
        self._unhealthy_run = 0
        self._live = asyncio.Event()
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._save_task: asyncio.Task[None] | None = None
        self._dirty = False
        self.applied = 0
        self.skipped = 0
        self.resets = 0

    # ---- public surface ------------------------------------------------------------------------

    @property
    def state(self) -> Mapping[str, Any]:
        """The view's state (read-only), a state the server had at ``cursor``."""
        return MappingProxyType(self._state)

    @property
    def cursor(self) -> str | None:
        """The cursor of the last event applied (None before the first)."""
        return self._cursor

    @property
    def status(self) -> Status:
        return self._status

    def on(self, event: str, listener: Callable[[Any], None]) -> Callable[[], None]:
        """Calls ``listener`` on ``change``, ``synced``, ``reset``, ``status`` or ``error``;
        returns the function that stops it. A listener that raises is reported as a ``listener``
        error; one that raises in an ``error`` listener is logged (logger ``viewtape``, ERROR)."""
        self._listeners.setdefault(event, []).append(listener)

        def off() -> None:
            listeners = self._listeners.get(event, [])
            if listener in listeners:
                listeners.remove(listener)

        return off

    async def synced(self) -> None:
        """Returns once the state is complete and live; raises the last error if it closes."""
        if self._closed:
            raise self.error or ViewError("network", "the view is closed")
        waiter = asyncio.ensure_future(self._live.wait())
        assert self._task is not None, "start the view first (async with, or start())"
        done, _ = await asyncio.wait({waiter, self._task}, return_when=asyncio.FIRST_COMPLETED)
        if waiter not in done:
            waiter.cancel()
            raise self.error or ViewError("network", "the view closed before it was live")

    async def changes(self) -> AsyncIterator[Change]:
        """Every change from now on, until the view closes."""
        if self._closed and (self._task is None or self._task.done()):
            return
        queue: asyncio.Queue[Change | None] = asyncio.Queue()
        self._queues.add(queue)
        try:
            while (change := await queue.get()) is not None:
                yield change
        finally:
            self._queues.discard(queue)

    def start(self) -> View:
        """Starts following (``async with`` does it)."""
        if self._task is None:
            if self._client is None:
                self._client = httpx.AsyncClient()
            self._task = asyncio.create_task(self._run(), name=f"viewtape view {self.name}")
        return self

    async def close(self) -> None:
        """Frees the connection, the tasks and the listeners; saves the last position."""
        self._closed = True
        self._wake.set()
        task = self._task
        if task is not None:
            # Cancelled until it ends: before Python 3.12, ``asyncio.wait_for`` can swallow a
            # cancellation that arrives as its inner await completes, and the connection task
            # would then go on reading a live stream.
            while not task.done():
                task.cancel()
                await asyncio.wait({task}, timeout=0.5)
            try:
                task.result()
            except asyncio.CancelledError:
                pass
        await self._shut_down()

    async def __aenter__(self) -> View:
        return self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # ---- the connection loop -------------------------------------------------------------------

    async def _run(self) -> None:
        await self._load_stored()
        while not self._closed:
            started = time.monotonic()
            applied_before = self._live_applied
            floor = await self._connect()
            if self._closed:
                break
            if floor is None:  # reauth: reopen at once
                continue
            healthy = self._live_applied > applied_before or time.monotonic() - started >= _HEALTHY_AFTER
            if healthy:
                self._backoff.reset()
                self._unhealthy_run = 0
            else:
                self._unhealthy_run += 1
                if self._unhealthy_run == _FAST_LOOP_RUN:
                    self._fail(ViewError("fast_retry_loop", f"{_FAST_LOOP_RUN} connections in a row ended without progress"))
            self._set_status("reconnecting")
            # A stream's ``retry:`` is a floor for the reconnection right after it, once: attempts
            # that fail before any stream (refused, unreachable) back off from ``min_delay`` again.
            hint, self._retry_hint = self._retry_hint, 0.0
            delay = self._backoff.next(max(floor, hint), self._unhealthy_run >= _FAST_LOOP_RUN)
            self._wake.clear()
            try:
                await asyncio.wait_for(self._wake.wait(), delay)
            except asyncio.TimeoutError:
                pass
        self._set_status("closed")
        self._end_changes()

    async def _connect(self) -> float | None:
        """One connection; returns the least delay before the next, or None to reopen at once."""
        assert self._client is not None
        token = await self._current_token()
        if self._token_source is not None and token is None:
            return 0.0
        self._retry_hint = 0.0  # a hint belongs to the stream that sent it
        resume = None if self._reset_pending else self._cursor
        headers = {"Accept": "text/event-stream", "Cache-Control": "no-store"}
        if token is not None:
            headers["Authorization"] = f"Bearer {token}"
        timeout = httpx.Timeout(10.0, read=self._stall_timeout)
        try:
            async with self._client.stream("GET", self._url(resume), headers=headers, timeout=timeout) as response:
                if response.status_code != 200:
                    return await self._refused(response)
                content_type = response.headers.get("content-type", "")
                if not content_type.lower().startswith("text/event-stream"):
                    self._fail(ViewError(
                        "bad_content_type",
                        f"the stream answered with Content-Type {content_type!r}, not text/event-stream: "
                        "a proxy or cache is answering in the server's place",
                        status=200,
                    ))
                    return 0.0
                if resume is None:
                    self._staging = {}
                    self._set_status("syncing")
                else:
                    self._go_live()
                return await self._read(EventSource(response))
        except httpx.ReadTimeout as error:
            self._fail(ViewError("stalled", f"no byte for {self._stall_timeout} s, not even a heartbeat: {error}"))
        except (httpx.TransportError, httpx.StreamError) as error:
            self._fail(ViewError("network", f"the stream failed or was cut: {error!r}"))
        return 0.0

    async def _read(self, source: EventSource) -> float | None:
        events = source.aiter_sse()
        last_id: str | None = None
        first = True
        try:
            while True:
                try:
                    if first:
                        sse = await asyncio.wait_for(anext(events), self._first_byte_timeout)
                        first = False
                    else:
                        sse = await anext(events)
                except StopAsyncIteration:
                    return 0.0
                except asyncio.TimeoutError:
                    self._fail(ViewError(
                        "stream_buffered",
                        f"the stream sent headers but nothing within {self._first_byte_timeout} s: a proxy is buffering it",
                    ))
                    return 0.0
                if self._closed:
                    return 0.0
                try:
                    last_id = self._handle(sse, last_id)
                except _Stop as stop:
                    if stop.error is None:
                        self._set_status("reconnecting")
                        return None if await self._renew_token() else 0.0
                    self._fail(stop.error)
                    if stop.error.fatal:  # ``retired``: reconnecting cannot bring the view back
                        self._closed = True
                    return 0.0
        finally:
            await events.aclose()

    async def _refused(self, response: httpx.Response) -> float:
        status = response.status_code
        said = await _server_message(response)
        if 400 <= status < 500 and status not in (401, 403, 404, 408, 429):
            # The same request gets the same answer: retrying cannot help, so the view closes.
            self._fail(ViewError("bad_request", f"the server refused the stream ({status}){said}; not retrying",
                                 status=status, fatal=True))
            self._closed = True
            return 0.0
        if status in (401, 403):
            code = "unauthorized" if status == 401 else "forbidden"
            if not callable(self._token_source):
                self._fail(ViewError(code, f"the server refused the stream ({status}) and there is no token callback", status=status, fatal=True))
                self._closed = True
                return 0.0
            self._fail(ViewError(code, f"the server refused the stream ({status}); asking the token callback again", status=status))
            await self._renew_token()
            return 0.0
        if status == 404:
            # No such view: never declared, or retired. Views come and go while the server runs,
            # so a 404 is an answer, not an outage: waiting for the name to come back would leave
            # the application "reconnecting" to a view that is gone.
            self._fail(ViewError("not_found", f"the server has no view {json.dumps(self.name)} (404){said}; not retrying",
                                 status=status, fatal=True))
            self._closed = True
            return 0.0
        self._fail(ViewError("http_status", f"the stream answered {status}{said}", status=status))
        return retry_after(response.headers.get("retry-after"))

    def _url(self, cursor: str | None) -> str:
        params: dict[str, str] = {}
        if cursor is not None:
            params["cursor"] = cursor
        if self._keys is not None:
            params["keys"] = ",".join(self._keys)
        if self._prefix is not None:
            params["prefix"] = self._prefix
        if self._after is not None:
            params["after"] = str(self._after)
        query = f"?{urllib.parse.urlencode(params)}" if params else ""
        return f"{self.base_url}/views/{urllib.parse.quote(self.name, safe='')}/events{query}"

    # ---- the protocol --------------------------------------------------------------------------

    def _handle(self, sse: ServerSentEvent, last_id: str | None) -> str | None:
        """Applies one event; returns the id this connection saw last. httpx-sse repeats the last
        id on events that carry none, so an id equal to the previous one means there was none."""
        if sse.retry is not None:
            self._retry_hint = sse.retry / 1000
        kind = sse.event
        if kind in ("update", "delete", "synced"):
            parsed = parse_cursor(sse.id)
            if parsed is None or sse.id == last_id:
                raise _Stop(ViewError(
                    "missing_id",
                    f"a {kind} event without a cursor id ({sse.id!r}): something between strips or rewrites SSE ids",
                ))
            if kind == "synced":
                self._swap(sse.id, parsed)
                return sse.id
            if self._staging is not None:
                raise _Stop(ViewError("bad_event", f"an {kind} arrived during a state transfer"))
            if self._parsed is not None and parsed[0] == self._parsed[0] and parsed[1] <= self._parsed[1]:
                self.skipped += 1
                return sse.id
            if self._parsed is not None and parsed[0] != self._parsed[0]:
                raise _Stop(ViewError("bad_event", f"an {kind} of epoch {parsed[0]} without a reset"))
            key, value = _decode(sse)
            if kind == "delete":
                self._state.pop(key, None)
            else:
                self._state[key] = value
            self._move_cursor(sse.id, parsed)
            self.applied += 1
            self._live_applied += 1
            self._emit("change", Change(key, None if kind == "delete" else value, kind == "delete", sse.id, False))
            return sse.id
        if kind == "state":
            key, value = _decode(sse)
            if self._staging is None:
                self._staging = {}
            self._staging[key] = value
            return sse.id or last_id
        if kind == "reset":
            try:
                info = json.loads(sse.data)
            except ValueError as error:
                raise _Stop(ViewError("bad_event", f"a reset whose data is not JSON: {sse.data[:80]!r}")) from error
            self.resets += 1
            self._reset_pending = True
            self._staging = {}
            self._set_status("syncing")
            self._emit("reset", info)
            return sse.id
        if kind == "reauth":
            raise _Stop(None)
        if kind == "retired":
            raise _Stop(_retired(self.name, sse))
        if kind in ("", "message"):
            if not sse.data:
                return last_id  # a `retry:` hint alone
            raise _Stop(ViewError("bad_event", "an event without an `event:` type: something between rewrote the stream"))
        return last_id  # a kind this client does not know yet

    def _swap(self, cursor: str, parsed: tuple[str, int]) -> None:
        previous, new = self._state, self._staging if self._staging is not None else {}
        self._state = new
        self._staging = None
        self._reset_pending = False
        self._move_cursor(cursor, parsed)
        for key in previous:
            if key not in new:
                self._emit("change", Change(key, None, True, cursor, True))
        for key, value in new.items():
            if key not in previous or previous[key] != value:
                self._emit("change", Change(key, value, False, cursor, True))
        self._go_live()
        self._emit("synced", cursor)
        self._schedule_save(0)

    def _move_cursor(self, cursor: str, parsed: tuple[str, int]) -> None:
        self._cursor = cursor
        self._parsed = parsed
        self._schedule_save(self._save_interval)

    def _go_live(self) -> None:
        self.error = None
        self._set_status("live")
        self._live.set()

    # ---- tokens --------------------------------------------------------------------------------

    async def _current_token(self) -> str | None:
        source = self._token_source
        if source is None or isinstance(source, str):
            return source
        if self._token is None:
            await self._renew_token()
        return self._token

    async def _renew_token(self) -> bool:
        source = self._token_source
        if not callable(source):
            return True
        try:
            token = source()
            self._token = await token if inspect.isawaitable(token) else token
            return True
        except Exception as error:  # the application's callback: any failure is reported
            self._token = None
            self._fail(ViewError("token", f"the token callback failed: {error!r}"))
            return False

    # ---- the store -----------------------------------------------------------------------------

    async def _load_stored(self) -> None:
        if self._store is None:
            return
        try:
            saved = await self._store.load(self._store_key)
        except Exception as error:  # a store is the application's: report, start fresh
            self._fail(ViewError("store", f"cannot read the cursor store: {error!r}"))
            return
        parsed = parse_cursor(saved.get("cursor")) if isinstance(saved, dict) else None
        if saved is None or parsed is None:
            return
        self._state = dict(saved.get("entries", []))
        self._cursor = saved["cursor"]
        self._parsed = parsed
        for key, value in self._state.items():
            self._emit("change", Change(key, value, False, saved["cursor"], True))

    def _schedule_save(self, delay: float) -> None:
        if self._store is None or self._cursor is None:
            return
        self._dirty = True
        if self._save_task is not None and not self._save_task.done():
            if delay > 0:
                return
            self._save_task.cancel()
        self._save_task = asyncio.get_running_loop().create_task(self._save_after(delay))

    async def _save_after(self, delay: float) -> None:
        await asyncio.sleep(delay)
        await self._save()

    async def _save(self) -> None:
        if self._store is None or not self._dirty or self._cursor is None:
            return
        self._dirty = False
        saved = {"cursor": self._cursor, "entries": list(self._state.items())}
        try:
            await self._store.save(self._store_key, saved)
        except Exception as error:  # a store is the application's: report, go on
            self._fail(ViewError("store", f"cannot write the cursor store: {error!r}"))

    # ---- events --------------------------------------------------------------------------------

    def _set_status(self, status: Status) -> None:
        if self._status in (status, "closed"):
            return
        self._status = status
        if status != "live":
            self._live.clear()
        self._emit("status", status)

    def _fail(self, error: ViewError) -> None:
        self.error = error
        self._emit("error", error)

    def _emit(self, event: str, value: Any) -> None:
        if event == "change":
            for queue in self._queues:
                queue.put_nowait(value)
        for listener in list(self._listeners.get(event, [])):
            try:
                listener(value)
            except Exception as error:  # an application listener: report, carry on
                if event == "error":
                    # Reported as another error it would come back to the same listener: the
                    # log is where it cannot loop, and cannot be missed (ERROR, with its traceback).
                    _log.exception("view %s: an error listener raised while handling %r", self.name, value)
                else:
                    self._fail(ViewError("listener", f"a {event} listener raised {error!r}"))

    def _end_changes(self) -> None:
        """Ends every ``changes()`` iteration (each queue hears the end once)."""
        for queue in self._queues:
            queue.put_nowait(None)
        self._queues.clear()

    async def _shut_down(self) -> None:
        save, self._save_task = self._save_task, None
        if save is not None and not save.done():
            save.cancel()
            try:
                await save
            except asyncio.CancelledError:
                pass
        await self._save()
        self._set_status("closed")
        self._end_changes()
        self._listeners.clear()
        if self._own_client and self._client is not None:
            await self._client.aclose()


async def _server_message(response: httpx.Response) -> str:
    """``: <message>`` from the server's JSON error body (``{"error", "message"}``), or the body's
    first bytes; reads at most 4 KiB."""
    body = b""
    try:
        async for chunk in response.aiter_bytes():
            body += chunk
            if len(body) >= 4096:
                break
    except httpx.HTTPError:
        pass
    text = body.decode("utf-8", "replace")
    try:
        message = json.loads(text).get("message", text)
    except (ValueError, AttributeError):
        message = text
    said = str(message).strip()[:300]
    return f": {said}" if said else ""


def _retired(name: str, sse: ServerSentEvent) -> ViewError:
    """The fatal error of an ``event: retired``, whose data is ``{"view", "reason"}`` (data that
    does not parse still retires the view: the event itself is the server's word)."""
    reason: str | None = None
    try:
        data = json.loads(sse.data)
        if isinstance(data, dict) and isinstance(data.get("reason"), str):
            reason = data["reason"]
    except ValueError:
        pass
    why = f": {reason}" if reason is not None else ""
    return ViewError("retired", f"the server retired the view {json.dumps(name)}{why}; not reconnecting",
                     fatal=True, reason=reason)


def _decode(sse: ServerSentEvent) -> tuple[str, Any]:
    try:
        data = json.loads(sse.data)
        key = data["key"]
        if not isinstance(key, str):
            raise TypeError("key")
        return key, data.get("value")
    except (ValueError, KeyError, TypeError) as error:
        raise _Stop(ViewError("bad_event", f"a {sse.event} whose data is not {{\"key\": …}}: {sse.data[:80]!r}")) from error

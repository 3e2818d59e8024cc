"""Errors with stable codes (the same codes as the JavaScript client)."""

from __future__ import annotations


class ViewError(Exception):
    """An error of a view. ``code`` is one of ``unauthorized``, ``forbidden``, ``bad_request``,
    ``not_found``, ``http_status``, ``bad_content_type``, ``stream_buffered``, ``missing_id``,
    ``bad_event``, ``stalled``, ``network``, ``fast_retry_loop``, ``token``, ``store``,
    ``listener``, ``retired``; a ``fatal`` one closes the view. ``bad_request`` (a 400, or another
    4xx that asking again cannot change), ``not_found`` (a 404: no such view, never declared or
    retired since) and ``retired`` (the server retired the view and ended its stream with
    ``event: retired``; ``reason`` is the server's) are always fatal. As in the JavaScript client,
    ``message`` says what went wrong and ``status`` is the HTTP status when there was one."""

    def __init__(
        self, code: str, message: str, *, status: int | None = None, fatal: bool = False, reason: str | None = None
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.status = status
        self.fatal = fatal
        self.reason = reason


class ProducerError(Exception):
    """An error of ``Producer.send``: ``fenced``, ``unauthorized``, ``out_of_order``,
    ``seq_reused``, ``seq_stale``, ``rejected``, ``closed``. ``seq_reused`` (a ``409``
    ``producer_seq_reused``): the server committed another batch under this epoch and seq, so
    this one is neither a retry nor published; ``seq_stale`` (a ``409`` ``producer_seq_stale``):
    the seq is older than the receipts the server keeps. For these and ``out_of_order``,
    ``expected_seq`` is the seq the server expects next. As ``ViewError``, it has ``message``."""

    def __init__(
        self, code: str, message: str, *, status: int | None = None, expected_seq: int | None = None
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.status = status
        self.expected_seq = expected_seq

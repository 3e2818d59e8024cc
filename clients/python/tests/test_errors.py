"""What a view's errors carry and where an application's failures go, without a server: the view's
requests are answered by an ``httpx.MockTransport``. Run with ``python3 -m pytest
clients/python/tests/test_errors.py``."""

from __future__ import annotations

import asyncio
import logging
import sys
from pathlib import Path

import httpx
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import viewtape  # noqa: E402


def refusing(status: int, code: str, message: str) -> httpx.AsyncClient:
    """A client whose every request is answered ``status`` with the server's JSON error body."""
    return httpx.AsyncClient(
        transport=httpx.MockTransport(lambda _: httpx.Response(status, json={"error": code, "message": message}))
    )


async def closed_by_400(view: viewtape.View) -> viewtape.ViewError:
    with pytest.raises(viewtape.ViewError) as refused:
        await asyncio.wait_for(view.synced(), 10)
    return refused.value


async def test_a_view_error_has_a_message_a_code_and_a_status_like_its_javascript_twin() -> None:
    """``ViewError`` had no ``message``: the JavaScript client's ``error.message`` had no Python
    equivalent but ``str(error)``."""
    async with refusing(400, "bad_request", "keys and prefix together") as client:
        async with viewtape.View("http://viewtape.test", "notes", client=client) as view:
            error = await closed_by_400(view)
    assert (error.code, error.status, error.fatal) == ("bad_request", 400, True)
    assert error.message == str(error)
    assert "keys and prefix together" in error.message


async def test_an_exception_in_an_error_listener_is_logged_not_swallowed(caplog: pytest.LogCaptureFixture) -> None:
    """An exception raised in an ``error`` listener used to vanish without a trace: it is logged
    at ERROR on the ``viewtape`` logger, with its traceback, and the other listeners still run."""
    heard: list[str] = []

    def broken(error: viewtape.ViewError) -> None:
        raise RuntimeError("the application's own bug")

    async with refusing(400, "bad_request", "refused") as client:
        async with viewtape.View("http://viewtape.test", "notes", client=client) as view:
            view.on("error", broken)
            view.on("error", lambda error: heard.append(error.code))
            with caplog.at_level(logging.ERROR, logger="viewtape"):
                await closed_by_400(view)
    assert heard == ["bad_request"]
    logged = [record for record in caplog.records if record.name == "viewtape"]
    assert len(logged) == 1, caplog.records
    assert logged[0].levelno == logging.ERROR
    assert "error listener" in logged[0].getMessage() and "notes" in logged[0].getMessage()
    assert logged[0].exc_info is not None and "the application's own bug" in str(logged[0].exc_info[1])


def test_a_producer_error_has_a_message_too() -> None:
    """``ProducerError``, like ``ViewError``, had no ``.message``: it has, as in JavaScript."""
    error = viewtape.ProducerError("fenced", "epoch 1 is fenced", status=403)
    assert (error.code, error.message, error.status) == ("fenced", "epoch 1 is fenced", 403)

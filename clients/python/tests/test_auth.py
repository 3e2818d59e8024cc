"""viewtape-client with auth on: ``python3 clients/python/tests/test_auth.py <base-url> <secret>``,
run by tests/tests/clients.rs against a server with VIEWTAPE_JWT_SECRET=<secret> and ``[auth]
audience = "viewtape"``. The tests sign their own HS256 tokens with the secret."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
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

BASE = os.environ.get("VIEWTAPE_URL", "")
SECRET = os.environ.get("VIEWTAPE_SECRET", "")


def token(seconds: int, **claims: Any) -> str:
    def part(value: Any) -> str:
        return base64.urlsafe_b64encode(json.dumps(value).encode()).rstrip(b"=").decode()

    body = {"exp": int(time.time()) + seconds, "aud": "viewtape", "views": ["prices"], **claims}
    signed = f"{part({'alg': 'HS256', 'typ': 'JWT'})}.{part(body)}"
    mac = hmac.new(SECRET.encode(), signed.encode(), hashlib.sha256).digest()
    return f"{signed}.{base64.urlsafe_b64encode(mac).rstrip(b'=').decode()}"


WRITER = {"Authorization": f"Bearer {token(600, ingest=['demo'])}"}
seq = 0


async def tick(client: httpx.AsyncClient, n: int) -> None:
    global seq
    lines = []
    for _ in range(n):
        seq += 1
        lines.append(json.dumps({"symbol": ["ACME", "BOLT", "CRUX"][seq % 3], "price": 1 + seq / 4, "seq": seq}))
    response = await client.post(f"{BASE}/runtimes/demo/ingest", content="\n".join(lines) + "\n", headers=WRITER)
    assert response.status_code == 200, response.text


async def test_a_token_expiring_mid_stream_is_renewed_at_reauth() -> None:
    calls = 0

    async def fresh() -> str:
        nonlocal calls
        calls += 1
        return token(2)

    async with httpx.AsyncClient() as client, viewtape.View(BASE, "prices", token=fresh, min_delay=0.1, max_delay=1) as view:
        live: list[viewtape.Change] = []
        resets: list[Any] = []
        view.on("change", lambda c: None if c.from_state else live.append(c))
        view.on("reset", resets.append)
        await tick(client, 3)
        await view.synced()
        deadline = time.monotonic() + 8
        while time.monotonic() < deadline:
            await tick(client, 2)
            await asyncio.sleep(0.2)
        target = (await client.get(f"{BASE}/views/prices", headers=WRITER)).json()
        for _ in range(600):
            if view.cursor == target["cursor"]:
                break
            await asyncio.sleep(0.05)
        assert view.cursor == target["cursor"]
        assert dict(view.state) == target["entries"]
        assert calls >= 3, calls
        assert resets == []
        seqs = [c.value["seq"] for c in live]
        assert seqs == list(range(seqs[0], seqs[0] + len(seqs))), seqs


async def test_a_refused_token_is_renewed_and_a_static_one_closes_the_view() -> None:
    tokens = [token(60, views=["other"])]

    def fresh() -> str:
        return tokens.pop() if tokens else token(60)

    async with viewtape.View(BASE, "prices", token=fresh, min_delay=0.1) as view:
        errors: list[viewtape.ViewError] = []
        view.on("error", errors.append)
        await view.synced()
        assert errors and errors[0].code == "forbidden" and errors[0].status == 403
    async with viewtape.View(BASE, "prices", token=token(-60)) as refused:
        with pytest.raises(viewtape.ViewError) as raised:
            await refused.synced()
        assert raised.value.code == "unauthorized" and raised.value.fatal
        assert refused.status == "closed"


async def test_a_producer_without_the_grant() -> None:
    async with viewtape.Producer(BASE, "demo", producer_id="py-auth", token=token(60)) as producer:
        with pytest.raises(viewtape.ProducerError) as raised:
            await producer.send(['{"symbol":"ACME","price":1,"seq":1}'])
        assert raised.value.code == "unauthorized" and raised.value.status == 403


if __name__ == "__main__":
    os.environ["VIEWTAPE_URL"], os.environ["VIEWTAPE_SECRET"] = sys.argv[1], sys.argv[2]
    sys.exit(pytest.main([__file__, "-s", "-v", "-p", "no:cacheprovider", "-o", "asyncio_mode=auto"]))

"""viewtape-client across the nodes of a cluster: ``python3 clients/python/tests/test_cluster.py
<node A> <node B>``, run by tests/tests/clients.rs with two nodes on one real nats-server
(JetStream). A view follows ``prices`` through a proxy, as behind a load balancer; the proxy
switches from node A to node B and drops the connection; the view resumes on B from its cursor:
no reset, no state transfer, every offset once and in order, and its dict equals
``GET /views/prices`` on both nodes. The producer goes on on node B with the seq it kept."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import viewtape  # noqa: E402
from support import CuttingProxy, Record, matches_server, until  # noqa: E402

NODE_A = os.environ.get("VIEWTAPE_URL", "")
NODE_B = os.environ.get("VIEWTAPE_URL_B", "")
SYMBOLS = ["ACME", "BOLT", "CRUX", "DYNE"]


class Feed:
    """Ticks for the demo ticker, numbered from 1: tick ``n`` is ``{"seq": n, ...}``."""

    def __init__(self) -> None:
        self.next = 1

    def batch(self, size: int) -> str:
        lines = []
        for seq in range(self.next, self.next + size):
            lines.append(json.dumps({"symbol": SYMBOLS[(seq - 1) % len(SYMBOLS)], "price": 1 + seq / 4, "seq": seq}))
        self.next += size
        return "\n".join(lines) + "\n"


async def test_a_switch_from_one_node_to_another_resumes_from_the_cursor() -> None:
    feed = Feed()
    store = viewtape.MemoryStore()
    receipts: list[dict[str, Any]] = []
    async with viewtape.Producer(NODE_A, "demo", producer_id="cluster-py", store=store) as on_a:
        for _ in range(4):
            receipts.append(await on_a.send(feed.batch(3)))
        proxy = CuttingProxy(NODE_A.removeprefix("http://"))
        url = await proxy.start()
        async with viewtape.View(url, "prices", min_delay=0.1, max_delay=1.0) as view:
            record = Record(view)
            await view.synced()
            for _ in range(4):
                receipts.append(await on_a.send(feed.batch(3)))
            await matches_server(NODE_A, view, "prices")

            proxy.retarget(NODE_B.removeprefix("http://"))
            proxy.drop_all()
            await until(lambda: len(proxy.requests) >= 2, "the reconnection to node B")
            async with viewtape.Producer(NODE_B, "demo", producer_id="cluster-py", store=store) as on_b:
                for _ in range(4):
                    receipts.append(await on_b.send(feed.batch(3)))
            await matches_server(NODE_B, view, "prices")
            await matches_server(NODE_A, view, "prices")

            assert record.resets == [], record.resets
            assert record.swaps == 1, f"one state transfer, at the start: {record.swaps}"
            record.applied_once()
            offsets = [o for c in record.live if (o := cursor_offset(c.cursor)) is not None]
            assert len(offsets) == len(record.live) == 24, f"8 batches of 3 after the state: {offsets}"
            assert offsets == list(range(offsets[0], offsets[0] + 24)), f"every offset once, in order: {offsets}"
            assert [c.value["seq"] for c in record.live] == list(range(13, 37)), "every tick once, in order"
            assert "cursor=" in proxy.lines[1], f"resumed with its cursor: {proxy.lines[1]}"
        proxy.server.close()
    assert [r["seq"] for r in receipts] == list(range(12)), receipts
    assert not any(r["duplicate"] for r in receipts), receipts
    print(f"switched nodes: offsets {offsets[0]}..{offsets[-1]} once each, no reset; node B took seq 8..11")


def cursor_offset(cursor: str | None) -> int | None:
    parsed = viewtape.parse_cursor(cursor)
    return parsed[1] if parsed else None


if __name__ == "__main__":
    os.environ["VIEWTAPE_URL"], os.environ["VIEWTAPE_URL_B"] = sys.argv[1], sys.argv[2]
    sys.exit(pytest.main([__file__, "-s", "-v", "-p", "no:cacheprovider", "-o", "asyncio_mode=auto"]))

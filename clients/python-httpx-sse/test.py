"""Python's httpx-sse against viewtape.

    python3 clients/python-httpx-sse/test.py <base-url>

Run by tests/tests/clients.rs with a config holding the demo ticker (`demo` -> `prices`) and
the `misbehave` fixture (`fixture` -> `notes`). Asserts:
 1. resume with Last-Event-ID: exactly the records after the cursor, then live, ids contiguous,
    no reset;
 2. a stale cursor (another epoch) gets `event: reset` with JSON {reason, epoch, first, next},
    then `state` entries and `synced` with the current head;
 3. a multi-line payload arrives as one event whose data is the lines joined with "\\n".
Every read has a timeout (httpx's read timeout), so nothing waits forever.
"""

import json
import random
import re
import sys

import httpx
from httpx_sse import connect_sse

KINDS = {"update", "delete", "reset", "state", "synced"}
TIMEOUT = httpx.Timeout(20.0)


def check(condition, message):
    if not condition:
        raise AssertionError(message)


def parse_cursor(text):
    m = re.fullmatch(r"([0-9a-f]{16})-(\d+)", text or "")
    check(m, f"{text!r} is not a cursor")
    return m.group(1), int(m.group(2))


class Feed:
    """Ticks for the ticker guest: one global, dense seq over all symbols."""

    def __init__(self, symbols):
        self.symbols = symbols
        self.next_seq = 1

    def symbol_of(self, seq):
        return self.symbols[(seq - 1) % len(self.symbols)]

    @staticmethod
    def price_of(seq):
        return (seq % 10000) / 4 + 1

    def batch(self, n):
        lines = []
        for _ in range(n):
            seq = self.next_seq
            self.next_seq += 1
            lines.append(json.dumps({"symbol": self.symbol_of(seq), "price": Feed.price_of(seq), "seq": seq}))
        return "".join(line + "\n" for line in lines)


def ingest(client, runtime, body):
    res = client.post(f"/runtimes/{runtime}/ingest", content=body.encode())
    check(res.status_code == 200, f"ingest into {runtime}: {res.status_code} {res.text}")


def events(client, path, last_event_id=None):
    """The viewtape events (update, delete, reset, state, synced) of one SSE response."""
    headers = {"Last-Event-ID": last_event_id} if last_event_id is not None else {}
    with connect_sse(client, "GET", path, headers=headers) as source:
        check(source.response.status_code == 200, f"GET {path}: {source.response.status_code}")
        ctype = source.response.headers.get("content-type", "")
        check(ctype.startswith("text/event-stream"), f"content-type {ctype}")
        for sse in source.iter_sse():
            if sse.event in KINDS:
                yield sse


def take(stream, n, what):
    got = []
    for sse in stream:
        got.append(sse)
        if len(got) == n:
            return got
    raise AssertionError(f"{what}: the stream ended after {len(got)} of {n} events")


def main():
    base = sys.argv[1]
    with httpx.Client(base_url=base, timeout=TIMEOUT) as client:
        feed = Feed(["ACME", "BOLT", "CRUX"])
        ingest(client, "demo", feed.batch(5))

        # 1. The tape, then resume after offset 3 with Last-Event-ID.
        stream = events(client, "/views/prices/events?from=tape")
        tape = take(stream, 5, "the tape")
        stream.close()
        epoch, _ = parse_cursor(tape[0].id)
        for i, sse in enumerate(tape):
            check(sse.event == "update" and sse.id == f"{epoch}-{i + 1}", f"tape {i}: {sse}")

        stream = events(client, "/views/prices/events", last_event_id=tape[2].id)
        missed = take(stream, 2, "the missed updates")
        ingest(client, "demo", feed.batch(3))
        live = take(stream, 3, "live updates")
        stream.close()
        for i, sse in enumerate(missed + live):
            seq = 4 + i
            check(sse.event == "update", f"resume {i}: no reset, no state: {sse}")
            check(sse.id == f"{epoch}-{seq}", f"resume {i}: id {sse.id}, want {epoch}-{seq}")
            payload = sse.json()
            check(payload["key"] == feed.symbol_of(seq), f"resume {i}: {sse.data}")
            check(payload["value"] == {"symbol": feed.symbol_of(seq), "price": Feed.price_of(seq), "seq": seq},
                  f"resume {i}: {sse.data}")
        print(f"resume: Last-Event-ID {tape[2].id} -> {' '.join(s.id for s in missed + live)}")

        # 2. A stale cursor: another epoch.
        other = epoch
        while other == epoch:
            other = "".join(random.choice("0123456789abcdef") for _ in range(16))
        stale = f"{other}-3"
        view = client.get("/views/prices").json()
        head = feed.next_seq - 1
        stream = events(client, "/views/prices/events", last_event_id=stale)
        got = take(stream, 5, "reset, 3 states, synced")
        stream.close()
        check([s.event for s in got] == ["reset", "state", "state", "state", "synced"], f"kinds: {got}")
        reset = got[0]
        check(reset.id == "", f"the reset carries an empty id: {reset.id!r}")
        body = reset.json()
        check(isinstance(body["reason"], str) and body["reason"] != "malformed", f"reason: {reset.data}")
        check(body["epoch"] == epoch and body["first"] == 1 and body["next"] == head + 1,
              f"window 1..={head} in the reset: {reset.data}")
        for sse in got[1:4]:
            state = sse.json()
            check(state["value"] == view["entries"][state["key"]], f"state {sse.data} vs {view['entries']}")
        synced = got[4]
        check(synced.id == f"{epoch}-{head}" == view["cursor"], f"synced {synced.id} at the head {view['cursor']}")
        print(f"stale cursor {stale}: reset {reset.data}, then state and synced {synced.id}")

        # 3. Multi-line data: the fixture publishes a pretty-printed JSON payload (lines split by
        # a lone CR, which the server's frame splits into data lines).
        pretty = '{\r  "title": "multi",\r  "lines": [\r    "first",\r    "second"\r  ]\r}'
        ingest(client, "fixture", f"publish notes memo {pretty}\n")
        stream = events(client, "/views/notes/events?from=tape")
        (memo,) = take(stream, 1, "the multi-line update")
        stream.close()
        want = '{"key":"memo","value":' + pretty.replace("\r", "\n") + "}"
        check(memo.data == want, f"data joined with \\n: {memo.data!r}, want {want!r}")
        check(len(memo.data.split("\n")) == 7, "seven data lines")
        check(memo.json() == {"key": "memo", "value": {"title": "multi", "lines": ["first", "second"]}}, memo.data)
        print(f"multi-line: 7 data lines joined into {memo.data!r}")
    print("PASS")


if __name__ == "__main__":
    main()

// Events per second that @viewtape/client applies to its map in Node.
//
//   node clients/js/bench/apply.mjs                      the client alone: a synthetic stream
//   node clients/js/bench/apply.mjs http://127.0.0.1:8080  also end to end from a real server
//
// The synthetic run hands the client (through its `fetch` option) a stream in the server's wire
// format: a state of KEYS keys, `synced`, then EVENTS updates in chunks of ~16 KiB, as the server
// writes them. It times from the open to the last event applied, and counts what it saw, so
// parsing (eventsource-parser), JSON decoding, the duplicate check, the map and one `change`
// listener are all in the figure. The end-to-end run ingests EVENTS ticks into the demo runtime,
// then times a view opened from the cursor before them until its cursor reaches `GET /views/prices`'s;
// EVENTS must fit in the server's replay window (`EVENTS=50000` does with the default config),
// else the view is reset and the script stops.
import { openView } from '@viewtape/client';

const EVENTS = Number(process.env.EVENTS ?? 200_000);
const KEYS = Number(process.env.KEYS ?? 1_000);
const EPOCH = '00000000deadbeef';

function syntheticStream() {
  const encoder = new TextEncoder();
  let offset = 0;
  let sent = -1;
  return new ReadableStream({
    pull(controller) {
      let chunk = '';
      if (sent < 0) {
        chunk += 'retry: 2000\n\n';
        for (let k = 0; k < KEYS; k++) chunk += `event: state\ndata: {"key":"k${k}","value":{"price":1,"seq":0}}\n\n`;
        chunk += `event: synced\nid: ${EPOCH}-0\ndata: {}\n\n`;
        sent = 0;
      }
      while (chunk.length < 16_384 && sent < EVENTS) {
        sent += 1;
        offset += 1;
        chunk += `event: update\nid: ${EPOCH}-${offset}\ndata: {"key":"k${sent % KEYS}","value":{"symbol":"k${sent % KEYS}","price":${(sent % 10_000) / 4},"seq":${sent}}}\n\n`;
      }
      if (chunk) return void controller.enqueue(encoder.encode(chunk));
      // After the last event the stream stays open, as a live one does.
      return new Promise(() => {});
    },
  });
}

async function synthetic() {
  const fetch = async () => new Response(syntheticStream(), { headers: { 'content-type': 'text/event-stream' } });
  const started = process.hrtime.bigint();
  const view = openView('http://bench.invalid', 'prices', { fetch, stallTimeout: 600_000 });
  let applied = 0;
  const last = `${EPOCH}-${EVENTS}`;
  await new Promise(resolve => {
    view.on('change', c => {
      if (!c.fromState) applied += 1;
      if (c.cursor === last) resolve();
    });
  });
  const seconds = Number(process.hrtime.bigint() - started) / 1e9;
  await view.close();
  if (applied !== EVENTS) throw new Error(`applied ${applied} of ${EVENTS}`);
  console.log(`synthetic: ${EVENTS} updates over ${KEYS} keys applied in ${seconds.toFixed(2)} s: ${Math.round(EVENTS / seconds).toLocaleString('en')} events/s`);
}

async function endToEnd(base) {
  const batch = 1_000;
  let seq = 0;
  const start = (await (await fetch(`${base}/views/prices`)).json()).cursor;
  for (let i = 0; i < EVENTS / batch; i++) {
    let body = '';
    for (let j = 0; j < batch; j++) {
      seq += 1;
      body += JSON.stringify({ symbol: `S${seq % KEYS}`, price: (seq % 10_000) / 4 + 1, seq }) + '\n';
    }
    const res = await fetch(`${base}/runtimes/demo/ingest`, { method: 'POST', body });
    if (res.status !== 200) throw new Error(`ingest: ${res.status} ${await res.text()}`);
  }
  const target = (await (await fetch(`${base}/views/prices`)).json()).cursor;
  const started = process.hrtime.bigint();
  // From the cursor before the ingest: the client replays the whole tape of EVENTS updates.
  const view = openView(base, 'prices', { cursorStore: { load: () => ({ cursor: start, entries: [] }), save: () => {} } });
  let applied = 0;
  await new Promise((resolve, reject) => {
    // A cursor older than the server's replay window gives a state transfer, not a replay.
    view.on('reset', r => reject(new Error(`reset (${r.reason}): ${EVENTS} ticks are more than the server replays; use fewer EVENTS`)));
    view.on('change', c => {
      if (!c.fromState) applied += 1;
      if (c.cursor === target) resolve();
    });
  });
  const seconds = Number(process.hrtime.bigint() - started) / 1e9;
  await view.close();
  console.log(`end to end: ${applied} updates replayed from the server and applied in ${seconds.toFixed(2)} s: ${Math.round(applied / seconds).toLocaleString('en')} events/s`);
}

await synthetic();
if (process.argv[2]) await endToEnd(process.argv[2]);

// Node's `eventsource` package (WHATWG EventSource) against viewtape.
//
//   node clients/node-eventsource/test.mjs <base-url>
//
// Run by tests/tests/clients.rs with a config holding the demo ticker (`demo` → `prices`) and
// the `misbehave` fixture (`fixture` → `notes`), on a pinned port; it restarts the server when
// this script prints `@@ctl graceful-restart`. Asserts:
//  1. resume with Last-Event-ID (sent by hand on the first request): exactly the records after
//     the cursor, then live, ids contiguous, no reset;
//  2. the library's own reconnection across a graceful restart sends Last-Event-ID and resumes
//     with no duplicate, no loss and no reset;
//  3. a stale cursor (another epoch) gets `event: reset` with JSON {reason, epoch, first, next},
//     then `state` entries and `synced` with the current head;
//  4. a multi-line payload arrives as one event whose data is the lines joined with "\n".
import { EventSource } from 'eventsource';
import { check, control, done, Feed, getJson, ingest, log, otherEpoch, parseCursor, until } from '../common.mjs';

const [base] = process.argv.slice(2);
check(base, 'usage: test.mjs <base-url>');
const WAIT = 20000;

/** An EventSource that records every event; `lastEventId` is sent on the first request. */
function subscribe(path, lastEventId) {
  const events = [];
  const es = new EventSource(`${base}${path}`, {
    fetch: (url, init) => fetch(url, {
      ...init,
      // The library's own Last-Event-ID (on reconnection) wins over the initial one.
      headers: { ...(lastEventId ? { 'Last-Event-ID': lastEventId } : {}), ...init.headers },
    }),
  });
  for (const type of ['update', 'delete', 'reset', 'state', 'synced']) {
    es.addEventListener(type, e => events.push({ type, id: e.lastEventId, data: e.data }));
  }
  es.addEventListener('open', () => events.push({ type: 'open' }));
  es.addEventListener('error', e => events.push({ type: 'error', message: e.message }));
  return { es, events, updates: () => events.filter(e => e.type === 'update') };
}

const feed = new Feed(['ACME', 'BOLT', 'CRUX']);
await ingest(base, 'demo', feed.batch(5));

// 1. The tape from the start, then resume after offset 3 with Last-Event-ID.
const tape = subscribe('/views/prices/events?from=tape');
await until(() => tape.updates().length >= 5, WAIT, '5 updates from the tape');
tape.es.close();
const ids = tape.updates().map(e => e.id);
const epoch = parseCursor(ids[0]).epoch;
ids.forEach((id, i) => check(id === `${epoch}-${i + 1}`, `tape id ${i}: ${id}`));

const resumed = subscribe('/views/prices/events', ids[2]);
await until(() => resumed.updates().length >= 2, WAIT, 'the 2 missed updates');
await ingest(base, 'demo', feed.batch(3));
await until(() => resumed.updates().length >= 5, WAIT, '3 live updates');
const checkResumed = (n, what) => {
  const u = resumed.updates();
  check(!resumed.events.some(e => e.type === 'reset' || e.type === 'state'), () => `${what}: no reset, no state: ${JSON.stringify(resumed.events)}`);
  check(u.length === n, () => `${what}: ${n} updates, got ${u.length}: ${JSON.stringify(u)}`);
  u.forEach((e, i) => {
    const seq = 4 + i;
    check(e.id === `${epoch}-${seq}`, `${what}: update ${i} id ${e.id}, want ${epoch}-${seq}`);
    const { key, value } = JSON.parse(e.data);
    check(key === feed.symbolOf(seq) && value.seq === seq && value.price === Feed.priceOf(seq), `${what}: update ${i}: ${e.data}`);
  });
};
checkResumed(5, 'resume with Last-Event-ID');
log(`resume: Last-Event-ID ${ids[2]} -> ${resumed.updates().map(e => e.id).join(' ')}`);

// 2. The same EventSource across a graceful restart: its own reconnection resumes.
await control('graceful-restart');
await ingest(base, 'demo', feed.batch(2)); // missed while it reconnects
await until(() => resumed.events.filter(e => e.type === 'open').length >= 2, WAIT, 'the reconnection');
await ingest(base, 'demo', feed.batch(2)); // live
await until(() => resumed.updates().length >= 9, WAIT, '4 updates after the restart');
await new Promise(r => setTimeout(r, 300));
checkResumed(9, 'reconnection across a graceful restart');
check(resumed.events.some(e => e.type === 'error'), 'the stream dropped during the restart');
resumed.es.close();
log(`graceful restart: the library reconnected and resumed through ${resumed.updates().at(-1).id}`);

// 3. A stale cursor: another epoch.
const stale = `${otherEpoch(epoch)}-3`;
const view = await getJson(base, '/views/prices');
const reset = subscribe('/views/prices/events', stale);
await until(() => reset.events.some(e => e.type === 'synced'), WAIT, 'reset, state, synced');
reset.es.close();
const kinds = reset.events.filter(e => e.type !== 'open').map(e => e.type);
check(JSON.stringify(kinds) === JSON.stringify(['reset', 'state', 'state', 'state', 'synced']),
  () => `reset, 3 states, synced: ${JSON.stringify(reset.events)}`);
const r = reset.events.find(e => e.type === 'reset');
check(r.id === '', `the reset carries an empty id: ${JSON.stringify(r.id)}`);
const body = JSON.parse(r.data);
check(typeof body.reason === 'string' && body.reason !== 'malformed', `reason: ${r.data}`);
const head = feed.nextSeq - 1; // one record per tick, one epoch throughout
check(body.epoch === epoch && body.first === 1 && body.next === head + 1, `window 1..=${head} in the reset: ${r.data}`);
const synced = reset.events.find(e => e.type === 'synced');
check(synced.id === `${epoch}-${head}` && synced.id === view.cursor, `synced at the head ${view.cursor}: ${synced.id}`);
for (const s of reset.events.filter(e => e.type === 'state')) {
  const { key, value } = JSON.parse(s.data);
  check(JSON.stringify(value) === JSON.stringify(view.entries[key]), `state ${key}: ${s.data} vs ${JSON.stringify(view.entries[key])}`);
}
log(`stale cursor ${stale}: reset ${r.data}, then state and synced ${synced.id}`);

// 4. Multi-line data: the fixture publishes a pretty-printed JSON payload (lines split by a
// lone CR, which the fixture's line splitting keeps and the server's frame splits into data lines).
const pretty = '{\r  "title": "multi",\r  "lines": [\r    "first",\r    "second"\r  ]\r}';
await ingest(base, 'fixture', `publish notes memo ${pretty}\n`);
const notes = subscribe('/views/notes/events?from=tape');
await until(() => notes.updates().length >= 1, WAIT, 'the multi-line update');
notes.es.close();
const memo = notes.updates()[0];
const want = `{"key":"memo","value":${pretty.replaceAll('\r', '\n')}}`;
check(memo.data === want, `data joined with \\n: ${JSON.stringify(memo.data)}, want ${JSON.stringify(want)}`);
check(memo.data.split('\n').length === 7, 'seven data lines');
const parsed = JSON.parse(memo.data);
check(parsed.key === 'memo' && parsed.value.title === 'multi' && parsed.value.lines.join() === 'first,second', memo.data);
log(`multi-line: ${memo.data.split('\n').length} data lines joined into ${JSON.stringify(memo.data)}`);

done();

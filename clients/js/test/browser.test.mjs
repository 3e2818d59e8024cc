// @viewtape/client in headless Chromium (Debian's /usr/bin/chromium via playwright-core):
// `node clients/js/test/browser.test.mjs <base-url>`, run by tests/tests/clients.rs. The page is
// served on the server's origin by request interception: the built ESM from clients/js/dist and
// eventsource-parser through an import map. Asserts:
//  1. a hidden tab releases its connection (the server's `viewtape_sse_connections` drops to 0),
//     applies nothing while hidden, and when shown again resumes from its cursor: every event
//     once, no reset, the map equal to `GET /views/prices`;
//  2. a reload resumes from the cursor and state kept in localStorage: no state transfer, no
//     reset, and the events ingested while the page was away arrive once; and the same with
//     `indexedDbStore`: IndexedDB holds the cursor and state at close, and after the reload the
//     stored state is back before any connection, the one connection asks from the stored
//     cursor, and the server's metrics count a resumed stream and no state transfer;
//  3. `useView` (React 19, bundled for the test with esbuild, in StrictMode): two components on
//     one view share one stream, both render the server's state at its cursor, and the stream
//     is closed once both unmount.
import { readFileSync } from 'node:fs';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { after, test } from 'node:test';
import { fileURLToPath } from 'node:url';
import { createRequire } from 'node:module';

import { build } from 'esbuild';
import { chromium } from 'playwright-core';

import { check, done, Feed, getJson, ingest, log } from '../../common.mjs';

const base = process.argv[2];
check(base, 'usage: browser.test.mjs <base-url>');
const WAIT = 30000;
const here = dirname(fileURLToPath(import.meta.url));
const dist = join(here, '..', 'dist');
const parserDist = dirname(createRequire(import.meta.url).resolve('eventsource-parser'));
const profile = mkdtempSync(join(tmpdir(), 'viewtape-chromium-'));
const context = await chromium.launchPersistentContext(profile, {
  executablePath: '/usr/bin/chromium',
  headless: true,
  args: ['--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
    '--disable-background-networking', '--disable-component-update', '--disable-sync'],
});
after(async () => {
  await context.close().catch(() => {});
  rmSync(profile, { recursive: true, force: true });
  done();
});

const PAGE = `<!doctype html><meta charset="utf-8"><title>client test</title>
<script type="importmap">{"imports": {"eventsource-parser": "/__client/parser/index.js"}}</script>
<script type="module">
import * as client from '/__client/dist/index.js';
window.client = client;
window.hidden = false;
Object.defineProperty(document, 'visibilityState', { configurable: true, get: () => window.hidden ? 'hidden' : 'visible' });
window.setHidden = hidden => { window.hidden = hidden; document.dispatchEvent(new Event('visibilitychange')); };
window.open = (store = 'localStorage') => {
  const cursorStore = store === 'indexedDB' ? client.indexedDbStore(IDB) : client.localStorageStore();
  const view = client.openView(location.origin, 'prices', { cursorStore, releaseWhenHiddenAfter: 1000, minDelay: 100, maxDelay: 1000, saveInterval: 100 });
  window.view = view;
  window.record = { live: [], swaps: 0, resets: 0, statuses: [], connected: [], restored: 0 };
  view.on('connected', ({ url }) => window.record.connected.push(url));
  view.on('change', c => {
    if (!c.fromState) window.record.live.push({ cursor: c.cursor, seq: c.value?.seq });
    else if (window.record.connected.length === 0) window.record.restored += 1;
  });
  view.on('synced', () => { window.record.swaps += 1; });
  view.on('reset', () => { window.record.resets += 1; });
  view.on('status', s => window.record.statuses.push(s));
  return view.synced().then(() => true);
};
const IDB = 'viewtape-browser-test';
window.readIdb = key => new Promise((resolve, reject) => {
  const open = indexedDB.open(IDB);
  open.onerror = () => reject(open.error);
  open.onsuccess = () => {
    const db = open.result;
    const get = db.transaction('kv', 'readonly').objectStore('kv').get(key);
    get.onsuccess = () => { db.close(); resolve(get.result ?? null); };
    get.onerror = () => { db.close(); reject(get.error); };
  };
});
window.snapshot = () => ({ cursor: window.view.cursor, state: Object.fromEntries(window.view.state), status: window.view.status, record: window.record });
window.ready = true;
</script>`;

const REACT_APP = `
import { createElement as h, StrictMode, useState } from 'react';
import { createRoot } from 'react-dom/client';
import { useView } from '@viewtape/client/react';
window.renders = {};
function Rows({ id }) {
  const { state, status, cursor, error } = useView('prices', { minDelay: 100 });
  window.renders[id] = { status, cursor, error: error?.code ?? null, state: Object.fromEntries(state) };
  return h('ul', { id }, [...state].map(([key, tick]) => h('li', { key }, key + ' ' + tick.seq)));
}
function App() {
  const [shown, setShown] = useState(true);
  window.unmountAll = () => setShown(false);
  return shown ? h('div', null, h(Rows, { id: 'a' }), h(Rows, { id: 'b' })) : h('p', null, 'none');
}
createRoot(document.getElementById('root')).render(h(StrictMode, null, h(App)));
`;
const reactBundle = (await build({
  stdin: { contents: REACT_APP, resolveDir: here, loader: 'js' },
  bundle: true, write: false, format: 'esm', logLevel: 'warning',
  define: { 'process.env.NODE_ENV': '"development"' },
})).outputFiles[0].text;

await context.route(`${base}/__client/**`, route => {
  const path = new URL(route.request().url()).pathname;
  if (path === '/__client/test.html') return route.fulfill({ contentType: 'text/html', body: PAGE });
  if (path === '/__client/react.html') return route.fulfill({ contentType: 'text/html', body: '<!doctype html><div id="root"></div><script type="module" src="/__client/react.js"></script>' });
  if (path === '/__client/react.js') return route.fulfill({ contentType: 'text/javascript', body: reactBundle });
  const [, , kind, ...rest] = path.split('/');
  const file = join(kind === 'dist' ? dist : parserDist, ...rest);
  return route.fulfill({ contentType: 'text/javascript', body: readFileSync(file) });
});

async function openPage(store = 'localStorage') {
  const page = await context.newPage();
  page.on('pageerror', e => log(`[page error] ${e}`));
  await page.goto(`${base}/__client/test.html`, { timeout: WAIT });
  await page.waitForFunction(() => window.ready === true, undefined, { timeout: WAIT });
  await page.evaluate(store => window.open(store), store);
  return page;
}

async function metric(pattern) {
  const text = await (await fetch(`${base}/metrics`, { signal: AbortSignal.timeout(10000) })).text();
  const line = text.split('\n').find(l => pattern.test(l));
  check(line, `${pattern} on /metrics`);
  return Number(line.split(' ').at(-1));
}

const sseConnections = () => metric(/^viewtape_sse_connections /);
/** Streams the server opened with a state transfer, and from a cursor. */
const stateStarts = () => metric(/^viewtape_streams_total\{outcome="state"\} /);
const resumes = () => metric(/^viewtape_streams_total\{outcome="resumed"\} /);

/** The page's map equals GET /views/prices at the same cursor; each cursor applied once. */
async function checkPage(page) {
  let server;
  const deadline = Date.now() + WAIT;
  for (;;) {
    server = await getJson(base, '/views/prices');
    const mine = await page.evaluate(() => window.snapshot());
    if (mine.cursor === server.cursor) {
      check(JSON.stringify(Object.entries(mine.state).sort()) === JSON.stringify(Object.entries(server.entries).sort()), 'the map equals the server\'s');
      const cursors = mine.record.live.map(c => c.cursor);
      check(new Set(cursors).size === cursors.length, 'each cursor applied once');
      const seqs = mine.record.live.map(c => c.seq);
      check(seqs.every((s, i) => i === 0 || s === seqs[i - 1] + 1), () => `every tick once, in order: ${seqs}`);
      check(mine.record.resets === 0, 'no reset');
      return mine;
    }
    check(Date.now() < deadline, `the page at ${mine.cursor} never reached ${server.cursor}`);
    await new Promise(r => setTimeout(r, 50));
  }
}

const feed = new Feed(['ACME', 'BOLT', 'CRUX', 'DYNE']);

test('a hidden tab releases its connection and resumes exactly when shown', async () => {
  await ingest(base, 'demo', feed.batch(4));
  const page = await openPage();
  await ingest(base, 'demo', feed.batch(5));
  await checkPage(page);
  check((await sseConnections()) === 1, 'one stream open');
  await page.evaluate(() => window.setHidden(true));
  await page.waitForFunction(() => window.view.status === 'paused', undefined, { timeout: WAIT });
  const cursor = await page.evaluate(() => window.view.cursor);
  const deadline = Date.now() + 5000;
  while ((await sseConnections()) !== 0) {
    check(Date.now() < deadline, 'the hidden tab released its connection');
    await new Promise(r => setTimeout(r, 50));
  }
  await ingest(base, 'demo', feed.batch(6));
  await new Promise(r => setTimeout(r, 500));
  check((await page.evaluate(() => window.view.cursor)) === cursor, 'nothing applied while hidden');
  await page.evaluate(() => window.setHidden(false));
  const mine = await checkPage(page);
  check(mine.status === 'live' && mine.record.swaps === 1, `live again, no new state transfer: ${JSON.stringify(mine.record.statuses)}`);
  log(`hidden and shown: ${mine.record.live.length} ticks once each, statuses ${mine.record.statuses.join(' → ')}`);
  await page.close();
});

test('a reload resumes from the cursor and state kept in localStorage', async () => {
  const page = await openPage();
  await checkPage(page);
  const before = await page.evaluate(() => window.snapshot());
  await page.evaluate(() => window.view.close());
  await ingest(base, 'demo', feed.batch(3));
  await page.reload();
  await page.waitForFunction(() => window.ready === true, undefined, { timeout: WAIT });
  await page.evaluate(() => window.open());
  const after = await checkPage(page);
  check(after.record.swaps === 0, 'no state transfer after the reload');
  check(after.record.live.length === 3 && after.record.live[0].seq === Object.values(before.state).reduce((m, v) => Math.max(m, v.seq), 0) + 1,
    () => `the 3 ticks ingested while away, once: ${JSON.stringify(after.record.live)}`);
  await page.close();
});

test('a reload resumes from the cursor and state kept in IndexedDB: the server transfers no state', async () => {
  await ingest(base, 'demo', feed.batch(4));
  const page = await openPage('indexedDB');
  const before = await checkPage(page);
  check(Object.keys(before.state).length === 4, () => `four symbols to keep: ${JSON.stringify(before.state)}`);
  check(before.record.swaps === 1 && before.record.connected.length === 1 && !before.record.connected[0].includes('cursor='),
    () => `a fresh IndexedDB store: one state transfer first: ${JSON.stringify(before.record)}`);
  await page.evaluate(() => window.view.close());
  const stored = await page.evaluate(() => window.readIdb('prices'));
  check(stored?.cursor === before.cursor, () => `IndexedDB holds the cursor at close: ${stored?.cursor} vs ${before.cursor}`);
  check(JSON.stringify(Object.fromEntries(stored.entries)) === JSON.stringify(before.state), 'IndexedDB holds the state at that cursor');
  await ingest(base, 'demo', feed.batch(3));
  const [states, resumed] = [await stateStarts(), await resumes()];
  await page.reload();
  await page.waitForFunction(() => window.ready === true, undefined, { timeout: WAIT });
  await page.evaluate(() => window.open('indexedDB'));
  const after = await checkPage(page);
  check(after.record.restored === Object.keys(before.state).length, () => `the stored state came back before any connection: ${after.record.restored} keys`);
  check(after.record.connected.length === 1 && after.record.connected[0].includes(`cursor=${encodeURIComponent(before.cursor)}`),
    () => `one connection, from the stored cursor: ${after.record.connected}`);
  check(after.record.swaps === 0, 'no state transfer after the reload');
  const [statesAfter, resumedAfter] = [await stateStarts(), await resumes()];
  check(statesAfter === states && resumedAfter === resumed + 1,
    `the server resumed one stream and started none from state: state ${states} → ${statesAfter}, resumed ${resumed} → ${resumedAfter}`);
  const lastSeq = Object.values(before.state).reduce((m, v) => Math.max(m, v.seq), 0);
  check(after.record.live.length === 3 && after.record.live.every((c, i) => c.seq === lastSeq + 1 + i),
    () => `the 3 ticks ingested while away, once: ${JSON.stringify(after.record.live)}`);
  log(`IndexedDB: reload resumed at ${before.cursor} with ${after.record.restored} stored keys, 3 ticks applied once, no state transfer`);
  await page.close();
});

test('useView: components on one view share one stream, and it closes after they unmount', async () => {
  const page = await context.newPage();
  page.on('pageerror', e => log(`[page error] ${e}`));
  await page.goto(`${base}/__client/react.html`, { timeout: WAIT });
  await ingest(base, 'demo', feed.batch(4));
  const server = await getJson(base, '/views/prices');
  await page.waitForFunction(cursor => ['a', 'b'].every(id => window.renders[id]?.cursor === cursor), server.cursor, { timeout: WAIT });
  const renders = await page.evaluate(() => window.renders);
  for (const id of ['a', 'b']) {
    check(renders[id].status === 'live', `${id} is live: ${renders[id].status}`);
    check(JSON.stringify(Object.entries(renders[id].state).sort()) === JSON.stringify(Object.entries(server.entries).sort()), `${id} renders the server's state`);
  }
  check((await sseConnections()) === 1, `one stream for both components: ${await sseConnections()}`);
  await page.evaluate(() => window.unmountAll());
  const deadline = Date.now() + 10000;
  while ((await sseConnections()) !== 0) {
    check(Date.now() < deadline, 'the shared stream closed after both unmounted');
    await new Promise(r => setTimeout(r, 100));
  }
  log('useView: two components, one stream, closed after unmount');
  await page.close();
});

// Headless Chromium (Debian's /usr/bin/chromium, driven by playwright-core) on the demo page.
//
//   node clients/browser/test.mjs <base-url> <screenshot.png>
//
// Run by tests/tests/clients.rs, which serves <base-url> on a pinned port and restarts the
// server when this script prints `@@ctl graceful-restart`, `@@ctl kill9-restart` or
// `@@ctl kill9-lose-log-restart`.
//
// An init script wraps the page's `EventSource` so every event it receives (update, delete,
// reset, state, synced, open, error) is recorded in `window.__events`; the page's own handlers
// run unchanged. Asserts:
//  1. live updates reach the page;
//  2. after a graceful stop and restart, the browser's own reconnection (Last-Event-ID) resumes
//     with no reset, no duplicate and no loss: update ids contiguous in one epoch, seq in order;
//  3. after kill -9 and restart, the same: the log carries every acknowledged batch and the epoch;
//  4. after kill -9 with the log lost, the page gets exactly one reset (JSON
//     reason/epoch/first/next), then the state and `synced` in a new epoch, follows live again,
//     and its table ends with exactly the rows `GET /views/prices` has.
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { chromium } from 'playwright-core';
import { check, control, done, Feed, getJson, ingest, log, parseCursor } from '../common.mjs';

const [base, screenshot] = process.argv.slice(2);
check(base && screenshot, 'usage: test.mjs <base-url> <screenshot.png>');
const WAIT = 30000;

const profile = mkdtempSync(join(tmpdir(), 'viewtape-chromium-'));
const browser = await chromium.launchPersistentContext(profile, {
  executablePath: '/usr/bin/chromium',
  headless: true,
  args: ['--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
    '--disable-background-networking', '--disable-component-update', '--disable-sync'],
  viewport: { width: 900, height: 560 },
});
try {
  await run(browser);
} finally {
  await browser.close().catch(() => {});
  rmSync(profile, { recursive: true, force: true });
}
done();

async function run(context) {
  await context.addInitScript(() => {
    window.__events = [];
    const Native = window.EventSource;
    window.EventSource = class extends Native {
      constructor(url, init) {
        super(url, init);
        const record = type => e => window.__events.push({ type, id: e.lastEventId ?? null, data: e.data ?? null });
        for (const type of ['update', 'delete', 'reset', 'state', 'synced']) this.addEventListener(type, record(type));
        this.addEventListener('open', () => window.__events.push({ type: 'open' }));
        this.addEventListener('error', () => window.__events.push({ type: 'error', readyState: this.readyState }));
      }
    };
  });
  const page = await context.newPage();
  page.on('console', m => log(`[page console] ${m.text()}`));
  page.on('pageerror', e => log(`[page error] ${e}`));
  const events = () => page.evaluate(() => window.__events);
  const count = type => page.evaluate(t => window.__events.filter(e => e.type === t).length, type);
  const waitFor = (expr, arg, what) =>
    page.waitForFunction(expr, arg, { timeout: WAIT, polling: 50 }).catch(e => {
      throw new Error(`waiting for ${what}: ${e.message}`);
    });
  const waitUpdates = n => waitFor(n => window.__events.filter(e => e.type === 'update').length >= n, n, `${n} updates`);

  const feed = new Feed(['ACME', 'BOLT', 'CRUX', 'DYNE', 'EMBR']);
  await ingest(base, 'demo', feed.batch(6));

  // 1. The page: the state (5 symbols), `synced`, then live updates.
  await page.goto(`${base}/`, { timeout: WAIT });
  await waitFor(() => window.__events.some(e => e.type === 'synced'), undefined, 'synced');
  let log0 = await events();
  check(log0.filter(e => e.type === 'state').length === 5, () => `5 state entries: ${JSON.stringify(log0)}`);
  const synced = parseCursor(log0.find(e => e.type === 'synced').id);
  check(synced.offset === 6, `synced at offset 6: ${JSON.stringify(synced)}`);
  await ingest(base, 'demo', feed.batch(5));
  await ingest(base, 'demo', feed.batch(5));
  await waitUpdates(10);
  log(`live: 10 updates after synced ${synced.epoch}-${synced.offset}`);

  // 2. Graceful stop and restart: the browser reconnects by itself with Last-Event-ID.
  const opensBefore = await count('open');
  await control('graceful-restart');
  await ingest(base, 'demo', feed.batch(10)); // missed while reconnecting: replayed from the tape
  await waitFor(n => window.__events.filter(e => e.type === 'open').length > n, opensBefore, 'the reconnection');
  await ingest(base, 'demo', feed.batch(5)); // live after the resume
  await waitUpdates(25);
  await new Promise(r => setTimeout(r, 500)); // anything extra would show up now
  log0 = await events();
  check(!log0.some(e => e.type === 'reset'), () => `no reset after a graceful restart: ${JSON.stringify(log0)}`);
  check(log0.some(e => e.type === 'error'), 'the stream really dropped (an error event) during the restart');
  const updates = log0.filter(e => e.type === 'update');
  check(updates.length === 25, () => `exactly 25 updates (no duplicate): ${updates.length}`);
  updates.forEach((u, i) => {
    const c = parseCursor(u.id);
    check(c.epoch === synced.epoch && c.offset === synced.offset + 1 + i,
      () => `update ${i}: id ${u.id}, want ${synced.epoch}-${synced.offset + 1 + i}`);
    const { key, value } = JSON.parse(u.data);
    const seq = 7 + i;
    check(value.seq === seq && key === feed.symbolOf(seq) && value.price === Feed.priceOf(seq),
      () => `update ${i}: ${u.data}, want seq ${seq}`);
  });
  log(`graceful restart: resumed, 25 updates contiguous ${updates[0].id} .. ${updates.at(-1).id}, no reset`);
  await compareRows(page, 'after the graceful restart');
  await page.evaluate(() => refreshViews()); // the page's views table, current for the picture
  await page.waitForTimeout(700); // let the row highlight fade
  await page.screenshot({ path: screenshot });
  log(`screenshot: ${screenshot}`);

  // 3. kill -9 and restart: the log replays every acknowledged batch under the same epoch; the
  //    browser resumes with no reset.
  const opensBeforeKill = await count('open');
  await control('kill9-restart');
  await ingest(base, 'demo', feed.batch(5));
  await waitFor(n => window.__events.filter(e => e.type === 'open').length > n, opensBeforeKill, 'the reconnection after kill -9');
  await waitUpdates(30);
  await new Promise(r => setTimeout(r, 500));
  log0 = await events();
  check(!log0.some(e => e.type === 'reset'), () => `no reset after kill -9: ${JSON.stringify(log0)}`);
  const afterKill = log0.filter(e => e.type === 'update');
  check(afterKill.length === 30, () => `exactly 30 updates after kill -9 (no duplicate): ${afterKill.length}`);
  afterKill.forEach((u, i) => {
    const c = parseCursor(u.id);
    check(c.epoch === synced.epoch && c.offset === synced.offset + 1 + i,
      () => `update ${i}: id ${u.id}, want ${synced.epoch}-${synced.offset + 1 + i}`);
  });
  log(`kill -9: resumed, 30 updates contiguous to ${afterKill.at(-1).id}, no reset`);

  // 4. kill -9 with the log lost: the old cursor cannot be vouched for; the page gets one reset.
  const before = log0.length;
  await control('kill9-lose-log-restart');
  await waitFor(n => window.__events.slice(n).some(e => e.type === 'synced'), before, 'synced after the reset');
  let after = (await events()).slice(before);
  const resets = after.filter(e => e.type === 'reset');
  check(resets.length === 1, () => `exactly one reset after kill -9: ${JSON.stringify(after)}`);
  const reset = JSON.parse(resets[0].data);
  check(typeof reset.reason === 'string' && reset.reason !== 'malformed', `reset reason: ${resets[0].data}`);
  check(/^[0-9a-f]{16}$/.test(reset.epoch) && Number.isInteger(reset.first) && Number.isInteger(reset.next),
    `reset carries epoch/first/next: ${resets[0].data}`);
  const resynced = parseCursor(after.find(e => e.type === 'synced').id);
  check(resynced.epoch !== synced.epoch, 'a fresh epoch after the log was lost');
  check(resynced.epoch === reset.epoch, `synced in the reset's epoch: ${JSON.stringify(resynced)} vs ${resets[0].data}`);
  await compareRows(page, 'after the reset');

  // Live again, from whatever the restored guest last saw.
  const view = await getJson(base, '/views/prices');
  const lastSeq = Math.max(0, ...Object.values(view.entries).map(v => v.seq));
  const live = new Feed(feed.symbols, lastSeq + 1);
  await ingest(base, 'demo', live.batch(3));
  await waitFor(n => window.__events.slice(n).filter(e => e.type === 'update').length >= 3, before, '3 live updates after the reset');
  await new Promise(r => setTimeout(r, 500));
  after = (await events()).slice(before);
  check(after.filter(e => e.type === 'reset').length === 1, () => `still exactly one reset: ${JSON.stringify(after)}`);
  const liveUpdates = after.filter(e => e.type === 'update');
  check(liveUpdates.length === 3, () => `3 live updates: ${JSON.stringify(liveUpdates)}`);
  liveUpdates.forEach((u, i) => {
    const c = parseCursor(u.id);
    check(c.epoch === resynced.epoch && c.offset === resynced.offset + 1 + i, `live update ${i}: ${u.id} after ${resynced.offset}`);
  });
  const rows = await compareRows(page, 'at the end');
  check(await page.textContent('#resets') === '1', 'the page counts one reset');
  log(`log lost: one reset (${reset.reason}), synced ${resynced.epoch}-${resynced.offset}, ${rows} rows match GET /views/prices`);
}

/** The page's table equals `GET /views/prices` (symbol, price to 2 places, seq). */
async function compareRows(page, when) {
  const view = await getJson(base, '/views/prices');
  const want = Object.entries(view.entries)
    .map(([k, v]) => [k, v.price.toFixed(2), String(v.seq)])
    .sort((a, b) => a[0].localeCompare(b[0]));
  // The page may still be applying the last events: wait for the table to settle on the same rows.
  const deadline = Date.now() + 10000;
  let got;
  for (;;) {
    got = await page.$$eval('#prices tbody tr', trs => trs.map(tr => [...tr.cells].map(td => td.textContent)));
    got.sort((a, b) => a[0].localeCompare(b[0]));
    if (JSON.stringify(got) === JSON.stringify(want)) return got.length;
    if (Date.now() > deadline) break;
    await new Promise(r => setTimeout(r, 50));
  }
  check(false, `page rows ${when}: ${JSON.stringify(got)}, GET /views/prices: ${JSON.stringify(want)}`);
}

// Headless Chromium (Debian's /usr/bin/chromium, driven by playwright-core), two ways:
//
//   node clients/browser/test.mjs <base-url> <screenshot.png>   the demo page, auth off
//   node clients/browser/test.mjs <base-url> --auth <secret>    auth on: cookies and reauth
//
// Run by tests/tests/clients.rs, which serves <base-url> on a pinned port and restarts the
// server when this script prints `@@ctl graceful-restart`, `@@ctl kill9-restart` or
// `@@ctl kill9-lose-log-restart`.
//
// An init script wraps the page's `EventSource` so every event it receives (update, delete,
// reset, state, synced, reauth, open with the URL, error with the readyState) is recorded in
// `window.__events`, and records what the demo page's client view does in the same shape; the
// page's own handlers run unchanged.
//
// The demo page (which follows `prices` with @viewtape/client when the URL names no other view;
// clients/browser/views.mjs tests its choice of view), auth off. Asserts:
//  1. live updates reach the page;
//  2. after a graceful stop and restart, the client's reconnection (`?cursor=`) resumes
//     with no reset, no duplicate and no loss: update ids contiguous in one epoch, seq in order;
//  3. after kill -9 and restart, the same: the log carries every acknowledged batch and the epoch;
//  4. after kill -9 with the log lost, the page gets exactly one reset (JSON
//     reason/epoch/first/next), then the state and `synced` in a new epoch, follows live again,
//     and its table ends with exactly the rows `GET /views/prices` has.
//
// Auth on (`--auth`: the server has VIEWTAPE_JWT_SECRET=<secret> and `[auth] audience =
// "viewtape"`; this script signs its own HS256 tokens with the secret). Asserts:
//  5. without the cookie `viewtape_token`, or with a refused token in it (expired, another view),
//     an EventSource gets an error, ends CLOSED and receives no event; a fetch of the stream
//     from the page gets 401 (403 for the other view) with `WWW-Authenticate: Bearer`;
//  6. a bare EventSource with a 3 s token in the cookie: at expiry the server sends `reauth` and
//     ends the response; the page sets a fresh cookie and the browser reconnects by itself (two
//     rounds); every event of the tape arrives exactly once and in order (offsets 1..n, events
//     ingested while it was away included), with no reset, and the browser never closed it;
//  7. the demo page with a `window.viewtapeToken` hook and no cookie: it asks the hook for a token
//     first and sends it as `Authorization: Bearer`; on each `reauth` it shows "token expired —
//     renewing", gets a fresh token and reopens from its cursor (`?cursor=`); when the token it got
//     is refused (401) it says so, asks again and reopens from its cursor. Updates stay contiguous
//     after `synced` across all of it, no reset, and its table ends with the rows `GET
//     /views/prices` has;
//  8. @viewtape/client in cookie mode, imported from /viewtape-client.js: the cookie set before
//     each connection and renewed at each reauth, every event once and in order.
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { chromium } from 'playwright-core';
import { check, control, done, Feed, getJson, hs256, ingest, log, parseCursor } from '../common.mjs';

const [base, ...rest] = process.argv.slice(2);
const secret = rest[0] === '--auth' ? rest[1] : null;
const screenshot = secret === null ? rest[0] : null;
check(base && (secret || screenshot), 'usage: test.mjs <base-url> <screenshot.png> | test.mjs <base-url> --auth <secret>');
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
  await recordEventSources(browser);
  if (secret === null) await run(browser);
  else await runWithAuth(browser);
} finally {
  await browser.close().catch(() => {});
  rmSync(profile, { recursive: true, force: true });
}
done();

/**
 * Every page records in `window.__events` what its `EventSource`s receive (update, delete, reset,
 * state, synced, reauth, open with the URL, error with the readyState), and what the demo page's
 * `@viewtape/client` view (`window.viewtapeView`) does, in the same shape: applied updates and
 * deletes with their cursors, the state it swapped in, synced, reset, reauth, each stream it
 * opened (with the URL) and each error (with its code).
 */
async function recordEventSources(context) {
  await context.addInitScript(() => {
    window.__events = [];
    const Native = window.EventSource;
    window.EventSource = class extends Native {
      constructor(url, init) {
        super(url, init);
        const record = type => e => window.__events.push({ type, id: e.lastEventId ?? null, data: e.data ?? null });
        for (const type of ['update', 'delete', 'reset', 'state', 'synced', 'reauth']) this.addEventListener(type, record(type));
        this.addEventListener('open', () => window.__events.push({ type: 'open', url: this.url }));
        this.addEventListener('error', () => window.__events.push({ type: 'error', readyState: this.readyState }));
      }
    };
    let view;
    Object.defineProperty(window, 'viewtapeView', {
      configurable: true,
      get: () => view,
      set: v => {
        view = v;
        const push = e => window.__events.push(e);
        v.on('connected', ({ url }) => push({ type: 'open', url }));
        v.on('change', c => {
          if (c.fromState) { if (!c.deleted) push({ type: 'state', id: null, data: JSON.stringify({ key: c.key, value: c.value }) }); return; }
          push({ type: c.deleted ? 'delete' : 'update', id: c.cursor, data: JSON.stringify(c.deleted ? { key: c.key } : { key: c.key, value: c.value }) });
        });
        v.on('synced', ({ cursor }) => push({ type: 'synced', id: cursor, data: null }));
        v.on('reset', r => push({ type: 'reset', id: '', data: JSON.stringify(r) }));
        v.on('reauth', () => push({ type: 'reauth', id: null, data: null }));
        v.on('error', e => push({ type: 'error', code: e.code }));
      },
    });
  });
}

async function run(context) {
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

/** The page's table equals `GET /views/prices`: the key, then a column per field of the values
 * (`price` and `seq` among them), numbers that are not integers to 2 places. */
async function compareRows(page, when, headers = {}) {
  const view = await getJson(base, '/views/prices', headers);
  const cell = v => (typeof v === 'number' ? (Number.isInteger(v) ? String(v) : v.toFixed(2)) : typeof v === 'string' ? v : JSON.stringify(v ?? ''));
  // The page may still be applying the last events: wait for the table to settle on the same rows.
  const deadline = Date.now() + 10000;
  let got, want, head;
  for (;;) {
    head = await page.$$eval('#entries thead th', ths => ths.map(th => th.textContent));
    want = Object.entries(view.entries)
      .map(([k, v]) => [k, ...head.slice(1).map(field => cell(v[field]))])
      .sort((a, b) => a[0].localeCompare(b[0]));
    got = await page.$$eval('#entries tbody tr', trs => trs.map(tr => [...tr.cells].map(td => td.textContent)));
    got.sort((a, b) => a[0].localeCompare(b[0]));
    const columns = head[0] === 'key' && head.includes('price') && head.includes('seq');
    if (columns && JSON.stringify(got) === JSON.stringify(want)) return got.length;
    if (Date.now() > deadline) break;
    await new Promise(r => setTimeout(r, 50));
  }
  check(false, `page rows ${when} (columns ${head}): ${JSON.stringify(got)}, GET /views/prices: ${JSON.stringify(want)}`);
}

function sleep(ms) {
  return new Promise(r => setTimeout(r, ms));
}

function nowSeconds() {
  return Math.floor(Date.now() / 1000);
}

/** A JWT over `claims`, signed HS256 with `key` (the server's secret unless told). */
function jwt(claims, key = secret) {
  return hs256(key, claims);
}

/** A reader's token for `views`, valid for `seconds` from now (negative: expired). */
function readToken(seconds, views = ['prices']) {
  return jwt({ exp: nowSeconds() + seconds, aud: 'viewtape', views });
}

/** Sets the cookie a same-origin `EventSource` sends, as a page script would. */
function setCookie(page, token) {
  return page.evaluate(t => { document.cookie = `viewtape_token=${t}; path=/; SameSite=Strict`; }, token);
}

/** The events `page` recorded, without `update`s, as `open`, `error0` (readyState), …. */
function shape(events) {
  return events.filter(e => e.type !== 'update' && e.type !== 'state')
    .map(e => (e.type === 'error' ? `error${e.readyState ?? `:${e.code}`}` : e.type));
}

/** Updates are exactly offsets `from`..`to` of one epoch, in order, with the feed's ticks. */
function contiguous(updates, from, to, epoch, feed, what) {
  check(updates.length === to - from + 1,
    () => `${what}: ${to - from + 1} updates (offsets ${from}..${to}), got ${updates.length}: ${updates.map(u => u.id).join(' ')}`);
  updates.forEach((u, i) => {
    const c = parseCursor(u.id);
    check(c.epoch === epoch && c.offset === from + i, () => `${what}: update ${i}: id ${u.id}, want ${epoch}-${from + i}`);
    // One tick per offset in this view: offset n carries seq n.
    const { key, value } = JSON.parse(u.data);
    check(value.seq === from + i && key === feed.symbolOf(from + i) && value.price === Feed.priceOf(from + i),
      () => `${what}: update ${i}: ${u.data}, want seq ${from + i}`);
  });
}

/**
 * Publishes ticks while `page` follows, until it has received `rounds` reauths. Right after
 * each reauth it publishes 3 more ticks and counts the rounds in which they were durable before
 * the browser was back (no new `open`): those events can only arrive by the replay after the
 * cursor the browser sends.
 */
async function throughReauths(page, rounds, feed, writer) {
  const deadline = Date.now() + WAIT;
  let away = 0;
  for (let i = 0, round = 0; round < rounds; i++) {
    const seen = await page.evaluate(() => window.__events);
    check(Date.now() < deadline && i < 1000, () => `${rounds} reauths within ${WAIT} ms: ${JSON.stringify(shape(seen))}`);
    if (seen.filter(e => e.type === 'reauth').length > round) {
      const opens = seen.filter(e => e.type === 'open').length;
      await ingest(base, 'demo', feed.batch(3), writer);
      if (await page.evaluate(() => window.__events.filter(e => e.type === 'open').length) === opens) away++;
      round++;
    } else {
      await ingest(base, 'demo', feed.batch(1), writer); // live traffic meanwhile
      await sleep(150);
    }
  }
  return away;
}

async function runWithAuth(context) {
  const writer = { authorization: `Bearer ${jwt({ exp: nowSeconds() + 600, aud: 'viewtape', views: ['prices'], ingest: ['demo'] })}` };
  const feed = new Feed(['ACME', 'BOLT', 'CRUX']);
  // What a page gets when it asks for a fresh token: the next of `tokens` (made when asked).
  let tokens = [];
  let minted = 0;
  await context.exposeFunction('__mintViewtapeToken', () => {
    minted++;
    const next = tokens.shift();
    return next ? next() : 'no-more-tokens-planned';
  });
  await ingest(base, 'demo', feed.batch(4), writer); // offsets 1..4

  // 5. Refused: no cookie, or a cookie the server refuses. The page is same-origin and runs no
  //    script of its own.
  const page = await context.newPage();
  page.on('console', m => log(`[page console] ${m.text()}`));
  page.on('pageerror', e => log(`[page error] ${e}`));
  await page.goto(`${base}/healthz`, { timeout: WAIT });
  const refusals = [
    ['no cookie', null, 401],
    ['an expired token', readToken(-60), 401],
    ['a token signed with another secret', jwt({ exp: nowSeconds() + 60, aud: 'viewtape', views: ['prices'] }, 'another-secret'), 401],
    ['a token for another view', readToken(60, ['orders.*']), 403],
  ];
  for (const [what, token, status] of refusals) {
    await context.clearCookies();
    if (token) await setCookie(page, token);
    const got = await page.evaluate(async () => {
      const res = await fetch('/views/prices/events?from=tape', { signal: AbortSignal.timeout(5000) });
      const answer = { status: res.status, wwwAuthenticate: res.headers.get('www-authenticate') };
      await res.body?.cancel();
      window.__events = [];
      const es = new EventSource('/views/prices/events?from=tape');
      const deadline = Date.now() + 10000;
      while (es.readyState !== EventSource.CLOSED && Date.now() < deadline) await new Promise(r => setTimeout(r, 50));
      const closed = es.readyState === EventSource.CLOSED;
      await new Promise(r => setTimeout(r, 300)); // anything late would show up now
      es.close();
      return { ...answer, closed, events: window.__events };
    });
    check(got.status === status, () => `${what}: status ${got.status}, want ${status}`);
    check(status !== 401 || got.wwwAuthenticate === 'Bearer', () => `${what}: WWW-Authenticate ${got.wwwAuthenticate}`);
    check(got.closed, `${what}: the browser closed the EventSource`);
    check(JSON.stringify(shape(got.events)) === '["error2"]' && got.events.length === 1,
      () => `${what}: one error (CLOSED) and no event: ${JSON.stringify(got.events)}`);
  }
  log(`refused: ${refusals.map(([what, , status]) => `${what} ${status}`).join(', ')}: the EventSource closed, no event`);

  // 6. A bare EventSource with a short-lived token in the cookie, renewed on `reauth`, twice.
  await context.clearCookies();
  await setCookie(page, readToken(3));
  tokens = [() => readToken(3), () => readToken(60)];
  minted = 0;
  await page.evaluate(() => {
    window.__events = [];
    const es = new EventSource('/views/prices/events?from=tape');
    window.__bare = es;
    es.addEventListener('reauth', async () => {
      const token = await window.__mintViewtapeToken();
      document.cookie = `viewtape_token=${token}; path=/; SameSite=Strict`;
      window.__events.push({ type: 'renewed' });
    });
  });
  const waitOn = (p, expr, arg, what) =>
    p.waitForFunction(expr, arg, { timeout: WAIT, polling: 50 }).catch(e => {
      throw new Error(`waiting for ${what}: ${e.message}`);
    });
  await waitOn(page, () => window.__events.filter(e => e.type === 'update').length >= 4, undefined, 'the tape');
  let away = await throughReauths(page, 2, feed, writer);
  await waitOn(page, () => window.__events.filter(e => e.type === 'open').length >= 3, undefined, 'the second reconnection');
  await ingest(base, 'demo', feed.batch(2), writer); // live after the resume
  let last = feed.nextSeq - 1;
  await waitOn(page, n => window.__events.filter(e => e.type === 'update').length >= n, last, `${last} updates`);
  await sleep(500); // anything extra would show up now
  const bare = await page.evaluate(() => { window.__bare.close(); return window.__events; });
  const epoch = parseCursor(bare.find(e => e.type === 'update').id).epoch;
  contiguous(bare.filter(e => e.type === 'update'), 1, last, epoch, feed, 'bare EventSource across two reauths');
  const bareShape = shape(bare);
  check(JSON.stringify(bareShape.filter(t => t !== 'renewed')) === JSON.stringify(['open', 'reauth', 'error0', 'open', 'reauth', 'error0', 'open']),
    () => `reauth ends the response, the browser reconnects by itself (never CLOSED), no reset/state: ${JSON.stringify(bareShape)}`);
  check(bareShape.indexOf('renewed') > bareShape.indexOf('reauth') && bareShape.indexOf('renewed') < bareShape.indexOf('open', 1)
    && bareShape.lastIndexOf('renewed') > bareShape.lastIndexOf('reauth') && bareShape.lastIndexOf('renewed') < bareShape.lastIndexOf('open')
    && bareShape.filter(t => t === 'renewed').length === 2,
    () => `the cookie was renewed after each reauth, before the reconnection: ${JSON.stringify(bareShape)}`);
  check(minted === 2, `two fresh tokens: ${minted}`);
  check(away >= 1, 'events published while the browser was away came by replay');
  let view = await getJson(base, '/views/prices', writer);
  check(view.cursor === `${epoch}-${last}`, () => `GET /views/prices at ${view.cursor}, the browser saw ${epoch}-${last}`);
  log(`bare EventSource: two reauths, offsets 1..${last} exactly once (${away} rounds replayed events published while away), no reset`);
  await page.close();

  // 7. The demo page with a token hook and no cookie.
  await context.clearCookies();
  const bad = () => jwt({ exp: nowSeconds() + 60, aud: 'viewtape', views: ['prices'] }, 'not-the-secret');
  tokens = [() => readToken(3), () => readToken(3), bad, () => readToken(60)];
  minted = 0;
  const demo = await context.newPage();
  const pageErrors = [];
  demo.on('console', m => log(`[demo console] ${m.text()}`));
  demo.on('pageerror', e => { pageErrors.push(String(e)); log(`[demo error] ${e}`); });
  await demo.addInitScript(() => {
    window.__renewals = [];
    window.viewtapeToken = async () => {
      window.__renewals.push(document.getElementById('status')?.textContent ?? null);
      return window.__mintViewtapeToken();
    };
  });
  const before = feed.nextSeq - 1;
  await demo.goto(`${base}/`, { timeout: WAIT });
  await waitOn(demo, () => window.__events.some(e => e.type === 'synced'), undefined, 'synced on the demo page');
  away = await throughReauths(demo, 2, feed, writer);
  await waitOn(demo, () => window.__events.filter(e => e.type === 'open').length >= 3, undefined, 'the reopened EventSource');
  await ingest(base, 'demo', feed.batch(2), writer);
  last = feed.nextSeq - 1;
  const seen = await demo.evaluate(() => window.__events);
  const synced = parseCursor(seen.find(e => e.type === 'synced').id);
  await waitOn(demo, n => window.__events.filter(e => e.type === 'update').length >= n, last - synced.offset, `updates to ${last}`);
  await sleep(500);
  const events = await demo.evaluate(() => window.__events);
  const demoShape = shape(events);
  check(JSON.stringify(demoShape) === JSON.stringify(['open', 'synced', 'reauth', 'open', 'reauth', 'error:unauthorized', 'open']),
    () => `a token first, then opened; two reauths; the refused reconnection renewed and reopened: ${JSON.stringify(demoShape)}`);
  check(synced.epoch === epoch && synced.offset >= before, `synced at ${JSON.stringify(synced)}, after offset ${before}`);
  check(events.filter(e => e.type === 'state').length === feed.symbols.length, 'the state: one entry per symbol');
  const updates = events.filter(e => e.type === 'update');
  contiguous(updates, synced.offset + 1, last, epoch, feed, 'demo page across two reauths and a reopen');
  const opens = events.filter(e => e.type === 'open');
  check(opens[0].url === `${base}/views/prices/events`, () => `the first stream, without a cursor: ${opens[0].url}`);
  for (const open of opens.slice(1)) {
    const before = events.slice(0, events.indexOf(open)).filter(e => e.type === 'update' || e.type === 'synced').at(-1);
    check(open.url === `${base}/views/prices/events?cursor=${encodeURIComponent(before.id)}`,
      () => `reopened from the last cursor ${before.id}: ${open.url}`);
  }
  const renewals = await demo.evaluate(() => window.__renewals);
  check(JSON.stringify(renewals) === JSON.stringify(['connecting…', 'token expired — renewing', 'token expired — renewing', 'refused — renewing token']),
    () => `the page asked for a token first, on each reauth and when refused, saying so: ${JSON.stringify(renewals)}`);
  check(minted === 4, `four tokens asked for: ${minted}`);
  log(`demo page: ${away} of 2 reauth rounds had events published while it was away`);
  check(await demo.textContent('#status') === 'live', 'the page is live again');
  check(await demo.textContent('#resets') === '0', 'the page saw no reset');
  check(pageErrors.length === 0, () => `no page error: ${pageErrors.join('; ')}`);
  const rows = await compareRows(demo, 'with auth', writer);
  view = await getJson(base, '/views/prices', writer);
  check(view.cursor === `${epoch}-${last}`, () => `GET /views/prices at ${view.cursor}, the page saw ${epoch}-${last}`);
  log(`demo page: a token, two reauths, a refusal renewed; offsets ${synced.offset + 1}..${last} exactly once, ${rows} rows match`);

  // 8. @viewtape/client in cookie mode (`tokenTransport: 'cookie'`), imported from the server's
  //    /viewtape-client.js by a page of the server's origin: it sets `viewtape_token` before each
  //    connection, renews it at each reauth, and every event arrives once, in order.
  await context.clearCookies();
  tokens = [() => readToken(3), () => readToken(3), () => readToken(60)];
  minted = 0;
  const plain = await context.newPage();
  plain.on('pageerror', e => log(`[plain error] ${e}`));
  await plain.goto(`${base}/healthz`, { timeout: WAIT });
  const from = await plain.evaluate(async () => {
    const { openView } = await import('/viewtape-client.js');
    window.__changes = [];
    window.__reauths = 0;
    const view = openView(location.origin, 'prices', { token: () => window.__mintViewtapeToken(), tokenTransport: 'cookie', minDelay: 100 });
    view.on('change', c => { if (!c.fromState) window.__changes.push({ id: c.cursor, data: JSON.stringify({ key: c.key, value: c.value }) }); });
    view.on('reauth', () => { window.__reauths += 1; });
    window.__view = view;
    await view.synced();
    return view.cursor;
  });
  const deadline = Date.now() + WAIT;
  while (await plain.evaluate(() => window.__reauths) < 2) {
    check(Date.now() < deadline, 'two reauths in cookie mode');
    await ingest(base, 'demo', feed.batch(1), writer);
    await sleep(150);
  }
  await ingest(base, 'demo', feed.batch(2), writer);
  last = feed.nextSeq - 1;
  await waitOn(plain, n => window.__view.cursor?.endsWith(`-${n}`), last, `the cookie-mode view at offset ${last}`);
  const cookieChanges = await plain.evaluate(() => window.__changes);
  contiguous(cookieChanges, parseCursor(from).offset + 1, last, epoch, feed, 'the client in cookie mode across two reauths');
  check(minted === 3, `a token at the start and one per reauth: ${minted}`);
  check((await context.cookies(base)).some(c => c.name === 'viewtape_token'), 'the token went in the cookie');
  await plain.evaluate(() => window.__view.close());
  log(`client in cookie mode: two reauths, offsets ${parseCursor(from).offset + 1}..${last} exactly once`);
  await plain.close();
}

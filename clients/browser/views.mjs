// Headless Chromium (Debian's /usr/bin/chromium, driven by playwright-core) on the demo page
// (server/static/index.html), against a scripted stand-in of the server in this process: it
// serves the page and /viewtape-client.js from server/static, answers `GET /views` from a list
// the script changes, and answers each `GET /views/{view}/events` with the view's state and
// `synced`, held open, or `404` for a view it does not have. Its streams can be ended with
// `event: retired` (no `id:`), as the server retires a view.
//
//   node clients/browser/views.mjs
//
// Asserts:
//  1. with no `#view=`, the page follows `prices` when the server lists it, though it is not the
//     first view listed; the list shows every view, each a link to `#view=NAME`;
//  2. `#view=NAME` follows that view: its rows, a column per field of its values, the picker on it;
//  3. when the followed view is retired, the page says so plainly (status `retired`, a notice with
//     the server's reason), never reopens its stream, and drops it from the list and the picker
//     once `GET /views` no longer lists it; a view created meanwhile appears within a refresh;
//  4. `#view=NAME` for a view the server does not have says so (status `not found`), no retry;
//  5. with no `prices`, the page follows the first view listed (not "reconnecting…" forever).
import { readFileSync, mkdtempSync, rmSync } from 'node:fs';
import { createServer } from 'node:http';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { chromium } from 'playwright-core';

import { check, log, until } from '../common.mjs';

const WAIT = 15000;
const staticDir = new URL('../../server/static/', import.meta.url);
const EPOCH = '00000000000000e1';

/** The stand-in server: `views` maps a name to its entries; `streams` holds the open responses. */
const views = new Map();
const streams = new Map(); // name -> Set<ServerResponse>
const requests = []; // paths of /events requests, in order
const server = createServer((req, res) => {
  const url = new URL(req.url, 'http://x');
  if (url.pathname === '/') return send(res, 200, 'text/html; charset=utf-8', readFileSync(new URL('index.html', staticDir)));
  if (url.pathname === '/viewtape-client.js') return send(res, 200, 'text/javascript', readFileSync(new URL('viewtape-client.js', staticDir)));
  if (url.pathname === '/views') {
    const list = [...views].map(([name, entries]) => ({
      name, keys: Object.keys(entries).length, retained: 1, bytes: 10, epoch: EPOCH, first: 1, next: 2, sealed: false,
    }));
    return send(res, 200, 'application/json', JSON.stringify({ views: list }));
  }
  const events = /^\/views\/([^/]+)\/events$/.exec(url.pathname);
  if (events) {
    const name = decodeURIComponent(events[1]);
    requests.push(name);
    const entries = views.get(name);
    if (!entries) return send(res, 404, 'application/json', JSON.stringify({ error: 'not_found', message: `no view named ${name}` }));
    res.writeHead(200, { 'content-type': 'text/event-stream', 'cache-control': 'no-store' });
    for (const [key, value] of Object.entries(entries)) res.write(`event: state\ndata: ${JSON.stringify({ key, value })}\n\n`);
    res.write(`id: ${EPOCH}-1\nevent: synced\ndata: {}\n\n`);
    if (!streams.has(name)) streams.set(name, new Set());
    streams.get(name).add(res);
    res.on('close', () => streams.get(name)?.delete(res));
    return;
  }
  send(res, 404, 'application/json', JSON.stringify({ error: 'not_found', message: 'no such path' }));
});

function send(res, status, type, body) {
  res.writeHead(status, { 'content-type': type });
  res.end(body);
}

/** Retires `name` as the server does: out of the list, a last `retired` event on each stream. */
function retire(name, reason) {
  views.delete(name);
  for (const res of streams.get(name) ?? []) res.end(`event: retired\ndata: ${JSON.stringify({ view: name, reason })}\n\n`);
}

await new Promise(resolve => server.listen(0, '127.0.0.1', resolve));
const base = `http://127.0.0.1:${server.address().port}`;
const profile = mkdtempSync(join(tmpdir(), 'viewtape-chromium-'));
const browser = await chromium.launchPersistentContext(profile, {
  executablePath: '/usr/bin/chromium',
  headless: true,
  args: ['--headless', '--no-sandbox', '--disable-gpu', '--no-first-run', '--disable-background-networking',
    '--disable-component-update', '--disable-sync'],
});

try {
  const page = await browser.newPage();
  const pageErrors = [];
  page.on('pageerror', e => { pageErrors.push(String(e)); log(`[page error] ${e}`); });
  const text = selector => page.textContent(selector);
  const rows = () => page.$$eval('#entries tr', trs => trs.map(tr => [...tr.cells].map(td => td.textContent)));
  const listedViews = () => page.$$eval('#views tbody tr a', as => as.map(a => [a.textContent, a.getAttribute('href')]));
  const pickerViews = () => page.$$eval('#view option', os => os.map(o => o.value));
  const waitOn = async (what, predicate) => until(predicate, WAIT, what);

  // 1. The default is `prices`, listed second.
  views.set('alpha', { a1: { n: 1, note: 'first' }, a2: { n: 2.5, note: 'second' } });
  views.set('prices', { ACME: { price: 101.25, seq: 7 } });
  views.set('chat.room1', { m1: 'hello' });
  await page.goto(`${base}/`, { timeout: WAIT });
  await waitOn('the page live on prices', async () => (await text('#status')) === 'live' && (await page.inputValue('#view')) === 'prices');
  check(requests.join() === 'prices', `only prices was opened: ${requests}`);
  const pricesRows = JSON.stringify(await rows());
  check(pricesRows === JSON.stringify([['key', 'price', 'seq'], ['ACME', '101.25', '7']]), `prices rows: ${pricesRows}`);
  await waitOn('every view listed', async () => (await listedViews()).length === 3);
  const listed = JSON.stringify(await listedViews());
  check(listed === JSON.stringify([['alpha', '#view=alpha'], ['prices', '#view=prices'], ['chat.room1', '#view=chat.room1']]), `listed: ${listed}`);
  log('1. no #view=: follows prices, lists alpha, prices, chat.room1 as links');

  // 2. A link (#view=alpha) follows alpha.
  await page.click('#views a[href="#view=alpha"]');
  await waitOn('the page on alpha', async () => (await page.inputValue('#view')) === 'alpha' && (await rows()).length === 3);
  const alphaRows = JSON.stringify(await rows());
  check(alphaRows === JSON.stringify([['key', 'n', 'note'], ['a1', '1', 'first'], ['a2', '2.50', 'second']]), `alpha rows: ${alphaRows}`);
  check(page.url().endsWith('#view=alpha'), `the URL says the view: ${page.url()}`);
  await waitOn('the stream of prices closed', () => (streams.get('prices')?.size ?? 0) === 0);
  log('2. #view=alpha: its rows, prices closed');

  // 3. alpha is retired while followed; a view is created meanwhile.
  const opened = requests.length;
  views.set('chat.room2', { m1: 'new' });
  retire('alpha', 'runtime notes was deleted');
  await waitOn('the page to say retired', async () => (await text('#status')) === 'retired');
  const notice = await text('#notice');
  check(await page.isVisible('#notice') && /alpha/.test(notice) && /retired/.test(notice) && /runtime notes was deleted/.test(notice), `the notice: ${notice}`);
  await waitOn('alpha out of the list and chat.room2 in', async () => {
    const names = (await listedViews()).map(([n]) => n);
    return !names.includes('alpha') && names.includes('chat.room2');
  });
  // The picker keeps the followed view only, marked gone, so the retired view stays explained.
  const picked = await page.$$eval('#view option', os => os.map(o => o.textContent));
  check(picked.includes('alpha (gone)') && picked.includes('chat.room2') && !picked.includes('alpha'), `the picker: ${picked}`);
  await new Promise(r => setTimeout(r, 1500)); // many of the client's backoff delays
  check(requests.length === opened, `no reconnection after retired: ${requests.slice(opened)}`);
  log('3. retired: said plainly, out of the list, not reopened; chat.room2 listed');

  // 4. A view the server does not have.
  await page.evaluate(() => { location.hash = 'view=nosuch'; });
  await waitOn('the page to say not found', async () => (await text('#status')) === 'not found');
  check(/nosuch/.test(await text('#notice')), 'the notice names the view');
  await new Promise(r => setTimeout(r, 1000));
  check(requests.filter(n => n === 'nosuch').length === 1, `one request for nosuch: ${requests}`);
  log('4. #view=nosuch: not found, not retried');

  // 5. No prices: a fresh page follows the first view listed.
  views.delete('prices');
  const fresh = await browser.newPage();
  fresh.on('pageerror', e => { pageErrors.push(String(e)); log(`[page error] ${e}`); });
  await fresh.goto(`${base}/`, { timeout: WAIT });
  await waitOn('the fresh page live on chat.room1', async () => (await fresh.textContent('#status')) === 'live' && (await fresh.inputValue('#view')) === 'chat.room1');
  const freshRows = await fresh.$$eval('#entries tr', trs => trs.map(tr => [...tr.cells].map(td => td.textContent)));
  check(JSON.stringify(freshRows) === JSON.stringify([['key', 'value'], ['m1', 'hello']]), `chat.room1 rows: ${JSON.stringify(freshRows)}`);
  log('5. no prices: follows the first view listed');
  check(pageErrors.length === 0, `no page error: ${pageErrors}`);
} finally {
  await browser.close().catch(() => {});
  rmSync(profile, { recursive: true, force: true });
  for (const set of streams.values()) for (const res of set) res.destroy();
  server.close();
}
log('PASS');

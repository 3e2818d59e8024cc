// The operator page at /admin/ in headless Chromium (Debian's /usr/bin/chromium, driven by
// playwright-core):
//
//   node clients/browser/admin.mjs <base-url> <admin-token> <screenshot.png>
//
// Run by tests/tests/clients.rs against a server with VIEWTAPE_ADMIN_TOKEN=<admin-token> and the
// demo feed on. Asserts:
//  1. with a wrong token the page says the token was refused and shows nothing;
//  2. with the token (`#token=…`) it shows the server ready, the view `prices` with its keys, the
//     runtime `demo` with its batches counting up, the SHA-256 of the module it runs (that of
//     server/guests/ticker.wasm, the built-in ticker, computed here, and what GET /admin/runtimes
//     reports), the size of its state (above zero, as GET /admin/runtimes reports it), no last
//     error until a batch the guest refuses, then that refusal with the guest's message, the
//     log's position, the snapshots;
//  3. its live plots of deliveries and ingest move: a burst of ingest and a subscriber reading
//     show up as rates above zero, and the subscriber in the view's subscriber count, which goes
//     back to zero once it has gone.
//  4. its form creates a `builtin:json` runtime (name, views) that ingest reaches and that the
//     table lists; a view another runtime has is refused with the server's message; the
//     runtime's Delete button (confirmed) deletes it: gone from the table, its ingest a 404.
// It takes a screenshot of the page while the subscriber reads.
import { createHash } from 'node:crypto';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { chromium } from 'playwright-core';
import { check, done, getJson, log, until } from '../common.mjs';

const [base, token, screenshot] = process.argv.slice(2);
check(base && token && screenshot, 'usage: admin.mjs <base-url> <admin-token> <screenshot.png>');
const WAIT = 30000;

const profile = mkdtempSync(join(tmpdir(), 'viewtape-chromium-'));
const browser = await chromium.launchPersistentContext(profile, {
  executablePath: '/usr/bin/chromium',
  headless: true,
  args: ['--headless', '--no-sandbox', '--disable-gpu', '--no-first-run',
    '--disable-background-networking', '--disable-component-update', '--disable-sync'],
  viewport: { width: 1000, height: 1100 },
});
try {
  const page = browser.pages()[0] ?? await browser.newPage();
  const text = sel => page.locator(sel).innerText();
  /** The cells of the row of table `id` whose first cell is `name`: [{text, value}], value being
   * the cell's data-value (a module's whole fingerprint, a last error's message). */
  const row = (id, name) => page.evaluate(([id, name]) => {
    const tr = [...document.querySelectorAll(`#${id} tbody tr`)].find(r => r.cells[0]?.innerText === name);
    return tr ? [...tr.cells].map(c => ({ text: c.innerText, value: c.dataset.value })) : null;
  }, [id, name]);
  const number = cell => Number(cell?.text.replace(/,/g, '') ?? NaN);
  const admin = { Authorization: `Bearer ${token}` };
  const demoRuntime = async () => (await getJson(base, '/admin/runtimes', admin)).runtimes.find(r => r.name === 'demo');
  // Columns of #runtimes and #views.
  const [MODULE, STATE, BATCHES, LAST_ERROR] = [1, 2, 3, 8];
  const SUBSCRIBERS = 4;

  // 1. A wrong token.
  await page.goto(`${base}/admin/#token=wrong`);
  await until(async () => (await text('#status')).includes('refused'), WAIT, 'the refusal');
  check((await page.locator('#runtimes tbody tr').count()) === 0, 'nothing shown with a wrong token');
  log('wrong token: refused');

  // 2. The token.
  await page.evaluate(() => sessionStorage.clear());
  await page.goto('about:blank');
  await page.goto(`${base}/admin/#token=${encodeURIComponent(token)}`);
  await until(() => !page.url().includes('token='), WAIT, 'the token out of the address bar');
  await until(async () => Number(await page.evaluate(() => document.body.dataset.ticks || 0)) >= 2, WAIT, 'two updates');
  check((await text('#ready')).includes('ready') && !(await text('#ready')).includes('not'), 'ready');
  await until(async () => /prices\s+\d+/.test(await text('#views')), WAIT, 'the view prices with its keys');
  const batches = async () => number((await row('runtimes', 'demo'))?.[BATCHES]);
  const first = await batches();
  check(first >= 1, `the demo runtime's batches: ${first}`);
  await until(async () => (await batches()) > first, WAIT, 'batches counting up');

  // What the runtime runs: the built-in ticker, whose bytes are in the repository.
  const wasm = readFileSync(new URL('../../server/guests/ticker.wasm', import.meta.url));
  const sha = `sha256:${createHash('sha256').update(wasm).digest('hex')}`;
  const demo = await row('runtimes', 'demo');
  check(demo[MODULE].value === sha, `the module shown: ${demo[MODULE].value}, the ticker's: ${sha}`);
  check(demo[MODULE].text.startsWith(sha.slice(0, 19)), `the module's short form: ${demo[MODULE].text}`);
  check((await demoRuntime()).module === sha, 'GET /admin/runtimes reports the same module');
  // The ticker saves its last seq as text: a few bytes, as the server reports them.
  await until(async () => {
    const [shown, reported] = [number((await row('runtimes', 'demo'))[STATE]), (await demoRuntime()).state_bytes];
    return shown > 0 && shown === reported;
  }, WAIT, 'the state size shown as reported');
  check(demo[LAST_ERROR].text === 'none' && (await demoRuntime()).last_error === null, `no error yet: ${demo[LAST_ERROR].text}`);

  // A batch the guest refuses: its message shows up as the last error.
  const refused = await fetch(`${base}/runtimes/demo/ingest`, { method: 'POST', body: 'not a tick\n' });
  const answer = await refused.json();
  check(refused.status === 422, `the refused batch: ${refused.status} ${JSON.stringify(answer)}`);
  const failure = (await demoRuntime()).last_error;
  check(failure?.kind === 'rejected' && answer.message.endsWith(failure.message) && Math.abs(failure.at_ms - Date.now()) < 60000,
    `the last error reported: ${JSON.stringify(failure)} for ${answer.message}`);
  await until(async () => {
    const cell = (await row('runtimes', 'demo'))[LAST_ERROR];
    return cell.value === failure.message && cell.text.startsWith('rejected, ') && cell.text.includes(failure.message.slice(0, 20));
  }, WAIT, 'the refusal shown as the last error');
  check(/position\s+\d+/.test(await text('#log')), 'the log position');
  check(/snap-\S+\.vtsnap/.test(await text('#snapshots')), 'the snapshots');
  log('views, runtimes (module, state, last error), log, snapshots shown');

  // 3. Rates: the demo feed ingests 5 batches/s; a reader gets deliveries.
  const reader = new AbortController();
  const stream = fetch(`${base}/views/prices/events`, { signal: reader.signal }).then(async res => {
    for await (const _ of res.body) { /* read along */ }
  }).catch(() => {});
  await until(async () => Number(await page.evaluate(() => document.getElementById('ingest').dataset.last)) > 0, WAIT, 'ingest above zero');
  await until(async () => Number(await page.evaluate(() => document.getElementById('deliveries').dataset.last)) > 0, WAIT, 'deliveries above zero');
  await until(async () => number((await row('views', 'prices'))[SUBSCRIBERS]) === 1, WAIT, 'the reader among the subscribers of prices');
  log('plots move, the reader is counted');
  await new Promise(r => setTimeout(r, 4000));
  await page.screenshot({ path: screenshot, fullPage: true });
  reader.abort();
  await stream;
  await until(async () => number((await row('views', 'prices'))[SUBSCRIBERS]) === 0, WAIT, 'no subscriber once the reader has gone');

  // 4. Runtimes as data, from the page.
  const create = async (name, views) => {
    await page.fill('#create-name', name);
    await page.fill('#create-views', views);
    await page.click('#create button');
  };
  await create('rooms', 'room.*, lobby');
  await until(async () => (await text('#create-status')).includes('rooms: created'), WAIT, 'the runtime created');
  await until(async () => (await row('runtimes', 'rooms')) !== null, WAIT, 'the new runtime listed');
  const defined = await getJson(base, '/admin/runtimes/rooms', admin);
  check(defined.module === 'builtin:json' && JSON.stringify(defined.views) === '["room.*","lobby"]', `defined: ${JSON.stringify(defined)}`);
  const line = JSON.stringify({ view: 'room.7', key: 'm1', value: { text: 'hi' } });
  const ingested = await fetch(`${base}/runtimes/rooms/ingest`, { method: 'POST', body: `${line}\n` });
  check(ingested.status === 200, `ingest into the new runtime: ${ingested.status}`);
  await create('other', 'lobby');
  await until(async () => /other: 409 view_conflict: .*lobby/.test(await text('#create-status')), WAIT, 'the conflict shown');
  check((await row('runtimes', 'other')) === null, 'nothing created on a conflict');
  page.once('dialog', dialog => dialog.accept());
  await page.click('#runtimes button.delete[data-runtime="rooms"]');
  await until(async () => (await text('#create-status')).includes('rooms: deleted'), WAIT, 'the runtime deleted');
  await until(async () => (await row('runtimes', 'rooms')) === null, WAIT, 'the runtime gone from the table');
  const after = await fetch(`${base}/runtimes/rooms/ingest`, { method: 'POST', body: `${line}\n` });
  check(after.status === 404, `ingest after the delete: ${after.status}`);
  log('a runtime created and deleted from the page');
  done();
} finally {
  await browser.close();
  rmSync(profile, { recursive: true, force: true });
}

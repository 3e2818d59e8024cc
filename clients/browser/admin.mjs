// The operator page at /admin/ in headless Chromium (Debian's /usr/bin/chromium, driven by
// playwright-core):
//
//   node clients/browser/admin.mjs <base-url> <admin-token> <screenshot.png>
//
// Run by tests/tests/clients.rs against a server with VIEWTAPE_ADMIN_TOKEN=<admin-token> and the
// demo feed on. Asserts:
//  1. with a wrong token the page says the token was refused and shows nothing;
//  2. with the token (`#token=…`) it shows the server ready, the view `prices` with its keys, the
//     runtime `demo` with its batches counting up, the log's position, the snapshots;
//  3. its live plots of deliveries and ingest move: a burst of ingest and a subscriber reading
//     show up as rates above zero.
// Then it takes a screenshot of the page.
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { chromium } from 'playwright-core';
import { check, done, log, until } from '../common.mjs';

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
  const batches = async () => Number((await text('#runtimes')).match(/demo\s+([\d,]+)/)?.[1].replace(/,/g, '') ?? NaN);
  const first = await batches();
  check(first >= 1, `the demo runtime's batches: ${first}`);
  await until(async () => (await batches()) > first, WAIT, 'batches counting up');
  check(/position\s+\d+/.test(await text('#log')), 'the log position');
  check(/snap-\S+\.vtsnap/.test(await text('#snapshots')), 'the snapshots');
  log('views, runtimes, log, snapshots shown');

  // 3. Rates: the demo feed ingests 5 batches/s; a reader gets deliveries.
  const reader = new AbortController();
  const stream = fetch(`${base}/views/prices/events`, { signal: reader.signal }).then(async res => {
    for await (const _ of res.body) { /* read along */ }
  }).catch(() => {});
  await until(async () => Number(await page.evaluate(() => document.getElementById('ingest').dataset.last)) > 0, WAIT, 'ingest above zero');
  await until(async () => Number(await page.evaluate(() => document.getElementById('deliveries').dataset.last)) > 0, WAIT, 'deliveries above zero');
  log('plots move');
  await new Promise(r => setTimeout(r, 4000));
  await page.screenshot({ path: screenshot, fullPage: true });
  reader.abort();
  await stream;
  done();
} finally {
  await browser.close();
  rmSync(profile, { recursive: true, force: true });
}

// Memory per open view of @viewtape/client in headless Chromium (Debian's /usr/bin/chromium via
// playwright-core; `npm ci --prefix clients` and `npm run build --prefix clients/js` first).
//
//   node clients/js/bench/memory.mjs                        the client alone
//   node clients/js/bench/memory.mjs http://127.0.0.1:8080  also views of a real server's `prices`
//
// The client alone: a page opens N views, each handed (through the `fetch` option) a live stream
// of a state of K keys and `synced` that then stays open, so no per-origin connection limit
// applies. The figure is the page's JS heap after a forced GC (CDP `HeapProfiler.collectGarbage`,
// `Runtime.getHeapUsage`), once all N are live, minus the heap before, over N: what one open view
// costs in the page, listeners, timers, the parser, the stream reader and its state included.
// With a server: 6 views of `prices` over real connections (HTTP/1.1 allows 6 per origin), the
// same measurement.
import { readFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

import { chromium } from 'playwright-core';

const here = dirname(fileURLToPath(import.meta.url));
const dist = join(here, '..', 'dist');
const parserDist = dirname(createRequire(import.meta.url).resolve('eventsource-parser'));
const origin = process.argv[2] ?? 'http://bench.invalid';

const PAGE = `<!doctype html><meta charset="utf-8">
<script type="importmap">{"imports": {"eventsource-parser": "/__client/parser/index.js"}}</script>
<script type="module">
import { openView } from '/__client/dist/index.js';
const encoder = new TextEncoder();
const synthetic = keys => async () => {
  let text = 'retry: 2000\\n\\n';
  for (let k = 0; k < keys; k++) text += 'event: state\\ndata: {"key":"k' + k + '","value":{"symbol":"k' + k + '","price":12.25,"seq":' + k + '}}\\n\\n';
  text += 'event: synced\\nid: 00000000deadbeef-' + keys + '\\ndata: {}\\n\\n';
  const body = new ReadableStream({ start(c) { c.enqueue(encoder.encode(text)); }, pull() { return new Promise(() => {}); } });
  return new Response(body, { headers: { 'content-type': 'text/event-stream' } });
};
window.views = [];
window.openMany = async (n, keys) => {
  const opened = Array.from({ length: n }, (_, i) => openView('http://bench.invalid', 'v' + i, { fetch: synthetic(keys), stallTimeout: 3_600_000 }));
  opened.forEach(v => v.on('change', () => {}));
  await Promise.all(opened.map(v => v.synced()));
  window.views.push(...opened);
};
window.openReal = async n => {
  const opened = Array.from({ length: n }, () => openView(location.origin, 'prices'));
  opened.forEach(v => v.on('change', () => {}));
  await Promise.all(opened.map(v => v.synced()));
  window.views.push(...opened);
};
window.closeAll = async () => { await Promise.all(window.views.map(v => v.close())); window.views = []; };
window.ready = true;
</script>`;

const browser = await chromium.launch({
  executablePath: '/usr/bin/chromium',
  headless: true,
  args: ['--headless', '--no-sandbox', '--disable-gpu', '--disable-background-networking', '--disable-component-update', '--disable-sync'],
});
try {
  const page = await browser.newPage();
  await page.route(`${origin}/__client/**`, route => {
    const path = new URL(route.request().url()).pathname;
    if (path === '/__client/bench.html') return route.fulfill({ contentType: 'text/html', body: PAGE });
    const [, , kind, ...rest] = path.split('/');
    return route.fulfill({ contentType: 'text/javascript', body: readFileSync(join(kind === 'dist' ? dist : parserDist, ...rest)) });
  });
  await page.goto(`${origin}/__client/bench.html`);
  await page.waitForFunction(() => window.ready === true);
  const cdp = await page.context().newCDPSession(page);
  const heap = async () => {
    await cdp.send('HeapProfiler.collectGarbage');
    await cdp.send('HeapProfiler.collectGarbage');
    return (await cdp.send('Runtime.getHeapUsage')).usedSize;
  };
  for (const [n, keys] of [[1000, 0], [1000, 10], [200, 1000]]) {
    const before = await heap();
    await page.evaluate(([n, keys]) => window.openMany(n, keys), [n, keys]);
    const after = await heap();
    await page.evaluate(() => window.closeAll());
    const closed = await heap();
    console.log(`client alone: ${n} live views of ${keys} keys: ${((after - before) / n / 1024).toFixed(1)} KiB per view (heap back to +${((closed - before) / 1024).toFixed(0)} KiB after close())`);
  }
  if (process.argv[2]) {
    const before = await heap();
    await page.evaluate(() => window.openReal(6));
    const after = await heap();
    await page.evaluate(() => window.closeAll());
    console.log(`real server: 6 live views of prices: ${((after - before) / 6 / 1024).toFixed(1)} KiB per view`);
  }
} finally {
  await browser.close();
}

// @viewtape/client in Node against the real server, faults injected. Run by
// tests/tests/clients.rs as `node clients/js/test/node.test.mjs <base-url>`, with the demo ticker
// (`demo` → `prices`) and the `misbehave` fixture (`fixture` → `notes`) configured, on a pinned
// port; the script asks the driver to `kill9-restart` and `kill9-wipe-restart` the server.
//
// Batches go to `fixture` as `publish notes k<i mod 5> {"batch": i}`: the view's live changes
// then say exactly which batches were published and in which order. After every scenario the
// view's map equals `GET /views/notes` at the same cursor, and every event was applied once.
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, test } from 'node:test';

import { memoryStore, openProducer, openView } from '@viewtape/client';
import { fileStore } from '@viewtape/client/node';

import { check, control, done, getJson, ingest, log, until } from '../../common.mjs';
import { checkAppliedOnce, checkMatchesServer, FaultProxy, recordChanges, sleep } from './support.mjs';

const base = process.argv[2];
check(base, 'usage: node.test.mjs <base-url>');
const WAIT = 30000;
const dir = mkdtempSync(join(tmpdir(), 'viewtape-client-'));
const fast = { minDelay: 100, maxDelay: 1000 };
after(() => {
  rmSync(dir, { recursive: true, force: true });
  done();
});

const batch = i => `publish notes k${i % 5} ${JSON.stringify({ batch: i })}\n`;
const batchesOf = record => record.live.filter(c => !c.deleted).map(c => c.value.batch);
const range = (from, to) => Array.from({ length: to - from }, (_, i) => from + i);

/** A fetch whose answers to the requests `drop(n)` picks never arrive: the request reached the
 * server (and committed), the producer times out and must retry. */
function lossyFetch() {
  let dropping = 0;
  const f = async (url, init) => {
    const response = await fetch(url, init);
    if (dropping > 0) {
      dropping -= 1;
      await response.text();
      await new Promise((_, reject) => init.signal.addEventListener('abort', () => reject(init.signal.reason), { once: true }));
    }
    return response;
  };
  f.drop = n => void (dropping += n);
  return f;
}

test('kill -9 twice mid-stream: no reset, no duplicate, no loss; a producer through the kills and lost answers publishes each batch once', async () => {
  const store = fileStore(join(dir, 'a'));
  const view = openView(base, 'notes', { cursorStore: store, ...fast });
  const record = recordChanges(view);
  await view.synced();
  const lossy = lossyFetch();
  const retries = [];
  const producer = openProducer(base, 'fixture', { id: 'node-a', store, timeout: 1500, ...fast, fetch: lossy, onRetry: r => retries.push(r) });
  const receipts = [];
  const sending = (async () => {
    for (let i = 0; i < 60; i++) {
      if (i % 15 === 7) lossy.drop(1);
      receipts.push(await producer.send(batch(i)));
    }
  })();
  await until(() => receipts.length >= 20, WAIT, '20 receipts');
  await control('kill9-restart');
  await until(() => receipts.length >= 40, WAIT, '40 receipts');
  await control('kill9-restart');
  await sending;
  await checkMatchesServer(base, view, 'notes');
  check(record.resets.length === 0, () => `no reset: ${JSON.stringify(record.resets)}`);
  checkAppliedOnce(record);
  check(JSON.stringify(batchesOf(record)) === JSON.stringify(range(0, 60)), () => `batches 0..59 once each, in order: ${batchesOf(record)}`);
  check(receipts.every((r, i) => r.seq === i), 'seq 0..59');
  const duplicates = receipts.filter(r => r.duplicate).length;
  check(duplicates >= 4, `the answers dropped were retried and came back as duplicates (${duplicates})`);
  check(retries.some(r => /no answer/.test(r.reason)), 'a timeout was retried');
  log(`kill -9 x2: 60 batches once each, ${duplicates} duplicate receipts, ${retries.length} retries, ${view.stats.skipped} replayed events skipped`);

  // A restart of this process: a new view on the same store resumes from the stored cursor,
  // with no state transfer.
  const cursor = view.cursor;
  await view.close();
  const proxy = await new FaultProxy(new URL(base).host).listen();
  const again = openView(proxy.url, 'notes', { cursorStore: store, ...fast });
  const record2 = recordChanges(again);
  await until(() => again.cursor === cursor, WAIT, 'the stored cursor');
  check(again.state.size === 5, `the stored state: ${again.state.size} keys`);
  await again.synced();
  for (let i = 60; i < 65; i++) await producer.send(batch(i));
  await checkMatchesServer(base, again, 'notes');
  check(proxy.requests[0].line.includes(`cursor=${encodeURIComponent(cursor)}`), `resumed with ?cursor=: ${proxy.requests[0].line}`);
  check(record2.swaps === 0 && record2.resets.length === 0, 'no state transfer, no reset');
  check(JSON.stringify(batchesOf(record2)) === JSON.stringify(range(60, 65)), () => `batches 60..64: ${batchesOf(record2)}`);
  await again.close();
  await proxy.close();
});

test('the data dir deleted between lives: exactly one reset, then the new state; the producer renumbers', async () => {
  const store = fileStore(join(dir, 'b'));
  const view = openView(base, 'notes', { cursorStore: store, ...fast });
  const record = recordChanges(view);
  const gaps = [];
  const producer = openProducer(base, 'fixture', { id: 'node-b', store, ...fast, onGap: g => gaps.push(g) });
  for (let i = 0; i < 10; i++) await producer.send(batch(i));
  await checkMatchesServer(base, view, 'notes');
  await control('kill9-wipe-restart');
  const receipts = [];
  for (let i = 100; i < 103; i++) receipts.push(await producer.send(batch(i)));
  await checkMatchesServer(base, view, 'notes');
  check(record.resets.length === 1, () => `exactly one reset: ${JSON.stringify(record.resets)}`);
  check(['stale_epoch', 'ahead', 'expired'].includes(record.resets[0].reason), `a reset naming why: ${JSON.stringify(record.resets[0])}`);
  check(view.state.size === 3, `only the new life's keys: ${[...view.state.keys()]}`);
  check(gaps.length === 1 && gaps[0].sent === 10 && gaps[0].expected === 0, `one gap, 10 → 0: ${JSON.stringify(gaps)}`);
  check(receipts.map(r => r.seq).join() === '0,1,2', `renumbered from 0: ${receipts.map(r => r.seq)}`);
  checkAppliedOnce(record);
  log(`wiped: one reset (${record.resets[0].reason}), producer renumbered`);
  await view.close();
});

test('through a faulty proxy: 503 with Retry-After, a cut mid-frame, stripped ids, buffering, a login page, a fast loop', async () => {
  const proxy = await new FaultProxy(new URL(base).host).listen();
  const producer = openProducer(base, 'fixture', { id: 'node-c', ...fast });
  let next = 0;
  const send = async n => { for (const end = next + n; next < end; next++) await producer.send(batch(next)); };
  await send(3);
  proxy.plan = ['503'];
  const view = openView(proxy.url, 'notes', { ...fast, firstByteTimeout: 1000 });
  const record = recordChanges(view);
  const codes = () => record.errors.map(e => e.code);
  await view.synced();
  const [refused, retried] = proxy.requests;
  check(refused.mode === '503' && record.errors[0]?.status === 503, `a 503 first: ${JSON.stringify(proxy.requests)}`);
  check(retried.at - refused.at >= 1000, `Retry-After honoured: ${retried.at - refused.at} ms`);
  await send(3);
  await checkMatchesServer(base, view, 'notes');

  // A cut mid-frame: the next connection passes bytes until an update and cuts it in half.
  proxy.plan = ['cut'];
  proxy.dropAll();
  await until(() => proxy.requests.length === 3, WAIT, 'a reconnection through the cutting proxy');
  await send(4);
  await checkMatchesServer(base, view, 'notes');
  check(codes().includes('network'), () => `the cut was seen: ${codes()}`);

  // Ids stripped: the client refuses to apply what it cannot place, says why and reconnects.
  proxy.plan = ['strip-ids'];
  const stripped = proxy.requests.length;
  proxy.dropAll();
  await until(() => proxy.requests.length > stripped, WAIT, 'a reconnection through the id-stripping proxy');
  await send(2);
  await until(() => codes().includes('missing_id'), WAIT, 'missing_id');
  await checkMatchesServer(base, view, 'notes');

  // A buffering proxy: headers, then nothing.
  proxy.plan = ['buffer'];
  proxy.dropAll();
  await until(() => codes().includes('stream_buffered'), WAIT, 'stream_buffered');
  await send(2);
  await checkMatchesServer(base, view, 'notes');

  // A login page where the stream should be, again and again: bad_content_type, then the guard.
  proxy.plan = Array(6).fill('html');
  proxy.dropAll();
  await until(() => codes().includes('fast_retry_loop'), WAIT, 'fast_retry_loop');
  check(codes().includes('bad_content_type'), () => `bad_content_type: ${codes()}`);
  await send(2);
  await checkMatchesServer(base, view, 'notes');

  check(record.resets.length === 0, 'no reset');
  checkAppliedOnce(record);
  const seen = batchesOf(record);
  check(JSON.stringify(seen) === JSON.stringify(range(3, next)), () => `every batch after the first state once, in order: ${seen}`);
  log(`proxy faults: ${proxy.requests.length} connections, errors ${[...new Set(codes())].join(', ')}`);
  await view.close();
  await proxy.close();
});

/** `promise`, or a failure after `ms`. */
async function within(promise, ms, what) {
  let timer;
  const late = new Promise((_, reject) => (timer = setTimeout(() => reject(new Error(`${what} did not finish within ${ms} ms`)), ms)));
  try {
    return await Promise.race([promise, late]);
  } finally {
    clearTimeout(timer);
  }
}

/** The server's count of open SSE streams (`viewtape_sse_connections` on /metrics). */
async function sseConnections() {
  const text = await (await fetch(`${base}/metrics`, { signal: AbortSignal.timeout(10000) })).text();
  const line = text.split('\n').find(l => l.startsWith('viewtape_sse_connections '));
  check(line, 'viewtape_sse_connections on /metrics');
  return Number(line.split(' ')[1]);
}

/**
 * Tracks the timers the client's own code sets (`setTimeout` called from clients/js/dist), as
 * `pending`: set and neither fired nor cleared. Undici's and the test's timers are not counted.
 */
function trackClientTimers() {
  const realSet = globalThis.setTimeout;
  const realClear = globalThis.clearTimeout;
  const pending = new Map();
  globalThis.setTimeout = function (fn, ms, ...args) {
    if (!/[\\/]clients[\\/]js[\\/]dist[\\/]/.test(new Error().stack ?? '')) return realSet(fn, ms, ...args);
    const handle = realSet((...a) => {
      pending.delete(handle);
      fn(...a);
    }, ms, ...args);
    pending.set(handle, ms);
    return handle;
  };
  globalThis.clearTimeout = handle => {
    pending.delete(handle);
    realClear(handle);
  };
  return { pending, restore: () => Object.assign(globalThis, { setTimeout: realSet, clearTimeout: realClear }) };
}

/** A page as the view sees one: `document` (hidden, so the hidden-tab timer runs) and the
 * window's `pagehide`; counts the listeners added and not removed. */
function fakePage() {
  const listeners = new Set();
  const ids = new Map();
  const on = (target, type, fn) => {
    if (!ids.has(fn)) ids.set(fn, ids.size);
    return `${target} ${type} #${ids.get(fn)}`;
  };
  const add = target => (type, fn) => void listeners.add(on(target, type, fn));
  const remove = target => (type, fn) => void listeners.delete(on(target, type, fn));
  globalThis.document = { visibilityState: 'hidden', addEventListener: add('document'), removeEventListener: remove('document') };
  globalThis.addEventListener = add('window');
  globalThis.removeEventListener = remove('window');
  return {
    listeners,
    restore: () => {
      delete globalThis.document;
      delete globalThis.addEventListener;
      delete globalThis.removeEventListener;
    },
  };
}

test('close(): the server keeps producing and no listener fires, no client timer is left (watchdog, save, hidden tab), and the server counts the stream closed', async () => {
  // Batches go by plain `fetch` here, not a producer: only the view's timers are tracked.
  const publish = i => ingest(base, 'fixture', batch(i));
  await until(async () => (await sseConnections()) === 0, 10000, 'no stream open before the test');
  const timers = trackClientTimers();
  const page = fakePage();
  try {
    const saves = [];
    const inner = memoryStore();
    const store = { load: k => inner.load(k), save: (k, v) => { saves.push(v.cursor); return inner.save(k, v); } };
    // Distinct delays, to tell the timers apart: the stall watchdog, the hidden-tab release,
    // the store's write-behind.
    const view = openView(base, 'notes', { ...fast, cursorStore: store, stallTimeout: 61000, releaseWhenHiddenAfter: 62000, saveInterval: 63000 });
    const fired = { change: 0, status: 0, error: 0, synced: 0, reset: 0, connected: 0, reauth: 0 };
    for (const event of Object.keys(fired)) view.on(event, () => void (fired[event] += 1));
    await within(view.synced(), WAIT, 'synced()');
    // The write right after synced first: while it is pending, a change joins it instead of
    // arming the write-behind timer.
    await until(() => saves.length > 0, WAIT, 'the write after synced');
    await publish(0);
    const head = (await getJson(base, '/views/notes')).cursor;
    await until(() => view.cursor === head, WAIT, 'the batch applied');
    const armed = [...timers.pending.values()];
    for (const ms of [61000, 62000, 63000]) check(armed.includes(ms), () => `a live, hidden view with a write pending has its ${ms} ms timer: ${armed}`);
    check(page.listeners.size === 2, () => `visibilitychange and pagehide listened to: ${[...page.listeners]}`);
    check((await sseConnections()) === 1, 'the server counts the view\'s stream');
    const cursor = view.cursor;

    await within(view.close(), 5000, 'close()');
    const counts = JSON.stringify(fired);
    check(view.status === 'closed', view.status);
    check(saves.at(-1) === cursor, () => `close() wrote the last position: ${saves.at(-1)} vs ${cursor}`);
    check(timers.pending.size === 0, () => `no client timer left after close: ${[...timers.pending.values()]} ms`);
    check(page.listeners.size === 0, () => `no page listener left after close: ${[...page.listeners]}`);
    await until(async () => (await sseConnections()) === 0, 5000, 'the server to count the stream closed');

    // The server goes on: new events exist, and nothing reaches the closed view.
    for (let i = 1; i < 6; i++) await publish(i);
    const server = await getJson(base, '/views/notes');
    check(server.cursor !== cursor, 'the server produced events after close');
    await sleep(500);
    check(JSON.stringify(fired) === counts, () => `no listener fired after close: ${counts} → ${JSON.stringify(fired)}`);
    check(view.cursor === cursor && view.status === 'closed', `nothing applied after close: ${view.cursor}`);
    check(timers.pending.size === 0, () => `still no client timer: ${[...timers.pending.values()]} ms`);
  } finally {
    timers.restore();
    page.restore();
  }
});

test("a stream's retry: hint is the floor of the reconnection right after it, and of no later one", async () => {
  const proxy = await new FaultProxy(new URL(base).host).listen();
  // maxDelay 400: without a hint, no attempt waits more than 0.4 s.
  const view = openView(proxy.url, 'notes', { minDelay: 100, maxDelay: 400 });
  const record = recordChanges(view);
  await within(view.synced(), WAIT, 'synced()');
  await until(() => proxy.retryHints.length > 0, 5000, 'the stream\'s retry: hint');
  const hint = proxy.retryHints.at(-1).ms;
  check(hint >= 1500, `the server hints ${hint} ms (its default [server] retry is 2 s); this test needs ≥ 1.5 s`);
  // The stream is cut; then three answers that are no stream (a login page, no hint), then one.
  proxy.plan = ['html', 'html', 'html', 'pass'];
  const cut = Date.now();
  proxy.dropAll();
  await until(() => proxy.requests.length === 5, WAIT, 'four reconnections');
  await within(view.synced(), WAIT, 'synced()');
  const at = proxy.requests.map(r => r.at);
  check(at[1] - cut >= hint - 20, `the first reconnection waited for the hint: ${at[1] - cut} ms < ${hint} ms`);
  const gaps = [at[2] - at[1], at[3] - at[2], at[4] - at[3]];
  check(gaps.every(g => g < hint - 500), () => `the hint was used once: later attempts back off from minDelay (≤ 0.4 s): ${gaps} ms`);
  check(record.errors.filter(e => e.code === 'bad_content_type').length === 3, () => `three login pages: ${record.errors.map(e => e.code)}`);
  log(`retry: ${hint} ms honoured once (${at[1] - cut} ms), then ${gaps.join(', ')} ms`);
  await view.close();
  await proxy.close();
});

test('a producer waits out a 503 with Retry-After and sends the same seq again', async () => {
  let refusals = 1;
  const sent = [];
  const fetch503 = async (url, init) => {
    // The producer has no store: its epoch claim goes first, untouched.
    if (!url.endsWith('/ingest')) return fetch(url, init);
    sent.push({ seq: init.headers['Producer-Seq'], at: Date.now() });
    if (refusals-- > 0) return new Response('{"error":"unavailable","message":"later"}', { status: 503, headers: { 'retry-after': '1' } });
    return fetch(url, init);
  };
  const producer = openProducer(base, 'fixture', { id: 'node-e', fetch: fetch503, ...fast });
  const receipt = await producer.send(batch(0));
  check(receipt.seq === 0 && !receipt.duplicate, JSON.stringify(receipt));
  check(sent.length === 2 && sent[0].seq === '0' && sent[1].seq === '0', JSON.stringify(sent));
  check(sent[1].at - sent[0].at >= 1000, `Retry-After honoured: ${sent[1].at - sent[0].at} ms`);
});

test('a producer without a store, run twice under one id, publishes both runs (each claims an epoch)', async () => {
  const runs = [];
  for (const run of [0, 1]) {
    const producer = openProducer(base, 'fixture', { id: 'node-twice', ...fast });
    const receipt = await producer.send(`publish notes twice-${run} ${JSON.stringify({ batch: 1000 + run })}\n`);
    check(!receipt.duplicate && receipt.seq === 0, `run ${run}: ${JSON.stringify(receipt)}`);
    runs.push(producer.epoch);
    producer.close();
  }
  check(runs[1] > runs[0], `the second run claimed a newer epoch: ${runs}`);
  const notes = await getJson(base, '/views/notes');
  for (const run of [0, 1]) {
    check(notes.entries[`twice-${run}`]?.batch === 1000 + run, `run ${run} published: ${JSON.stringify(notes.entries)}`);
  }
});

test('an empty batch is refused by the producer, as the server refuses it, and takes no seq', async () => {
  const sent = [];
  const counting = async (url, init) => {
    if (String(url).endsWith('/ingest')) sent.push(init.headers['Producer-Seq']);
    return fetch(url, init);
  };
  const producer = openProducer(base, 'fixture', { id: 'node-empty', fetch: counting, ...fast });
  for (const empty of [[], '', new Uint8Array()]) {
    const refused = await producer.send(empty).then(() => undefined, error => error);
    check(refused?.code === 'rejected', `refused: ${refused}`);
  }
  const receipt = await producer.send(batch(0));
  check(receipt.seq === 0 && JSON.stringify(sent) === '["0"]', `${JSON.stringify(receipt)} after ${JSON.stringify(sent)}`);
});

test('keys narrow a view: only those keys are applied, and the map equals GET /views/notes?keys= at the same cursor', async () => {
  const view = openView(base, 'notes', { keys: ['k1', 'k3'], ...fast });
  const record = recordChanges(view);
  const producer = openProducer(base, 'fixture', { id: 'node-k', ...fast });
  try {
    await within(view.synced(), 10000, 'synced()');
    // Batches over k0..k4; the last one is k1's, so the narrowed cursor reaches the head.
    for (let i = 0; i <= 11; i++) await producer.send(batch(i));
    await checkMatchesServer(base, view, 'notes?keys=k1,k3');
    const keys = new Set(record.live.map(c => c.key));
    check(keys.size === 2 && keys.has('k1') && keys.has('k3'), `only k1 and k3 applied: ${[...keys]}`);
    check([...view.state.keys()].every(k => k === 'k1' || k === 'k3'), `the map: ${[...view.state.keys()]}`);
    checkAppliedOnce(record);
  } finally {
    await within(view.close(), 5000, 'close()');
  }
});

test('keys and prefix together are refused with 400: the view closes with a fatal error instead of retrying', async () => {
  const proxy = await new FaultProxy(new URL(base).host).listen();
  const view = openView(proxy.url, 'notes', { keys: ['k1', 'k2'], prefix: 'k', after: 1, ...fast });
  try {
    const record = recordChanges(view);
    const refused = await within(view.synced().then(() => undefined, e => e), 10000, 'synced() to settle');
    check(proxy.requests[0].line === 'GET /views/notes/events?keys=k1%2Ck2&prefix=k&after=1 HTTP/1.1', proxy.requests[0].line);
    check(refused?.code === 'bad_request' && refused.status === 400 && refused.fatal, `synced() rejects with a fatal bad_request 400: ${refused}`);
    check(/keys/.test(refused.message), `the error says what was refused: ${refused.message}`);
    check(view.status === 'closed' && view.error === refused, `closed with the error: ${view.status}`);
    check(record.errors.length === 1, () => `one error: ${record.errors.map(e => e.code)}`);
    // minDelay 100: a view that retried would have asked several times by now.
    await sleep(1500);
    check(proxy.requests.length === 1, `no retry after a 400: ${proxy.requests.length} requests`);
    log(`keys/prefix: ${refused.message}`);
  } finally {
    await within(view.close(), 5000, 'close()');
    await proxy.close();
  }
});

// How a view ends, with no viewtape server: `openView` against a scripted `fetch` that answers
// each connection from a plan (a stream of SSE frames, or an error status). Run by `npm test`
// (after `npm run build`).
//
// A view the server retires (`event: retired`, no `id:`, then the end of the stream) and a view
// the server does not have (`404`, on the first connection or on a reconnection) close: status
// `closed`, one fatal error with a stable code, `synced()` rejects with it, and no further
// connection is made. A stream that merely ends is reconnected, in the same harness.
import { afterEach, test } from 'node:test';
import assert from 'node:assert/strict';

import { openView, ViewError } from '@viewtape/client';

const fast = { minDelay: 5, maxDelay: 10 };
/** A test that waits for what never comes fails instead of hanging. */
const limit = { timeout: 5000 };
/** An epoch, as the server writes it in cursors (`<16 hex>-<offset>`). */
const E = '00000000000000e1';
const opened = [];
afterEach(async () => {
  await Promise.all(opened.splice(0).map(view => view.close())); // a failed test leaves nothing running
});
const sleep = ms => new Promise(resolve => setTimeout(resolve, ms));

/** One SSE frame. */
const frame = (event, data, id) => `${id === undefined ? '' : `id: ${id}\n`}event: ${event}\ndata: ${JSON.stringify(data)}\n\n`;
const synced = (entries, cursor) => [...entries.map(([key, value]) => frame('state', { key, value })), frame('synced', {}, cursor)];

/**
 * A `fetch` that answers the n-th request with `plan[n]`: `{ frames, end }` (a `200` stream of
 * those frames, ended by the server if `end`, else held open until the client aborts) or
 * `{ status, body }`. Past the plan, every request gets a stream held open. `urls` records what
 * was asked.
 */
function scripted(plan) {
  const urls = [];
  const fetch = async (url, init) => {
    urls.push(String(url));
    const answer = plan[urls.length - 1] ?? { frames: [], end: false };
    if (answer.status !== undefined) {
      return new Response(JSON.stringify(answer.body), { status: answer.status, headers: { 'content-type': 'application/json' } });
    }
    const encoder = new TextEncoder();
    const body = new ReadableStream({
      start(controller) {
        controller.enqueue(encoder.encode(': open\n\n'));
        for (const f of answer.frames) controller.enqueue(encoder.encode(f));
        if (answer.end) controller.close();
        else init.signal.addEventListener('abort', () => controller.error(init.signal.reason), { once: true });
      },
    });
    return new Response(body, { status: 200, headers: { 'content-type': 'text/event-stream' } });
  };
  return { fetch, urls };
}

/** Opens `name` on `fetch`, recording its statuses and errors. */
function watched(fetch, name = 'prices') {
  const view = openView('http://viewtape.test', name, { fetch, ...fast });
  opened.push(view);
  const statuses = [];
  const errors = [];
  view.on('status', s => void statuses.push(s));
  view.on('error', e => void errors.push(e));
  return { view, statuses, errors };
}

async function until(condition, what, ms = 2000) {
  for (const end = Date.now() + ms; !condition(); ) {
    if (Date.now() > end) assert.fail(`timed out waiting for ${what}`);
    await sleep(5);
  }
}

test('event: retired closes the view with a fatal `retired` error and it never reconnects', limit, async () => {
  const server = scripted([
    {
      frames: [
        ...synced([['AAPL', { price: 1 }]], `${E}-1`),
        frame('update', { key: 'AAPL', value: { price: 2 } }, `${E}-2`),
        frame('retired', { view: 'prices', reason: 'runtime demo was deleted' }),
      ],
      end: true,
    },
  ]);
  const { view, statuses, errors } = watched(server.fetch);
  await until(() => view.status === 'closed', 'the view to close');
  await sleep(100); // many backoff delays (5..10 ms): a reconnection would have happened
  assert.equal(server.urls.length, 1, `no reconnection: ${server.urls}`);
  assert.deepEqual(statuses, ['syncing', 'live', 'closed']);
  assert.equal(errors.length, 1, `one error: ${errors.map(e => e.code)}`);
  const [error] = errors;
  assert.ok(error instanceof ViewError);
  assert.equal(error.code, 'retired');
  assert.equal(error.fatal, true);
  assert.equal(error.reason, 'runtime demo was deleted');
  assert.match(error.message, /retired the view "prices": runtime demo was deleted/);
  assert.equal(view.error, error);
  // The last state the view had stays, at the last cursor.
  assert.equal(view.cursor, `${E}-2`);
  assert.deepEqual(Object.fromEntries(view.state), { AAPL: { price: 2 } });
  await assert.rejects(view.synced(), e => e === error);
  await view.close();
});

test('event: retired before synced rejects a waiting synced(), even with data that is not JSON', limit, async () => {
  const server = scripted([{ frames: [frame('state', { key: 'a', value: 1 }), 'event: retired\ndata: gone\n\n'], end: true }]);
  const { view, errors } = watched(server.fetch, 'chat.room1');
  await assert.rejects(view.synced(), e => e instanceof ViewError && e.code === 'retired' && e.reason === undefined);
  assert.equal(view.status, 'closed');
  assert.deepEqual(errors.map(e => e.code), ['retired']);
  assert.match(errors[0].message, /"chat\.room1"/);
  assert.equal(view.state.size, 0, 'a staged state is never swapped in without synced');
  await sleep(50);
  assert.equal(server.urls.length, 1);
});

test('a stream that just ends is reconnected from its cursor (what retired prevents)', limit, async () => {
  const server = scripted([{ frames: synced([['AAPL', { price: 1 }]], `${E}-1`), end: true }]);
  const { view, statuses, errors } = watched(server.fetch);
  await until(() => server.urls.length === 2, 'a reconnection');
  assert.match(server.urls[1], new RegExp(`[?&]cursor=${E}-1$`));
  assert.ok(!statuses.includes('closed'));
  assert.deepEqual(errors.map(e => [e.code, e.fatal]), [['network', false]]);
  await view.close();
  assert.equal(view.status, 'closed');
});

test('a 404 on the first connection closes the view with a fatal `not_found` naming the view', limit, async () => {
  const server = scripted([{ status: 404, body: { error: 'not_found', message: 'no view named nope' } }]);
  const { view, statuses, errors } = watched(server.fetch, 'nope');
  await assert.rejects(view.synced(), e => e instanceof ViewError && e.code === 'not_found');
  await sleep(100);
  assert.equal(server.urls.length, 1, `no retry: ${server.urls}`);
  assert.equal(view.status, 'closed');
  assert.deepEqual(statuses, ['closed']);
  assert.equal(errors.length, 1);
  assert.equal(errors[0].status, 404);
  assert.equal(errors[0].fatal, true);
  assert.match(errors[0].message, /no view "nope" \(404\): no view named nope; not retrying/);
});

test('a 404 on a reconnection (the view went away meanwhile) closes the view, keeping its last state', limit, async () => {
  const server = scripted([
    { frames: synced([['k', 'v']], `${E}-3`), end: true },
    { status: 404, body: { error: 'not_found', message: 'no view named prices' } },
  ]);
  const { view, statuses, errors } = watched(server.fetch);
  await until(() => view.status === 'closed', 'the view to close');
  await sleep(100);
  assert.equal(server.urls.length, 2);
  assert.match(server.urls[1], new RegExp(`[?&]cursor=${E}-3$`));
  assert.deepEqual(statuses, ['syncing', 'live', 'reconnecting', 'closed']);
  assert.deepEqual(errors.map(e => [e.code, e.fatal]), [['network', false], ['not_found', true]]);
  assert.equal(view.error, errors[1]);
  assert.deepEqual(Object.fromEntries(view.state), { k: 'v' });
});

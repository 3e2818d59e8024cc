// The idempotent producer with no viewtape server: a `fetch` that answers as the server's
// producer contract does (`POST /runtimes/{runtime}/producers/{id}` claims the next epoch;
// ingest commits seq last + 1, answers a resent seq with its original receipt, a seq reused for
// another body with `409 producer_seq_reused`, a seq past the next with
// `409 producer_out_of_order`, an older epoch with `403 producer_fenced`), with answers that can
// be replaced one request at a time. Run by `npm test` (after `npm run build`).
import { describe, test } from 'node:test';
import assert from 'node:assert/strict';

import { memoryStore, openProducer, ProducerError } from '@viewtape/client';

const BASE = 'http://viewtape.test';
const fast = { minDelay: 1, maxDelay: 5 };

const json = (status, body, headers = {}) =>
  new Response(JSON.stringify(body), { status, headers: { 'content-type': 'application/json', ...headers } });

/**
 * The server's side of the producer contract, in memory. `requests` records every request;
 * `plan` holds answers (or functions of the request returning one, or undefined for the model's)
 * that replace the model's for the next requests, in order.
 */
class FakeServer {
  constructor() {
    this.requests = [];
    this.plan = [];
    /** `${runtime}/${id}` → { epoch, last, bodies: Map<seq, body>, receipts: Map<seq, receipt> } */
    this.producers = new Map();
    this.published = [];
    this.fetch = (url, init) => this.#answer(url, init);
  }

  claims() {
    return this.requests.filter(r => r.path.includes('/producers/'));
  }

  batches() {
    return this.requests.filter(r => r.path.endsWith('/ingest'));
  }

  async #answer(url, init) {
    const { pathname } = new URL(url);
    const headers = new Headers(init.headers);
    const body = init.body === undefined ? undefined : typeof init.body === 'string' ? init.body : new TextDecoder().decode(init.body);
    const request = { path: pathname, method: init.method, headers, body };
    this.requests.push(request);
    const planned = this.plan.shift();
    const replaced = typeof planned === 'function' ? await planned(request) : planned;
    if (replaced !== undefined) return replaced;
    const claim = /^\/runtimes\/([^/]+)\/producers\/([^/]+)$/.exec(pathname);
    if (claim) return this.#claim(`${decodeURIComponent(claim[1])}/${decodeURIComponent(claim[2])}`);
    const ingest = /^\/runtimes\/([^/]+)\/ingest$/.exec(pathname);
    if (ingest) return this.#ingest(decodeURIComponent(ingest[1]), headers, body);
    return json(404, { error: 'not_found', message: 'no such path' });
  }

  #claim(key) {
    const known = this.producers.get(key);
    const epoch = known ? known.epoch + 1 : 1;
    this.producers.set(key, { epoch, last: -1, bodies: new Map(), receipts: new Map() });
    return json(200, { producer: key.split('/')[1], epoch, seq: 0, position: null, durability: null });
  }

  #ingest(runtime, headers, body) {
    const key = `${runtime}/${headers.get('producer-id')}`;
    const epoch = Number(headers.get('producer-epoch'));
    const seq = Number(headers.get('producer-seq'));
    let producer = this.producers.get(key);
    if (!producer || epoch > producer.epoch) {
      producer = { epoch, last: -1, bodies: new Map(), receipts: new Map() };
      this.producers.set(key, producer);
    }
    if (epoch < producer.epoch) return json(403, { error: 'producer_fenced', message: 'fenced' });
    const next = producer.last + 1;
    if (seq < next) {
      if (producer.bodies.get(seq) !== body) {
        return json(409, { error: 'producer_seq_reused', message: 'reused', next_seq: next }, { 'producer-expected-seq': String(next) });
      }
      return json(200, producer.receipts.get(seq), { 'producer-duplicate': 'true' });
    }
    if (seq > next) {
      return json(409, { error: 'producer_out_of_order', message: 'out of order', next_seq: next }, { 'producer-expected-seq': String(next) });
    }
    this.published.push(body);
    const receipt = { events: { prices: 1 }, gaps: [], position: this.published.length, durability: 'fsync' };
    producer.last = seq;
    producer.bodies.set(seq, body);
    producer.receipts.set(seq, receipt);
    return json(200, receipt);
  }
}

/** A memory store that records every value saved, in order. */
function recordingStore() {
  const inner = memoryStore();
  const saves = [];
  return {
    saves,
    load: key => inner.load(key),
    save: (key, value) => {
      saves.push(structuredClone(value));
      return inner.save(key, value);
    },
  };
}

describe('epochs', () => {
  /** Guards against a second run without a store starting again at epoch 0 / seq 0: the server
   * took its first batches for the first run's duplicates and never published them. */
  test('a run without a store claims a new epoch first, so a second run under the same id publishes its batches', async () => {
    const server = new FakeServer();
    const first = openProducer(BASE, 'demo', { id: 'feed-1', fetch: server.fetch, ...fast });
    await first.send('{"run":1}\n');
    const second = openProducer(BASE, 'demo', { id: 'feed-1', fetch: server.fetch, ...fast });
    const receipt = await second.send('{"run":2}\n');
    assert.equal(receipt.duplicate, false);
    assert.deepEqual(server.published, ['{"run":1}\n', '{"run":2}\n']);
    assert.deepEqual(server.requests.map(r => `${r.method} ${r.path}`), [
      'POST /runtimes/demo/producers/feed-1',
      'POST /runtimes/demo/ingest',
      'POST /runtimes/demo/producers/feed-1',
      'POST /runtimes/demo/ingest',
    ]);
    assert.deepEqual(server.batches().map(r => [r.headers.get('producer-epoch'), r.headers.get('producer-seq')]), [['1', '0'], ['2', '0']]);
    assert.equal(second.epoch, 2);
    assert.equal(second.nextSeq, 1);
  });

  test('the claim goes out before the first batch with the token and no body; the claimed epoch is stored before the batch', async () => {
    const server = new FakeServer();
    server.producers.set('demo/feed/1?a#b', { epoch: 6, last: 40, bodies: new Map(), receipts: new Map() });
    const store = recordingStore();
    const producer = openProducer(BASE, 'demo', { id: 'feed/1?a#b', token: 'ingest-token', store, fetch: server.fetch, ...fast });
    const receipt = await producer.send(['{"a":1}', '{"a":2}']);
    const [claim, batch] = server.requests;
    assert.equal(claim.path, '/runtimes/demo/producers/feed%2F1%3Fa%23b');
    assert.equal(claim.method, 'POST');
    assert.equal(claim.body, undefined);
    assert.equal(claim.headers.get('authorization'), 'Bearer ingest-token');
    assert.equal(batch.headers.get('producer-epoch'), '7');
    assert.equal(batch.headers.get('producer-seq'), '0');
    assert.equal(batch.headers.get('authorization'), 'Bearer ingest-token');
    assert.deepEqual([receipt.epoch, receipt.seq, receipt.duplicate], [7, 0, false]);
    assert.deepEqual(store.saves, [
      { epoch: 7, nextSeq: 0 },
      { epoch: 7, nextSeq: 0, pending: { seq: 0, body: '{"a":1}\n{"a":2}\n' } },
      { epoch: 7, nextSeq: 1 },
    ]);
  });

  test('ready() claims the epoch too, and a later send claims none', async () => {
    const server = new FakeServer();
    const producer = openProducer(BASE, 'demo', { id: 'feed-1', fetch: server.fetch, ...fast });
    assert.equal(await producer.ready(), undefined);
    assert.equal(producer.epoch, 1);
    assert.equal(server.batches().length, 0);
    await producer.send('x\n');
    await producer.send('y\n');
    assert.equal(server.claims().length, 1);
  });

  test('an explicit epoch claims nothing and goes out as given', async () => {
    const server = new FakeServer();
    const producer = openProducer(BASE, 'demo', { id: 'feed-1', epoch: 3, fetch: server.fetch, ...fast });
    const receipt = await producer.send('x\n');
    assert.equal(server.claims().length, 0);
    assert.deepEqual(server.batches().map(r => r.headers.get('producer-epoch')), ['3']);
    assert.deepEqual([receipt.epoch, receipt.seq], [3, 0]);
  });

  test('a stored position claims nothing: the producer resumes at its stored epoch and seq', async () => {
    const server = new FakeServer();
    server.producers.set('demo/feed-1', { epoch: 4, last: 8, bodies: new Map(), receipts: new Map() });
    const store = memoryStore();
    await store.save('demo/feed-1', { epoch: 4, nextSeq: 9 });
    const producer = openProducer(BASE, 'demo', { id: 'feed-1', store, fetch: server.fetch, ...fast });
    const receipt = await producer.send('x\n');
    assert.equal(server.claims().length, 0);
    assert.deepEqual([receipt.epoch, receipt.seq, receipt.duplicate], [4, 9, false]);
    assert.deepEqual(await store.load('demo/feed-1'), { epoch: 4, nextSeq: 10 });
  });

  test('a claim answered 503 waits out Retry-After and claims again; a lost answer is claimed again too', async () => {
    const server = new FakeServer();
    server.plan = [json(503, { error: 'unavailable', message: 'later' }, { 'retry-after': '0.2' }), () => Promise.reject(new TypeError('fetch failed'))];
    const retries = [];
    const started = Date.now();
    const producer = openProducer(BASE, 'demo', { id: 'feed-1', fetch: server.fetch, onRetry: r => retries.push(r), ...fast });
    const receipt = await producer.send('x\n');
    assert.ok(Date.now() - started >= 200, `Retry-After honoured: ${Date.now() - started} ms`);
    assert.equal(server.claims().length, 3);
    assert.deepEqual(retries.map(r => [r.seq, r.attempt, r.reason.split(':')[0]]), [[0, 1, 'epoch claim'], [0, 2, 'epoch claim']]);
    assert.match(retries[0].reason, /status 503/);
    assert.ok(retries[0].delay >= 200);
    assert.equal(receipt.epoch, 1);
  });

  test('a claim refused for the token asks the callback again; a claim for an unknown runtime fails plainly', async () => {
    const server = new FakeServer();
    server.plan = [({ headers }) => (headers.get('authorization') === 'Bearer good' ? undefined : json(403, { error: 'forbidden', message: 'no grant' }))];
    const tokens = ['view-only', 'good'];
    const producer = openProducer(BASE, 'demo', { id: 'feed-1', token: () => tokens.shift(), fetch: server.fetch, ...fast });
    await producer.send('x\n');
    assert.deepEqual(server.claims().map(r => r.headers.get('authorization')), ['Bearer view-only', 'Bearer good']);

    const missing = new FakeServer();
    missing.plan = [json(404, { error: 'not_found', message: 'no runtime nope' })];
    const lost = openProducer(BASE, 'nope', { id: 'feed-1', fetch: missing.fetch, ...fast });
    await assert.rejects(lost.send('x\n'), e => e instanceof ProducerError && e.code === 'rejected' && e.status === 404);
    assert.equal(missing.batches().length, 0);
  });

  test('close() during a claim that keeps failing ends it with closed', async () => {
    const server = new FakeServer();
    server.plan = Array.from({ length: 1000 }, () => json(503, { error: 'unavailable', message: 'later' }));
    const producer = openProducer(BASE, 'demo', { id: 'feed-1', fetch: server.fetch, ...fast });
    const sending = producer.send('x\n');
    while (server.requests.length < 3) await new Promise(resolve => setTimeout(resolve, 1));
    producer.close();
    await assert.rejects(sending, e => e instanceof ProducerError && e.code === 'closed');
    assert.equal(server.batches().length, 0);
  });
});

describe('ingest answers', () => {
  test('a duplicate is a success with the original receipt', async () => {
    const server = new FakeServer();
    const producer = openProducer(BASE, 'demo', { id: 'feed-1', fetch: server.fetch, ...fast });
    const original = await producer.send('x\n');
    // The answer to the next batch is lost: the retry of seq 1 is a duplicate.
    server.plan = [async request => {
      await server.fetch(`${BASE}${request.path}`, { method: 'POST', headers: request.headers, body: request.body });
      throw new TypeError('the answer was lost');
    }];
    const retried = await producer.send('y\n');
    assert.equal(original.duplicate, false);
    assert.deepEqual([retried.seq, retried.duplicate, retried.position], [1, true, 2]);
    assert.deepEqual(server.published, ['x\n', 'y\n']);
  });

  /** Guards against a seq the server committed for another body being renumbered or taken for
   * a success: the batch was not published. */
  test('409 producer_seq_reused throws seq_reused with the next seq; nothing renumbered, the batch stays pending', async () => {
    const server = new FakeServer();
    server.producers.set('demo/feed-1', { epoch: 3, last: 4, bodies: new Map([[2, 'another\n']]), receipts: new Map() });
    const store = memoryStore();
    await store.save('demo/feed-1', { epoch: 3, nextSeq: 2 });
    const gaps = [];
    const producer = openProducer(BASE, 'demo', { id: 'feed-1', store, fetch: server.fetch, onGap: g => gaps.push(g), ...fast });
    await assert.rejects(producer.send('mine\n'), e => {
      assert.ok(e instanceof ProducerError);
      assert.deepEqual([e.code, e.status, e.expectedSeq], ['seq_reused', 409, 5]);
      return true;
    });
    assert.equal(server.batches().length, 1);
    assert.deepEqual(gaps, []);
    assert.deepEqual(server.published, []);
    assert.deepEqual(await store.load('demo/feed-1'), { epoch: 3, nextSeq: 2, pending: { seq: 2, body: 'mine\n' } });
  });

  test('the body\'s error code decides: seq_reused with an expected seq lower than ours is not renumbered', async () => {
    const server = new FakeServer();
    server.plan = [json(409, { error: 'producer_seq_reused', message: 'reused', next_seq: 3 }, { 'producer-expected-seq': '3' })];
    const store = memoryStore();
    await store.save('demo/feed-1', { epoch: 2, nextSeq: 5 });
    const gaps = [];
    const producer = openProducer(BASE, 'demo', { id: 'feed-1', store, fetch: server.fetch, onGap: g => gaps.push(g), ...fast });
    await assert.rejects(producer.send('x\n'), e => e instanceof ProducerError && e.code === 'seq_reused' && e.expectedSeq === 3);
    assert.deepEqual(gaps, []);
    assert.equal(server.batches().length, 1);
  });

  test('409 producer_seq_stale throws seq_stale with the next seq', async () => {
    const server = new FakeServer();
    server.plan = [json(409, { error: 'producer_seq_stale', message: 'stale', next_seq: 900 }, { 'producer-expected-seq': '900' })];
    const producer = openProducer(BASE, 'demo', { id: 'feed-1', epoch: 2, fetch: server.fetch, ...fast });
    await assert.rejects(producer.send('x\n'), e => e instanceof ProducerError && e.code === 'seq_stale' && e.status === 409 && e.expectedSeq === 900);
    assert.equal(server.batches().length, 1);
  });

  test('409 producer_out_of_order with a lower expected seq renumbers the pending batch, as before', async () => {
    const server = new FakeServer();
    const store = memoryStore();
    await store.save('demo/feed-1', { epoch: 5, nextSeq: 7 });
    const gaps = [];
    const producer = openProducer(BASE, 'demo', { id: 'feed-1', store, fetch: server.fetch, onGap: g => gaps.push(g), ...fast });
    const receipt = await producer.send('x\n');
    assert.deepEqual(gaps, [{ sent: 7, expected: 0 }]);
    assert.deepEqual(server.batches().map(r => r.headers.get('producer-seq')), ['7', '0']);
    assert.deepEqual([receipt.epoch, receipt.seq], [5, 0]);

    const strict = openProducer(BASE, 'demo', { id: 'feed-2', epoch: 5, renumber: false, fetch: server.fetch, ...fast });
    server.plan = [json(409, { error: 'producer_out_of_order', message: 'ahead', next_seq: 0 }, { 'producer-expected-seq': '0' })];
    await assert.rejects(strict.send('y\n'), e => e instanceof ProducerError && e.code === 'out_of_order' && e.expectedSeq === 0);
  });

  test('an older epoch is fenced', async () => {
    const server = new FakeServer();
    server.producers.set('demo/feed-1', { epoch: 9, last: -1, bodies: new Map(), receipts: new Map() });
    const producer = openProducer(BASE, 'demo', { id: 'feed-1', epoch: 8, fetch: server.fetch, ...fast });
    await assert.rejects(producer.send('x\n'), e => e instanceof ProducerError && e.code === 'fenced' && e.status === 403);
  });
});

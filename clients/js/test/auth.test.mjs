// @viewtape/client with auth on: `node clients/js/test/auth.test.mjs <base-url> <secret>`, run by
// tests/tests/clients.rs against a server with VIEWTAPE_JWT_SECRET=<secret> and `[auth] audience
// = "viewtape"`. This script signs its own HS256 tokens with the secret.
import { test, after } from 'node:test';

import { openProducer, openView } from '@viewtape/client';

import { check, done, Feed, hs256, ingest, log, until } from '../../common.mjs';
import { checkAppliedOnce, checkMatchesServer, recordChanges, sleep } from './support.mjs';

const [base, secret] = process.argv.slice(2);
check(base && secret, 'usage: auth.test.mjs <base-url> <secret>');
after(() => done());
const now = () => Math.floor(Date.now() / 1000);
const token = (seconds, claims = { views: ['prices'] }) => hs256(secret, { exp: now() + seconds, aud: 'viewtape', ...claims });
const writer = { authorization: `Bearer ${token(600, { views: ['prices'], ingest: ['demo'] })}` };
const fast = { minDelay: 100, maxDelay: 1000 };
const feed = new Feed(['ACME', 'BOLT', 'CRUX']);

test('a token that expires mid-stream is renewed at reauth: no loss, no duplicate, no reset', async () => {
  await ingest(base, 'demo', feed.batch(3), writer);
  let calls = 0;
  const view = openView(base, 'prices', { token: () => { calls += 1; return token(2); }, ...fast });
  const record = recordChanges(view);
  await view.synced();
  const until8s = Date.now() + 8000;
  while (Date.now() < until8s) {
    await ingest(base, 'demo', feed.batch(2), writer);
    await sleep(200);
  }
  await checkMatchesServer(base, view, 'prices', { headers: writer });
  check(calls >= 3, `the token callback was called at each reauth (${calls})`);
  check(record.resets.length === 0, 'no reset');
  checkAppliedOnce(record);
  const seqs = record.live.map(c => c.value.seq);
  check(seqs.every((s, i) => i === 0 || s === seqs[i - 1] + 1), () => `every tick once, in order: ${seqs}`);
  log(`reauth: ${calls} tokens, ${seqs.length} ticks in order`);
  await view.close();
});

test('a refused token: the callback is asked again; without a callback the view closes with the reason', async () => {
  const tokens = [token(60, { views: ['other'] }), token(60, { views: ['prices'] }, 'x')];
  let calls = 0;
  const view = openView(base, 'prices', { token: () => tokens[calls++] ?? token(60), ...fast });
  const record = recordChanges(view);
  await view.synced();
  check(record.errors[0]?.code === 'forbidden' && record.errors[0].status === 403, () => `403 first: ${record.errors.map(e => e.code)}`);
  await ingest(base, 'demo', feed.batch(3), writer);
  await checkMatchesServer(base, view, 'prices', { headers: writer });
  await view.close();

  const refused = openView(base, 'prices', { token: token(-60), ...fast });
  const errors = recordChanges(refused).errors;
  await refused.synced().then(() => check(false, 'an expired static token must not open'), () => {});
  check(refused.status === 'closed', refused.status);
  check(errors.at(-1)?.code === 'unauthorized' && errors.at(-1).fatal, () => `a fatal 401: ${errors.map(e => e.code)}`);
  await refused.close();
});

test('a producer whose token lacks the grant asks the callback again, and fails plainly without one', async () => {
  const tokens = [token(60, { views: ['prices'] })];
  let calls = 0;
  const producer = openProducer(base, 'demo', { id: 'auth-a', token: () => tokens[calls++] ?? token(60, { ingest: ['demo'] }) });
  const receipt = await producer.send(feed.batch(1));
  check(receipt.seq === 0 && calls === 2, `renewed once: ${calls}`);
  const plain = openProducer(base, 'demo', { id: 'auth-b', token: token(60, { views: ['prices'] }) });
  await plain.send(feed.batch(1)).then(() => check(false, 'must be refused'), e => check(e.code === 'unauthorized' && e.status === 403, String(e)));
});

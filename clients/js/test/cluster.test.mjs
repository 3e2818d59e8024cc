// @viewtape/client across the nodes of a cluster: `node clients/js/test/cluster.test.mjs <node A>
// <node B>`, run by tests/tests/clients.rs with two nodes on one real nats-server (JetStream).
// A view follows `prices` through a proxy, as behind a load balancer; the proxy switches from
// node A to node B and drops the connection; the view resumes on B from its cursor: no reset,
// every offset once and in order, and the map equals node B's `GET /views/prices`. The producer
// goes on on node B with the seq it kept, and B takes it in order.
import { test, after } from 'node:test';

import { openProducer, memoryStore, openView } from '@viewtape/client';

import { check, done, Feed, log, until } from '../../common.mjs';
import { checkAppliedOnce, checkMatchesServer, FaultProxy, recordChanges } from './support.mjs';

const [nodeA, nodeB] = process.argv.slice(2);
check(nodeA && nodeB, 'usage: cluster.test.mjs <node A> <node B>');
after(() => done());

test('a switch from one node to another resumes from the cursor', async () => {
  const feed = new Feed(['ACME', 'BOLT', 'CRUX', 'DYNE']);
  const store = memoryStore();
  const onA = openProducer(nodeA, 'demo', { id: 'cluster-js', store });
  for (let i = 0; i < 4; i++) await onA.send(feed.batch(3));
  const proxy = await new FaultProxy(new URL(nodeA).host).listen();
  const view = openView(proxy.url, 'prices', { minDelay: 100, maxDelay: 1000 });
  const record = recordChanges(view);
  await view.synced();
  for (let i = 0; i < 4; i++) await onA.send(feed.batch(3));
  await checkMatchesServer(nodeA, view, 'prices');

  proxy.retarget(new URL(nodeB).host);
  proxy.dropAll();
  await until(() => proxy.requests.length >= 2, 30000, 'the reconnection to node B');
  const onB = openProducer(nodeB, 'demo', { id: 'cluster-js', store });
  const receipts = [];
  for (let i = 0; i < 4; i++) receipts.push(await onB.send(feed.batch(3)));
  await checkMatchesServer(nodeB, view, 'prices');
  await checkMatchesServer(nodeA, view, 'prices');
  check(record.resets.length === 0, () => `no reset on the switch: ${JSON.stringify(record.resets)}`);
  checkAppliedOnce(record);
  const offsets = record.live.map(c => Number(c.cursor.split('-')[1]));
  check(offsets.every((o, i) => i === 0 || o === offsets[i - 1] + 1), () => `every offset once, in order: ${offsets}`);
  check(offsets.length === 24, `8 batches of 3 after the state: ${offsets.length}`);
  check(receipts.map(r => r.seq).join() === '8,9,10,11' && receipts.every(r => !r.duplicate), () => `node B took seq 8..11: ${JSON.stringify(receipts)}`);
  check(proxy.requests[1].line.includes('cursor='), `resumed with its cursor: ${proxy.requests[1].line}`);
  log(`switched nodes: offsets ${offsets[0]}..${offsets.at(-1)} once each, no reset`);
  await view.close();
  await proxy.close();
});

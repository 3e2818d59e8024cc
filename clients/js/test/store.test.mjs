// The stores and listeners of `@viewtape/client`, with no viewtape server. Run by `npm test` (after `npm run
// build`).
import { test } from 'node:test';
import assert from 'node:assert/strict';

import { localStorageStore, openView } from '@viewtape/client';

/**
 * Under Node, `localStorageStore()` used to fail later, inside the view, with a raw `TypeError`
 * about reading `getItem` of undefined: it now refuses at once and names the store to use.
 */
test('localStorageStore() where there is no localStorage names fileStore', () => {
  assert.equal(typeof globalThis.localStorage, 'undefined');
  assert.throws(
    () => localStorageStore(),
    error => error instanceof Error && !(error instanceof TypeError) && /fileStore\(dir\) from '@viewtape\/client\/node'/.test(error.message),
  );
});

test('localStorageStore() keeps its values in localStorage, under its prefix', () => {
  const items = new Map();
  globalThis.localStorage = {
    getItem: key => items.get(key) ?? null,
    setItem: (key, value) => void items.set(key, value),
  };
  try {
    const store = localStorageStore('test:');
    assert.equal(store.load('a'), undefined);
    store.save('a', { cursor: 'c', entries: [] });
    assert.deepEqual(store.load('a'), { cursor: 'c', entries: [] });
    assert.deepEqual([...items.keys()], ['test:a']);
  } finally {
    delete globalThis.localStorage;
  }
});

/**
 * An exception thrown by an `error` listener was swallowed: it is reported on the console (as
 * a browser reports a throwing event listener), where it cannot loop back into the listener.
 */
test('an error listener that throws is reported on the console, not swallowed', async () => {
  const fetch = async () =>
    new Response('{"error":"not_found","message":"no view named nope"}', { status: 404, headers: { 'content-type': 'application/json' } });
  const reported = [];
  const original = console.error;
  console.error = (...args) => void reported.push(args);
  const boom = new Error('boom');
  const view = openView('http://viewtape.test', 'nope', { fetch, minDelay: 10, maxDelay: 20 });
  try {
    view.on('error', () => {
      throw boom;
    });
    for (let i = 0; i < 100 && !reported.some(args => args.includes(boom)); i++) {
      await new Promise(resolve => setTimeout(resolve, 10));
    }
    assert.ok(reported.some(args => args.includes(boom)), `reported: ${JSON.stringify(reported.map(String))}`);
  } finally {
    view.close();
    console.error = original;
  }
});

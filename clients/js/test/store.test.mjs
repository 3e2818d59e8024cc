// The stores of `@viewtape/client`, with no viewtape server. Run by `npm test` (after `npm run
// build`).
import { test } from 'node:test';
import assert from 'node:assert/strict';

import { localStorageStore } from '@viewtape/client';

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

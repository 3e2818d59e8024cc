/**
 * Node-only helpers: a store in a directory of JSON files, one per key, each written to a
 * temporary file, flushed and renamed over the old one, so a crash leaves the old or the new
 * value and never half of one.
 */
import { mkdir, open, readFile, rename } from 'node:fs/promises';
import { join } from 'node:path';

import type { Store } from './store.js';

/** A store in `dir` (created if missing); usable as a `cursorStore` and as a producer `store`. */
export function fileStore<T>(dir: string): Store<T> {
  const path = (key: string) => join(dir, `${encodeURIComponent(key)}.json`);
  let made: Promise<unknown> | undefined;
  return {
    async load(key) {
      try {
        return JSON.parse(await readFile(path(key), 'utf8')) as T;
      } catch (error) {
        if ((error as NodeJS.ErrnoException).code === 'ENOENT') return undefined;
        throw error;
      }
    },
    async save(key, value) {
      await (made ??= mkdir(dir, { recursive: true }));
      const target = path(key);
      const temporary = `${target}.${process.pid}.tmp`;
      const file = await open(temporary, 'w');
      try {
        await file.writeFile(JSON.stringify(value));
        await file.sync();
      } finally {
        await file.close();
      }
      await rename(temporary, target);
    },
  };
}

export * from './index.js';

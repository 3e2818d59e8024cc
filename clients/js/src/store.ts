/**
 * Stores keep what must survive a reload or a restart: a view's cursor with the state it
 * reflects, a producer's next sequence number and the batch in flight. A store holds JSON values
 * by key; saving a key replaces it whole.
 */
export interface Store<T> {
  load(key: string): Promise<T | undefined> | T | undefined;
  save(key: string, value: T): Promise<void> | void;
}

/** A view's position: the state as it was at `cursor`. */
export interface SavedView {
  readonly cursor: string;
  readonly entries: ReadonlyArray<readonly [string, unknown]>;
}

/** A producer's position: the next seq of `epoch`, and the batch sent but not yet acknowledged. */
export interface SavedProducer {
  readonly epoch: number;
  readonly nextSeq: number;
  readonly pending?: { readonly seq: number; readonly body: string; readonly base64?: boolean } | undefined;
}

export type CursorStore = Store<SavedView>;
export type ProducerStore = Store<SavedProducer>;

/** A store in memory: survives reconnects, not a restart. */
export function memoryStore<T>(): Store<T> {
  const values = new Map<string, string>();
  return {
    load: key => {
      const text = values.get(key);
      return text === undefined ? undefined : (JSON.parse(text) as T);
    },
    save: (key, value) => {
      values.set(key, JSON.stringify(value));
    },
  };
}

/**
 * A store in the browser's `localStorage`, keys prefixed by `prefix` (a few MB at most).
 *
 * @throws Error where there is no `localStorage` (Node): `fileStore` of `@viewtape/client/node`
 * is the store there.
 */
export function localStorageStore<T>(prefix = 'viewtape:'): Store<T> {
  if (typeof globalThis.localStorage === 'undefined') {
    throw new Error(
      "localStorageStore(): there is no localStorage here (Node has none); use fileStore(dir) from '@viewtape/client/node', or memoryStore()",
    );
  }
  return {
    load: key => {
      const text = globalThis.localStorage.getItem(prefix + key);
      return text === null ? undefined : (JSON.parse(text) as T);
    },
    save: (key, value) => {
      globalThis.localStorage.setItem(prefix + key, JSON.stringify(value));
    },
  };
}

/** A store in the browser's IndexedDB (database `name`, one object store), for large states. */
export function indexedDbStore<T>(name = 'viewtape'): Store<T> {
  const STORE = 'kv';
  let db: Promise<IDBDatabase> | undefined;
  const open = (): Promise<IDBDatabase> =>
    (db ??= new Promise((resolve, reject) => {
      const request = globalThis.indexedDB.open(name, 1);
      request.onupgradeneeded = () => request.result.createObjectStore(STORE);
      request.onsuccess = () => resolve(request.result);
      request.onerror = () => reject(request.error ?? new Error(`cannot open IndexedDB ${name}`));
    }));
  const run = async <R>(mode: IDBTransactionMode, f: (s: IDBObjectStore) => IDBRequest<R>): Promise<R> => {
    const tx = (await open()).transaction(STORE, mode);
    const request = f(tx.objectStore(STORE));
    return new Promise((resolve, reject) => {
      tx.oncomplete = () => resolve(request.result);
      tx.onerror = () => reject(tx.error ?? new Error('IndexedDB transaction failed'));
      tx.onabort = () => reject(tx.error ?? new Error('IndexedDB transaction aborted'));
    });
  };
  return {
    load: async key => ((await run('readonly', s => s.get(key))) as T | undefined) ?? undefined,
    save: async (key, value) => {
      await run('readwrite', s => s.put(value, key));
    },
  };
}

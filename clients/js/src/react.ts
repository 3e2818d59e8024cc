/**
 * `useView(name, options)`: a view's state in a React component. Components that use the same
 * view (same base URL, name, keys and prefix) share one connection, opened with the first and
 * closed shortly after the last unmounts.
 */
import { useMemo, useSyncExternalStore } from 'react';

import type { ViewError } from './errors.js';
import { openView, type Status, type View, type ViewOptions } from './view.js';

export interface UseViewOptions extends Omit<ViewOptions, 'signal'> {
  /** The server's base URL (default: this page's origin). */
  baseUrl?: string;
}

/** What {@link useView} returns; `T` is the view's value type. */
export interface ViewSnapshot<T = unknown> {
  readonly state: ReadonlyMap<string, T>;
  readonly status: Status;
  readonly cursor: string | undefined;
  readonly error: ViewError | undefined;
}

/** How long a shared view stays open after its last user unmounts (survives a re-mount). */
const LINGER_MS = 1_000;

interface Shared {
  readonly view: View;
  users: number;
  linger: ReturnType<typeof setTimeout> | undefined;
  snapshot: ViewSnapshot;
  stale: boolean;
  readonly subscribers: Set<() => void>;
  readonly unsubscribe: () => void;
}

const shared = new Map<string, Shared>();

function acquire(key: string, name: string, options: UseViewOptions): Shared {
  let entry = shared.get(key);
  if (!entry) {
    const { baseUrl, ...rest } = options;
    const view = openView(baseUrl ?? '', name, rest);
    const subscribers = new Set<() => void>();
    const notify = () => {
      current.stale = true;
      for (const subscriber of [...subscribers]) subscriber();
    };
    const offs = [view.on('change', notify), view.on('status', notify), view.on('error', notify), view.on('synced', notify)];
    const current: Shared = {
      view,
      users: 0,
      linger: undefined,
      snapshot: snapshotOf(view),
      stale: false,
      subscribers,
      unsubscribe: () => offs.forEach(off => off()),
    };
    entry = current;
    shared.set(key, entry);
  }
  if (entry.linger !== undefined) clearTimeout(entry.linger);
  entry.linger = undefined;
  entry.users += 1;
  return entry;
}

function release(key: string, entry: Shared): void {
  entry.users -= 1;
  if (entry.users > 0) return;
  entry.linger = setTimeout(() => {
    if (entry.users > 0) return;
    shared.delete(key);
    entry.unsubscribe();
    void entry.view.close();
  }, LINGER_MS);
}

function snapshotOf(view: View): ViewSnapshot {
  return { state: new Map(view.state), status: view.status, cursor: view.cursor, error: view.error };
}

const CLOSED: ViewSnapshot = { state: new Map(), status: 'connecting', cursor: undefined, error: undefined };

/**
 * The live state of view `name`: `{ state, status, cursor, error }`, re-rendered on every change.
 * `state` is a fresh `ReadonlyMap` per render that saw a change (copied at most once per render).
 * Options are read when the shared connection opens; a change of `baseUrl`, `name`, `keys` or
 * `prefix` opens another. `T` is the type of one value, as for `openView<T>` (asserted, not
 * checked; `npx viewtape-types` writes it from the view's schema).
 */
export function useView<T = unknown>(name: string, options: UseViewOptions = {}): ViewSnapshot<T> {
  const key = JSON.stringify([options.baseUrl ?? '', name, options.keys ?? null, options.prefix ?? null]);
  const store = useMemo(() => {
    let entry: Shared | undefined;
    return {
      subscribe(onChange: () => void) {
        entry = acquire(key, name, options);
        entry.subscribers.add(onChange);
        const mine = entry;
        return () => {
          mine.subscribers.delete(onChange);
          release(key, mine);
        };
      },
      getSnapshot(): ViewSnapshot {
        const current = entry ?? shared.get(key);
        if (!current) return CLOSED;
        if (current.stale) {
          current.stale = false;
          current.snapshot = snapshotOf(current.view);
        }
        return current.snapshot;
      },
    };
    // `options` is deliberately read once per connection key.
    // eslint-disable-next-line react-hooks/exhaustive-deps
  }, [key]);
  const snapshot = useSyncExternalStore(store.subscribe, store.getSnapshot, () => CLOSED);
  // One connection per key whatever `T` each component asserts: the values are the same JSON.
  return snapshot as ViewSnapshot<T>;
}

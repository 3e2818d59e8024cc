/**
 * A view as a live keyed map.
 *
 * ## Consistency
 * `state` is always a state the server had at `cursor`: `state` events are staged aside and
 * swapped in at `synced`; a `reset` restages (the old map and cursor stay until its `synced`);
 * an `update`/`delete` at or before the cursor is never applied twice, and the cursor moves
 * before any listener hears of the change, so a listener that throws or closes the view cannot
 * cause a second application.
 *
 * ## Reconnection
 * Every connection resumes from the cursor (`?cursor=`). Delays between failed attempts are
 * full-jitter exponential (`minDelay`..`maxDelay`), at least a `Retry-After`, and after a
 * stream that sent `retry:`, at least its last hint (for that one reconnection); a token that
 * expires (`reauth`) is renewed and the stream reopened at once. A connection counts as healthy
 * once it has applied a live event or stayed up for a while; until then failures add up, and a
 * run of connections that end at once (a proxy, a reset loop) raises `fast_retry_loop` and backs
 * off harder.
 *
 * ## Closing
 * A view closes at `close()`, at its `signal`, or when the server says it never will serve it:
 * `event: retired` (the view was retired: its runtime deleted, or no longer declaring it), a
 * `404` (no such view), a `400`-like refusal, a `401`/`403` with no way to get another token.
 * Then `status` is `'closed'`, the `error` listeners hear the fatal {@link ViewError} (`retired`,
 * `not_found`, …), `synced()` rejects with it, and nothing reconnects. The map and cursor stay as
 * they were, the last state the view had.
 *
 * One file past 500 lines: the stream's events, the reconnection and the staged map are one
 * state machine, and each of its transitions reads the others.
 */
import { createParser, type EventSourceMessage } from 'eventsource-parser';

import { Backoff, retryAfterMs, Sleep } from './backoff.js';
import { atOrBefore, parseCursor, type ParsedCursor } from './cursor.js';
import { ViewError } from './errors.js';
import type { CursorStore, SavedView } from './store.js';

export type Status = 'connecting' | 'syncing' | 'live' | 'reconnecting' | 'paused' | 'closed';

/** A token, or a function that gets a fresh one (called again on 401/403 and at `reauth`). */
export type TokenSource = string | (() => string | Promise<string>);

export interface ViewOptions {
  /** Sent as `Authorization: Bearer …` (or the `viewtape_token` cookie, see `tokenTransport`). */
  token?: TokenSource;
  /** `'header'` (default) or `'cookie'` (browsers: sets `viewtape_token` for the page's origin). */
  tokenTransport?: 'header' | 'cookie';
  /** `fetch` credentials; `'include'` for a cookie sent to another origin. Default `'same-origin'`. */
  credentials?: RequestCredentials;
  /** Where cursor and state are kept, so a reload or restart resumes instead of refetching. */
  cursorStore?: CursorStore;
  /** The key under which `cursorStore` keeps this view (default: the view's name). */
  storeKey?: string;
  /** Only these keys (`?keys=`, at most 100): the state and the events of the others are never
   * sent. The cursor stays the view's: it moves with these keys' events only. Not with `prefix`. */
  keys?: readonly string[];
  /** Only the keys that start with this (`?prefix=`). Not with `keys`. */
  prefix?: string;
  /** Read your writes (`?after=`): a log position a change was answered with (`"position"` of
   * `PUT /admin/runtimes/…`, a deploy, a batch); a node of a cluster serves the view only once it
   * has applied that position. */
  after?: number;
  /** Aborting closes the view. */
  signal?: AbortSignal;
  /** A `fetch` to use instead of the global one. */
  fetch?: typeof globalThis.fetch;
  /** Backoff bounds in ms (default 500 and 30,000). */
  minDelay?: number;
  maxDelay?: number;
  /** A hidden page releases its connection after this many ms (default 30,000); `false`: never. */
  releaseWhenHiddenAfter?: number | false;
  /** Headers but no byte for this long: `stream_buffered` (default 10,000 ms). */
  firstByteTimeout?: number;
  /** No byte, not even a heartbeat, for this long: `stalled`, reconnect (default 45,000 ms). */
  stallTimeout?: number;
  /** The cursor store is written at most this often (default 1,000 ms), and at close. */
  saveInterval?: number;
}

/** One key's change: its new value, or `deleted` (`value` undefined). `T` is the view's value
 * type (see {@link openView}); testing `deleted` narrows `value` to `T`. */
export type Change<T = unknown> = ChangeInfo &
  ({ readonly deleted: false; readonly value: T } | { readonly deleted: true; readonly value: undefined });

/** What every {@link Change} carries besides its value. */
export interface ChangeInfo {
  readonly key: string;
  /** The cursor of the event that made it (for a swap at `synced`: that cursor). */
  readonly cursor: string;
  /** Whether it came from a state transfer (a swap at `synced`) or the stored state. */
  readonly fromState: boolean;
}

/** The JSON of a `reset` event: why the cursor could not be honoured and the current window. */
export interface ResetInfo {
  readonly reason: string;
  readonly epoch?: string;
  readonly first?: number;
  readonly next?: number;
  readonly [more: string]: unknown;
}

export interface ViewEvents<T = unknown> {
  change: Change<T>;
  /** A stream opened (`200`), with the URL it was asked for (the cursor it resumes from). */
  connected: { readonly url: string };
  /** The token expired and the server ended the stream; a fresh one is asked for at once. */
  reauth: { readonly cursor: string | undefined };
  synced: { readonly cursor: string };
  reset: ResetInfo;
  status: Status;
  error: ViewError;
}

type Listener<T> = (value: T) => void;

/** What ended one connection, and how to go on. */
type Outcome =
  | { readonly kind: 'reauth' }
  | { readonly kind: 'failed'; readonly floor: number }
  | { readonly kind: 'closed' };

const SAFE_STATUSES = new Set([502, 503, 504, 429, 408]);
/** A 4xx that asking again cannot change (not 401/403, which a new token may change, not
 * 408/429, which time changes; 404 has its own error): the view closes. */
const FATAL_STATUS = (status: number): boolean => status >= 400 && status < 500 && ![401, 403, 404, 408, 429].includes(status);
const FAST_LOOP_RUN = 5;
const HEALTHY_AFTER_MS = 10_000;

/** A live, consistent copy of one view, its values typed `T`. Create with {@link openView}. */
export class View<T = unknown> {
  #state = new Map<string, T>();
  #staging: Map<string, T> | null = null;
  #cursor: string | undefined;
  #parsed: ParsedCursor | undefined;
  #status: Status = 'connecting';
  #error: ViewError | undefined;
  #listeners = new Map<keyof ViewEvents<T>, Set<Listener<never>>>();
  #token: string | undefined;
  /** The last `retry:` of the current (or just ended) stream, in ms; used once, then cleared. */
  #retryHint = 0;
  #resetPending = false;
  #closed = false;
  #connection: AbortController | undefined;
  #sleep = new Sleep();
  #backoff: Backoff;
  #unhealthyRun = 0;
  #dirty = false;
  #saveTimer: ReturnType<typeof setTimeout> | undefined;
  #saving: Promise<void> = Promise.resolve();
  #hiddenTimer: ReturnType<typeof setTimeout> | undefined;
  #paused = false;
  #cleanups: Array<() => void> = [];
  #syncedWaiters: Array<{ resolve: () => void; reject: (e: unknown) => void }> = [];
  #applied = 0;
  #skipped = 0;
  #resets = 0;
  #done: Promise<void>;

  constructor(
    readonly baseUrl: string,
    readonly name: string,
    private readonly options: ViewOptions = {},
  ) {
    this.#backoff = new Backoff(options.minDelay ?? 500, options.maxDelay ?? 30_000);
    const signal = options.signal;
    if (signal) {
      if (signal.aborted) this.#closed = true;
      const onAbort = () => void this.close();
      signal.addEventListener('abort', onAbort, { once: true });
      this.#cleanups.push(() => signal.removeEventListener('abort', onAbort));
    }
    this.#watchVisibility();
    this.#watchPageHide();
    this.#done = this.#run();
  }

  /** The view's state, values JSON-decoded: a state the server had at `cursor`. */
  get state(): ReadonlyMap<string, T> {
    return this.#state;
  }

  /** The cursor of the last event applied (undefined before the first). */
  get cursor(): string | undefined {
    return this.#cursor;
  }

  get status(): Status {
    return this.#status;
  }

  /** The last error, cleared once the view is live again. */
  get error(): ViewError | undefined {
    return this.#error;
  }

  /** Counters: events applied, duplicates skipped (at or before the cursor), resets received. */
  get stats(): { readonly applied: number; readonly skipped: number; readonly resets: number } {
    return { applied: this.#applied, skipped: this.#skipped, resets: this.#resets };
  }

  /** Listens; returns the function that stops listening. */
  on<E extends keyof ViewEvents<T>>(event: E, listener: Listener<ViewEvents<T>[E]>): () => void {
    let set = this.#listeners.get(event);
    if (!set) this.#listeners.set(event, (set = new Set()));
    const entry = listener as Listener<never>;
    set.add(entry);
    return () => void this.#listeners.get(event)?.delete(entry);
  }

  /** Resolves once the state is complete and the view live; rejects if it closes first. */
  synced(): Promise<void> {
    if (this.#status === 'live') return Promise.resolve();
    if (this.#closed) return Promise.reject(this.#error ?? new ViewError('network', 'the view is closed'));
    return new Promise((resolve, reject) => this.#syncedWaiters.push({ resolve, reject }));
  }

  /** Frees every listener, timer and connection; resolves once the store has the last position. */
  async close(): Promise<void> {
    if (!this.#closed) {
      this.#closed = true;
      this.#connection?.abort();
      this.#sleep.wake();
    }
    await this.#done;
  }

  // ---- connection loop -------------------------------------------------------------------

  async #run(): Promise<void> {
    try {
      await this.#loadStored();
      while (!this.#closed) {
        if (this.#paused) {
          this.#setStatus('paused');
          await this.#sleep.wait(2 ** 31 - 1);
          continue;
        }
        const started = Date.now();
        const appliedBefore = this.#liveApplied;
        const outcome = await this.#connect();
        if (outcome.kind === 'closed' || this.#closed) break;
        if (outcome.kind === 'reauth') continue;
        if (this.#paused) continue;
        const healthy = this.#liveApplied > appliedBefore || Date.now() - started >= HEALTHY_AFTER_MS;
        if (healthy) {
          this.#backoff.reset();
          this.#unhealthyRun = 0;
        } else if (++this.#unhealthyRun === FAST_LOOP_RUN) {
          this.#fail(new ViewError('fast_retry_loop', `${FAST_LOOP_RUN} connections in a row ended without progress; backing off harder`));
        }
        this.#setStatus('reconnecting');
        // A stream's `retry:` is a floor for the reconnection right after it, once: attempts
        // that fail before any stream (refused, unreachable) back off from `minDelay` again.
        const hint = this.#retryHint;
        this.#retryHint = 0;
        const delay = this.#backoff.next(Math.max(outcome.floor, hint), this.#unhealthyRun >= FAST_LOOP_RUN);
        await this.#sleep.wait(delay);
      }
    } finally {
      this.#shutDown();
      await this.#flushSave();
    }
  }

  /** Live events applied (after `synced`), the progress that makes a connection healthy. */
  #liveApplied = 0;

  async #connect(): Promise<Outcome> {
    const token = await this.#currentToken();
    if (token instanceof ViewError) return { kind: 'failed', floor: 0 };
    if (this.#closed) return { kind: 'closed' };

    const controller = new AbortController();
    this.#connection = controller;
    this.#retryHint = 0; // a hint belongs to the stream that sent it
    const resumeFrom = this.#resetPending ? undefined : this.#cursor;
    const headers: Record<string, string> = { Accept: 'text/event-stream' };
    if (token !== undefined) {
      if (this.options.tokenTransport === 'cookie') setCookie(token);
      else headers['Authorization'] = `Bearer ${token}`;
    }
    const url = this.#url(resumeFrom);
    let response: Response;
    try {
      response = await (this.options.fetch ?? globalThis.fetch)(url, {
        headers,
        signal: controller.signal,
        cache: 'no-store',
        credentials: this.options.credentials ?? 'same-origin',
      });
    } catch (cause) {
      if (this.#closed) return { kind: 'closed' };
      if (this.#paused) return { kind: 'failed', floor: 0 };
      this.#fail(new ViewError('network', `cannot reach ${this.baseUrl}: ${describe(cause)}`, { cause }));
      return { kind: 'failed', floor: 0 };
    }

    if (response.status !== 200) return this.#refused(response);
    const type = response.headers.get('content-type') ?? '';
    if (!type.toLowerCase().startsWith('text/event-stream')) {
      await response.body?.cancel().catch(() => {});
      this.#fail(
        new ViewError(
          'bad_content_type',
          `the stream answered with Content-Type ${JSON.stringify(type)}, not text/event-stream: a proxy or cache is answering in the server's place`,
          { status: 200 },
        ),
      );
      return { kind: 'failed', floor: 0 };
    }
    if (!response.body) {
      this.#fail(new ViewError('stream_buffered', 'the response has no readable body'));
      return { kind: 'failed', floor: 0 };
    }
    this.#emit('connected', { url });
    if (resumeFrom === undefined) {
      this.#staging = new Map();
      this.#setStatus('syncing');
    } else {
      this.#goLive();
    }
    return this.#read(response.body, controller);
  }

  async #read(body: ReadableStream<Uint8Array>, controller: AbortController): Promise<Outcome> {
    const reader = body.getReader();
    // A `fetch` of the application's may not tie the body to the signal: cancel it too.
    const cancel = () => void reader.cancel().catch(() => {});
    controller.signal.addEventListener('abort', cancel, { once: true });
    const decoder = new TextDecoder();
    let reauth = false;
    let stop: ViewError | undefined;
    const parser = createParser({
      onEvent: message => {
        if (stop || reauth) return;
        const verdict = this.#handle(message);
        if (verdict === 'reauth') reauth = true;
        else if (verdict) stop = verdict;
      },
      onRetry: ms => {
        this.#retryHint = ms;
      },
    });
    const firstByte = this.options.firstByteTimeout ?? 10_000;
    const stall = this.options.stallTimeout ?? 45_000;
    let watchdog: ReturnType<typeof setTimeout> | undefined;
    let timedOut: ViewError | undefined;
    let ended = false;
    const arm = (ms: number, error: () => ViewError) => {
      if (watchdog !== undefined) clearTimeout(watchdog);
      watchdog = setTimeout(() => {
        timedOut = error();
        controller.abort();
      }, ms);
    };
    arm(firstByte, () => new ViewError('stream_buffered', `the stream sent headers but no byte within ${firstByte} ms: a proxy is buffering the response`));
    try {
      for (;;) {
        const { done, value } = await reader.read();
        if (done) {
          ended = true;
          break;
        }
        arm(stall, () => new ViewError('stalled', `no byte for ${stall} ms, not even a heartbeat`));
        parser.feed(decoder.decode(value, { stream: true }));
        if (stop || reauth) break;
      }
    } catch (cause) {
      if (this.#closed) return { kind: 'closed' };
      if (!timedOut && !this.#paused) {
        this.#fail(new ViewError('network', `the stream was cut: ${describe(cause)}`, { cause }));
      }
    } finally {
      if (watchdog !== undefined) clearTimeout(watchdog);
      if (this.#connection === controller) this.#connection = undefined;
      ended &&= !controller.signal.aborted;
      controller.signal.removeEventListener('abort', cancel);
      controller.abort();
      cancel();
    }
    if (this.#closed) return { kind: 'closed' };
    if (timedOut) this.#fail(timedOut);
    if (stop) this.#fail(stop);
    if (stop?.fatal) {
      // `retired`: the server will not serve this view again, so reconnecting cannot help.
      this.#closed = true;
      return { kind: 'closed' };
    }
    if (reauth) {
      this.#setStatus('reconnecting');
      this.#emit('reauth', { cursor: this.#cursor });
      return (await this.#renewToken()) ? { kind: 'reauth' } : { kind: 'failed', floor: 0 };
    }
    if (ended) this.#fail(new ViewError('network', 'the server ended the stream'));
    return { kind: 'failed', floor: 0 };
  }

  /** A non-200 answer: renew the token, give up on a request the server will never take, or
   * say why and back off. */
  async #refused(response: Response): Promise<Outcome> {
    const status = response.status;
    const said = await serverMessage(response, this.options.firstByteTimeout ?? 10_000);
    if (FATAL_STATUS(status)) {
      // The same request gets the same answer: retrying cannot help, so the view closes.
      const error = new ViewError('bad_request', `the server refused the stream (${status})${said}; not retrying`, {
        status,
        fatal: true,
      });
      this.#fail(error);
      this.#closed = true;
      return { kind: 'closed' };
    }
    if (status === 401 || status === 403) {
      const code = status === 401 ? 'unauthorized' : 'forbidden';
      if (typeof this.options.token !== 'function') {
        const error = new ViewError(code, `the server refused the stream (${status}) and there is no token callback to get another token`, { status, fatal: true });
        this.#fail(error);
        this.#closed = true;
        return { kind: 'closed' };
      }
      this.#fail(new ViewError(code, `the server refused the stream (${status}); asking the token callback again`, { status }));
      await this.#renewToken();
      return { kind: 'failed', floor: 0 };
    }
    if (status === 404) {
      // No such view: never declared, or retired (§ Closing). Views come and go at run time,
      // so a 404 is an answer, not an outage: waiting for the name to come back would leave
      // the application showing "reconnecting" for a view that is gone.
      this.#fail(new ViewError('not_found', `the server has no view ${JSON.stringify(this.name)} (404)${said}; not retrying`, { status, fatal: true }));
      this.#closed = true;
      return { kind: 'closed' };
    }
    const floor = retryAfterMs(response.headers.get('retry-after'));
    const transient = SAFE_STATUSES.has(status) ? ' (transient)' : '';
    this.#fail(new ViewError('http_status', `the stream answered ${status}${transient}${said}`, { status }));
    return { kind: 'failed', floor };
  }

  #url(cursor: string | undefined): string {
    const params = new URLSearchParams();
    if (cursor !== undefined) params.set('cursor', cursor);
    if (this.options.keys !== undefined) params.set('keys', this.options.keys.join(','));
    if (this.options.prefix !== undefined) params.set('prefix', this.options.prefix);
    if (this.options.after !== undefined) params.set('after', String(this.options.after));
    const query = params.toString();
    const base = this.baseUrl.replace(/\/+$/, '');
    return `${base}/views/${encodeURIComponent(this.name)}/events${query ? `?${query}` : ''}`;
  }

  // ---- the protocol ------------------------------------------------------------------------

  /** Applies one event; returns an error that ends the connection (a fatal one, the view), or
   * `'reauth'`. */
  #handle(message: EventSourceMessage): ViewError | 'reauth' | undefined {
    switch (message.event) {
      case 'update':
      case 'delete': {
        const id = parseCursor(message.id);
        if (!id) return missingId(message);
        if (this.#staging !== null) return new ViewError('bad_event', `an ${message.event} arrived during a state transfer`);
        if (atOrBefore(id, this.#parsed)) {
          this.#skipped += 1;
          return undefined;
        }
        if (this.#parsed && id.epoch !== this.#parsed.epoch) {
          return new ViewError('bad_event', `an ${message.event} of epoch ${id.epoch} without a reset (cursor ${this.#cursor})`);
        }
        const data = decode(message);
        if (data instanceof ViewError) return data;
        const cursor = message.id!;
        const change: Change<T> =
          message.event === 'delete'
            ? { key: data.key, value: undefined, deleted: true, cursor, fromState: false }
            : { key: data.key, value: data.value as T, deleted: false, cursor, fromState: false };
        if (change.deleted) this.#state.delete(change.key);
        else this.#state.set(change.key, change.value);
        this.#moveCursor(cursor, id);
        this.#applied += 1;
        this.#liveApplied += 1;
        this.#emit('change', change);
        return undefined;
      }
      case 'state': {
        const data = decode(message);
        if (data instanceof ViewError) return data;
        (this.#staging ??= new Map()).set(data.key, data.value as T);
        return undefined;
      }
      case 'synced': {
        const id = parseCursor(message.id);
        if (!id) return missingId(message);
        this.#swap(message.id!, id, this.#staging ?? new Map());
        return undefined;
      }
      case 'reset': {
        let info: ResetInfo;
        try {
          info = JSON.parse(message.data) as ResetInfo;
        } catch {
          return new ViewError('bad_event', `a reset whose data is not JSON: ${message.data.slice(0, 80)}`);
        }
        this.#resets += 1;
        this.#resetPending = true;
        this.#staging = new Map();
        this.#setStatus('syncing');
        this.#emit('reset', info);
        return undefined;
      }
      case 'reauth':
        return 'reauth';
      case 'retired':
        return retired(this.name, message);
      case undefined:
      case 'message':
        return new ViewError('bad_event', 'an event without an `event:` type: something between rewrote the stream');
      default:
        return undefined; // a kind this client does not know yet
    }
  }

  /** Swaps the staged state in at `synced` and emits what changed. */
  #swap(cursor: string, parsed: ParsedCursor, next: Map<string, T>): void {
    const previous = this.#state;
    this.#state = next;
    this.#staging = null;
    this.#resetPending = false;
    this.#moveCursor(cursor, parsed);
    for (const [key] of previous) {
      if (!next.has(key)) this.#emit('change', { key, value: undefined, deleted: true, cursor, fromState: true });
    }
    for (const [key, value] of next) {
      if (!previous.has(key) || !sameJson(previous.get(key), value)) {
        this.#emit('change', { key, value, deleted: false, cursor, fromState: true });
      }
    }
    this.#goLive();
    this.#emit('synced', { cursor });
    this.#scheduleSave(0);
  }

  #moveCursor(cursor: string, parsed: ParsedCursor): void {
    this.#cursor = cursor;
    this.#parsed = parsed;
    this.#scheduleSave(this.options.saveInterval ?? 1_000);
  }

  #goLive(): void {
    this.#error = undefined;
    this.#setStatus('live');
    for (const waiter of this.#syncedWaiters.splice(0)) waiter.resolve();
  }

  // ---- tokens ------------------------------------------------------------------------------

  async #currentToken(): Promise<string | undefined | ViewError> {
    const source = this.options.token;
    if (source === undefined) return undefined;
    if (typeof source === 'string') return source;
    if (this.#token === undefined && !(await this.#renewToken())) {
      return this.#error ?? new ViewError('token', 'no token');
    }
    return this.#token;
  }

  async #renewToken(): Promise<boolean> {
    const source = this.options.token;
    if (typeof source !== 'function') return true;
    try {
      this.#token = await source();
      return true;
    } catch (cause) {
      this.#token = undefined;
      this.#fail(new ViewError('token', `the token callback failed: ${describe(cause)}`, { cause }));
      return false;
    }
  }

  // ---- the store ---------------------------------------------------------------------------

  async #loadStored(): Promise<void> {
    const store = this.options.cursorStore;
    if (!store) return;
    let saved: SavedView | undefined;
    try {
      saved = await store.load(this.#storeKey);
    } catch (cause) {
      this.#fail(new ViewError('store', `cannot read the cursor store: ${describe(cause)}`, { cause }));
      return;
    }
    const parsed = parseCursor(saved?.cursor);
    if (!saved || !parsed || this.#closed) return;
    this.#state = new Map(saved.entries as ReadonlyArray<readonly [string, T]>);
    this.#cursor = saved.cursor;
    this.#parsed = parsed;
    for (const [key, value] of this.#state) {
      this.#emit('change', { key, value, deleted: false, cursor: saved.cursor, fromState: true });
    }
  }

  get #storeKey(): string {
    return this.options.storeKey ?? this.name;
  }

  #scheduleSave(ms: number): void {
    if (!this.options.cursorStore || this.#cursor === undefined) return;
    this.#dirty = true;
    if (this.#saveTimer !== undefined && ms > 0) return;
    if (this.#saveTimer !== undefined) clearTimeout(this.#saveTimer);
    this.#saveTimer = setTimeout(() => {
      this.#saveTimer = undefined;
      void this.#save();
    }, ms);
  }

  #save(): Promise<void> {
    const store = this.options.cursorStore;
    if (!store || !this.#dirty || this.#cursor === undefined) return this.#saving;
    this.#dirty = false;
    const saved: SavedView = { cursor: this.#cursor, entries: [...this.#state] };
    this.#saving = this.#saving
      .then(() => store.save(this.#storeKey, saved))
      .catch(cause => this.#fail(new ViewError('store', `cannot write the cursor store: ${describe(cause)}`, { cause })));
    return this.#saving;
  }

  async #flushSave(): Promise<void> {
    if (this.#saveTimer !== undefined) clearTimeout(this.#saveTimer);
    this.#saveTimer = undefined;
    await this.#save();
  }

  // ---- page lifecycle ----------------------------------------------------------------------

  #watchVisibility(): void {
    const after = this.options.releaseWhenHiddenAfter ?? 30_000;
    const doc = (globalThis as { document?: Document }).document;
    if (after === false || !doc || typeof doc.addEventListener !== 'function') return;
    const onChange = () => {
      if (doc.visibilityState === 'hidden') {
        if (this.#hiddenTimer === undefined && !this.#paused) {
          this.#hiddenTimer = setTimeout(() => {
            this.#hiddenTimer = undefined;
            this.#paused = true;
            this.#setStatus('paused');
            this.#connection?.abort();
            this.#sleep.wake();
          }, after);
        }
        return;
      }
      if (this.#hiddenTimer !== undefined) clearTimeout(this.#hiddenTimer);
      this.#hiddenTimer = undefined;
      if (this.#paused) {
        this.#paused = false;
        this.#backoff.reset();
        this.#unhealthyRun = 0;
        this.#sleep.wake();
      }
    };
    doc.addEventListener('visibilitychange', onChange);
    this.#cleanups.push(() => doc.removeEventListener('visibilitychange', onChange));
    if (doc.visibilityState === 'hidden') onChange();
  }

  #watchPageHide(): void {
    const win = globalThis as { addEventListener?: typeof addEventListener; removeEventListener?: typeof removeEventListener; document?: unknown };
    if (!win.document || typeof win.addEventListener !== 'function' || !this.options.cursorStore) return;
    const onHide = () => void this.#flushSave();
    win.addEventListener('pagehide', onHide);
    this.#cleanups.push(() => win.removeEventListener?.('pagehide', onHide));
  }

  // ---- events ------------------------------------------------------------------------------

  #setStatus(status: Status): void {
    if (this.#status === status || this.#status === 'closed') return;
    this.#status = status;
    this.#emit('status', status);
  }

  #fail(error: ViewError): void {
    this.#error = error;
    this.#emit('error', error);
  }

  #emit<E extends keyof ViewEvents<T>>(event: E, value: ViewEvents<T>[E]): void {
    const set = this.#listeners.get(event);
    if (!set) return;
    for (const listener of [...set]) {
      try {
        (listener as Listener<ViewEvents<T>[E]>)(value);
      } catch (cause) {
        if (event !== 'error') this.#fail(new ViewError('listener', `a ${event} listener threw: ${describe(cause)}`, { cause }));
        // Reported as another error it would come back to the same listener: the console is
        // where it cannot loop, and is not missed (as a browser reports a throwing listener).
        else console.error(`viewtape: view ${this.name}: an error listener threw while handling`, value, cause);
      }
    }
  }

  #shutDown(): void {
    this.#closed = true;
    this.#connection?.abort();
    if (this.#hiddenTimer !== undefined) clearTimeout(this.#hiddenTimer);
    this.#hiddenTimer = undefined;
    for (const cleanup of this.#cleanups.splice(0)) cleanup();
    this.#setStatus('closed');
    const error = this.#error ?? new ViewError('network', 'the view was closed');
    for (const waiter of this.#syncedWaiters.splice(0)) waiter.reject(error);
    this.#listeners.clear();
  }
}

/**
 * Opens a view: connects at once, resuming from `cursorStore` if it has a position.
 *
 * `T` is the type of one value (default `unknown`): `openView<Tick>(…).state` is a
 * `ReadonlyMap<string, Tick>`. It is what the application asserts, not checked at run time;
 * `npx viewtape-types URL VIEW` writes it from the view's JSON Schema (`@viewtape/client/types`).
 */
export function openView<T = unknown>(baseUrl: string, view: string, options: ViewOptions = {}): View<T> {
  return new View<T>(baseUrl, view, options);
}

function decode(message: EventSourceMessage): { key: string; value: unknown } | ViewError {
  try {
    const data = JSON.parse(message.data) as { key?: unknown; value?: unknown };
    if (typeof data.key !== 'string') throw new Error('no key');
    return { key: data.key, value: data.value };
  } catch {
    return new ViewError('bad_event', `a ${message.event} whose data is not {"key": …}: ${message.data.slice(0, 80)}`);
  }
}

/** `: <message>` from the server's JSON error body (`{"error", "message"}`), or the body's
 * first bytes; reads at most 4 KiB for at most `ms`, then cancels the body. */
async function serverMessage(response: Response, ms: number): Promise<string> {
  const body = response.body;
  if (!body) return '';
  const reader = body.getReader();
  const chunks: Uint8Array[] = [];
  let size = 0;
  let timer: ReturnType<typeof setTimeout> | undefined;
  const timeout = new Promise<undefined>(resolve => (timer = setTimeout(() => resolve(undefined), ms)));
  try {
    while (size < 4096) {
      const read = await Promise.race([reader.read(), timeout]);
      if (!read || read.done) break;
      chunks.push(read.value);
      size += read.value.byteLength;
    }
  } catch {
    // cut or aborted: say what came
  } finally {
    clearTimeout(timer);
    void reader.cancel().catch(() => {});
  }
  const bytes = new Uint8Array(size);
  let at = 0;
  for (const chunk of chunks) {
    bytes.set(chunk, at);
    at += chunk.byteLength;
  }
  const text = new TextDecoder().decode(bytes);
  let message: unknown = text;
  try {
    message = (JSON.parse(text) as { message?: unknown }).message ?? text;
  } catch {
    // not JSON: a proxy's page
  }
  const said = String(message).trim().slice(0, 300);
  return said ? `: ${said}` : '';
}

/** The fatal error of an `event: retired`, whose data is `{"view", "reason"}` (a reason that
 * does not parse still retires the view: the event itself is the server's word). */
function retired(name: string, message: EventSourceMessage): ViewError {
  let reason: string | undefined;
  try {
    const data = JSON.parse(message.data) as { reason?: unknown };
    if (typeof data.reason === 'string') reason = data.reason;
  } catch {
    // not JSON: retired all the same
  }
  const why = reason === undefined ? '' : `: ${reason}`;
  return new ViewError('retired', `the server retired the view ${JSON.stringify(name)}${why}; not reconnecting`, { fatal: true, reason });
}

function missingId(message: EventSourceMessage): ViewError {
  return new ViewError(
    'missing_id',
    `a ${message.event} event without a cursor id (${JSON.stringify(message.id ?? null)}): something between strips or rewrites SSE ids`,
  );
}

function sameJson(a: unknown, b: unknown): boolean {
  return a === b || JSON.stringify(a) === JSON.stringify(b);
}

function describe(error: unknown): string {
  return error instanceof Error ? error.message : String(error);
}

function setCookie(token: string): void {
  const doc = (globalThis as { document?: Document }).document;
  if (!doc) return;
  const secure = globalThis.location?.protocol === 'https:' ? '; Secure' : '';
  doc.cookie = `viewtape_token=${token}; path=/; SameSite=Strict${secure}`;
}

/**
 * A runtime as an idempotent producer.
 *
 * ## Exactly once
 * Every batch goes out as `Producer-Id`/`-Epoch`/`-Seq`. Before a batch is sent, the store gets
 * it as `pending` with its seq (write-ahead); after the `200` the store gets the next seq. So a
 * retry after a timeout, a `503`, a server restart or a restart of this process sends the same
 * bytes under the same seq, and the server runs it once (`Producer-Duplicate: true` is a
 * success: the receipt is the original one).
 *
 * ## Out of order
 * A `409` with `Producer-Expected-Seq` lower than ours means the server holds fewer of our
 * batches than we sent (it lost its data, or our store was restored from an old copy): nothing
 * at or after the expected seq was committed, so by default the pending batch is renumbered to
 * it and sent again (`onGap` is told). `renumber: false` throws instead.
 */
import { Backoff, retryAfterMs, Sleep } from './backoff.js';
import { ProducerError } from './errors.js';
import { memoryStore, type ProducerStore, type SavedProducer } from './store.js';
import type { TokenSource } from './view.js';

export interface ProducerOptions {
  /** The producer id (`Producer-Id`): one per logical source of batches. */
  id: string;
  /** `Producer-Epoch` (default 0, or the stored one); a higher one fences older producers. */
  epoch?: number;
  /** `Authorization: Bearer …`; a function is called again after a 401/403. */
  token?: TokenSource;
  /** Keeps the next seq and the batch in flight; without one a restart starts again at seq 0. */
  store?: ProducerStore;
  /** One request's time limit in ms (default 30,000); a timeout is retried. */
  timeout?: number;
  /** Backoff bounds in ms (default 250 and 30,000). */
  minDelay?: number;
  maxDelay?: number;
  /** Renumber the pending batch on a 409 whose expected seq is lower (default true). */
  renumber?: boolean;
  /** Told when the server expected a lower seq than ours (it lost batches it had acknowledged). */
  onGap?: (gap: { readonly sent: number; readonly expected: number }) => void;
  /** Told of every failed attempt that will be retried. */
  onRetry?: (retry: { readonly seq: number; readonly attempt: number; readonly delay: number; readonly reason: string }) => void;
  /** A `fetch` to use instead of the global one. */
  fetch?: typeof globalThis.fetch;
}

/** The server's receipt for one batch, with the seq it went under. */
export interface Receipt {
  readonly seq: number;
  readonly epoch: number;
  /** The server had committed this batch already (a retry): this is the original receipt. */
  readonly duplicate: boolean;
  readonly events: Readonly<Record<string, number>>;
  readonly gaps: readonly unknown[];
  readonly position?: number;
  readonly durability?: string;
  readonly [more: string]: unknown;
}

export type Batch = string | readonly string[] | Uint8Array;

const RETRY_STATUSES = new Set([408, 425, 429, 500, 502, 503, 504]);

/** An idempotent producer for one runtime. Create with {@link openProducer}. */
export class Producer {
  #saved: SavedProducer | undefined;
  #queue: Promise<unknown> = Promise.resolve();
  #store: ProducerStore;
  #storeKey: string;
  #token: string | undefined;
  #closed = false;
  #sleep = new Sleep();
  #inFlight: AbortController | undefined;

  constructor(
    readonly baseUrl: string,
    readonly runtime: string,
    private readonly options: ProducerOptions,
  ) {
    if (!options.id) throw new TypeError('a producer needs an id');
    this.#store = options.store ?? memoryStore<SavedProducer>();
    this.#storeKey = `${runtime}/${options.id}`;
  }

  /** The seq the next batch goes under (after `ready()`). */
  get nextSeq(): number | undefined {
    return this.#saved?.nextSeq;
  }

  get epoch(): number | undefined {
    return this.#saved?.epoch;
  }

  /**
   * Loads the store and sends the batch a previous life left pending, if any; resolves with its
   * receipt (or undefined). `send` does this by itself first.
   */
  ready(): Promise<Receipt | undefined> {
    return this.#enqueue(async () => {
      await this.#load();
      const pending = this.#saved?.pending;
      return pending ? this.#deliver(pending.seq, decodeBody(pending)) : undefined;
    });
  }

  /**
   * Sends one batch (lines are joined with `\n`); resolves with the receipt once it is durable.
   * Batches go out one at a time, in the order of the calls. An empty batch is refused here
   * (`rejected`), as the server refuses it, without taking a seq.
   *
   * @throws ProducerError `fenced`, `unauthorized`, `rejected`, `out_of_order`, `closed`.
   */
  send(batch: Batch): Promise<Receipt> {
    const body = toBody(batch);
    if (body.length === 0) {
      return Promise.reject(new ProducerError('rejected', 'an empty batch: the server takes none; nothing was sent'));
    }
    return this.#enqueue(async () => {
      await this.#load();
      const pending = this.#saved?.pending;
      if (pending) await this.#deliver(pending.seq, decodeBody(pending));
      const saved = this.#saved!;
      const seq = saved.nextSeq;
      await this.#write({ ...saved, pending: encodeBody(seq, body) });
      return this.#deliver(seq, body);
    });
  }

  /** Stops retrying: a batch in flight fails with `closed` (it may still have been committed). */
  close(): void {
    this.#closed = true;
    this.#inFlight?.abort();
    this.#sleep.wake();
  }

  #enqueue<T>(task: () => Promise<T>): Promise<T> {
    const run = this.#queue.then(task, task);
    this.#queue = run.catch(() => {});
    return run;
  }

  async #load(): Promise<void> {
    if (this.#saved) return;
    let stored: SavedProducer | undefined;
    try {
      stored = await this.#store.load(this.#storeKey);
    } catch (cause) {
      throw new ProducerError('store', `cannot read the producer store: ${String(cause)}`, { cause });
    }
    const epoch = this.options.epoch ?? stored?.epoch ?? 0;
    if (stored && stored.epoch === epoch) this.#saved = stored;
    else if (stored && stored.epoch > epoch) {
      throw new ProducerError('fenced', `the store holds epoch ${stored.epoch}, newer than ${epoch}`);
    } else this.#saved = { epoch, nextSeq: 0 };
  }

  async #write(saved: SavedProducer): Promise<void> {
    try {
      await this.#store.save(this.#storeKey, saved);
    } catch (cause) {
      throw new ProducerError('store', `cannot write the producer store: ${String(cause)}`, { cause });
    }
    this.#saved = saved;
  }

  /** Sends `body` as `seq` until the server commits it (or refuses it for good). */
  async #deliver(initialSeq: number, body: string | Uint8Array): Promise<Receipt> {
    let seq = initialSeq;
    const backoff = new Backoff(this.options.minDelay ?? 250, this.options.maxDelay ?? 30_000);
    let renewed = false;
    for (;;) {
      if (this.#closed) throw new ProducerError('closed', `the producer was closed before batch ${seq} was acknowledged`);
      const epoch = this.#saved!.epoch;
      const attempt = await this.#post(seq, epoch, body);
      if (attempt.kind === 'ok') {
        await this.#write({ epoch, nextSeq: seq + 1 });
        return attempt.receipt;
      }
      if (attempt.kind === 'renew' && !renewed && typeof this.options.token === 'function') {
        renewed = true;
        this.#token = undefined;
        continue;
      }
      if (attempt.kind === 'renew') throw attempt.error;
      if (attempt.kind === 'gap') {
        const expected = attempt.expected;
        if (expected >= seq || this.options.renumber === false) {
          throw new ProducerError('out_of_order', `the server expects seq ${expected}, this batch is ${seq}`, { status: 409, expectedSeq: expected });
        }
        this.options.onGap?.({ sent: seq, expected });
        seq = expected;
        await this.#write({ epoch, nextSeq: seq, pending: encodeBody(seq, body) });
        continue;
      }
      if (attempt.kind === 'fatal') throw attempt.error;
      renewed = false;
      const delay = backoff.next(attempt.floor);
      this.options.onRetry?.({ seq, attempt: backoff.attempts, delay, reason: attempt.reason });
      await this.#sleep.wait(delay);
    }
  }

  async #post(seq: number, epoch: number, body: string | Uint8Array): Promise<Attempt> {
    const headers: Record<string, string> = {
      'Content-Type': 'application/x-ndjson',
      'Producer-Id': this.options.id,
      'Producer-Epoch': String(epoch),
      'Producer-Seq': String(seq),
    };
    try {
      const token = await this.#currentToken();
      if (token !== undefined) headers['Authorization'] = `Bearer ${token}`;
    } catch (cause) {
      return { kind: 'retry', floor: 0, reason: `the token callback failed: ${String(cause)}` };
    }
    const controller = new AbortController();
    this.#inFlight = controller;
    const timeout = this.options.timeout ?? 30_000;
    const timer = setTimeout(() => controller.abort(), timeout);
    try {
      const url = `${this.baseUrl.replace(/\/+$/, '')}/runtimes/${encodeURIComponent(this.runtime)}/ingest`;
      const response = await (this.options.fetch ?? globalThis.fetch)(url, {
        method: 'POST',
        headers,
        body: body as BodyInit,
        signal: controller.signal,
      });
      const text = await response.text();
      const json = parseJson(text);
      const status = response.status;
      if (status === 200) {
        const duplicate = response.headers.get('producer-duplicate') === 'true';
        return { kind: 'ok', receipt: { ...(json as object), seq, epoch, duplicate } as Receipt };
      }
      const code = (json as { error?: string } | undefined)?.error;
      if (status === 409) {
        const expected = Number(response.headers.get('producer-expected-seq'));
        if (Number.isSafeInteger(expected)) return { kind: 'gap', expected };
      }
      if (status === 403 && code === 'producer_fenced') {
        return { kind: 'fatal', error: new ProducerError('fenced', `epoch ${epoch} of producer ${this.options.id} is fenced by a newer one`, { status, body: json }) };
      }
      if (status === 401 || status === 403) {
        return { kind: 'renew', error: new ProducerError('unauthorized', `the server refused the token (${status})`, { status, body: json }) };
      }
      if (RETRY_STATUSES.has(status)) {
        return { kind: 'retry', floor: retryAfterMs(response.headers.get('retry-after')), reason: `status ${status}` };
      }
      return { kind: 'fatal', error: new ProducerError('rejected', `the server rejected batch ${seq} (${status}): ${text.slice(0, 200)}`, { status, body: json }) };
    } catch (cause) {
      if (this.#closed) return { kind: 'fatal', error: new ProducerError('closed', `the producer was closed before batch ${seq} was acknowledged`, { cause }) };
      const reason = controller.signal.aborted ? `no answer within ${timeout} ms` : String(cause);
      return { kind: 'retry', floor: 0, reason };
    } finally {
      clearTimeout(timer);
      if (this.#inFlight === controller) this.#inFlight = undefined;
    }
  }

  async #currentToken(): Promise<string | undefined> {
    const source = this.options.token;
    if (source === undefined || typeof source === 'string') return source;
    return (this.#token ??= await source());
  }
}

type Attempt =
  | { readonly kind: 'ok'; readonly receipt: Receipt }
  | { readonly kind: 'retry'; readonly floor: number; readonly reason: string }
  | { readonly kind: 'gap'; readonly expected: number }
  | { readonly kind: 'renew'; readonly error: ProducerError }
  | { readonly kind: 'fatal'; readonly error: ProducerError };

/** Opens an idempotent producer for `runtime` (nothing is sent until `send` or `ready`). */
export function openProducer(baseUrl: string, runtime: string, options: ProducerOptions): Producer {
  return new Producer(baseUrl, runtime, options);
}

function toBody(batch: Batch): string | Uint8Array {
  if (typeof batch === 'string' || batch instanceof Uint8Array) return batch;
  return batch.map(line => `${line}\n`).join('');
}

function encodeBody(seq: number, body: string | Uint8Array): NonNullable<SavedProducer['pending']> {
  if (typeof body === 'string') return { seq, body };
  let binary = '';
  for (const byte of body) binary += String.fromCharCode(byte);
  return { seq, body: btoa(binary), base64: true };
}

function decodeBody(pending: NonNullable<SavedProducer['pending']>): string | Uint8Array {
  if (!pending.base64) return pending.body;
  return Uint8Array.from(atob(pending.body), c => c.charCodeAt(0));
}

function parseJson(text: string): unknown {
  try {
    return JSON.parse(text) as unknown;
  } catch {
    return undefined;
  }
}

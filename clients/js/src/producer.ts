/**
 * A runtime as an idempotent producer.
 *
 * ## Epochs
 * A producer with no stored position (no entry in its store for this runtime and id; the
 * default memory store starts empty) and no `epoch` option first claims a new epoch:
 * `POST /runtimes/{runtime}/producers/{id}`, one more than the highest the server knows for the
 * id, which fences every older holder. So a second run under the same id, with no store, starts
 * a new numbering instead of having its batches taken for the first run's duplicates. The claimed
 * epoch (and next seq 0) is written to the store before the first batch; a producer that finds
 * its position in the store, or is given an `epoch`, goes on under that epoch and claims none.
 *
 * ## Exactly once
 * Every batch goes out as `Producer-Id`/`-Epoch`/`-Seq`. Before a batch is sent, the store gets
 * it as `pending` with its seq (write-ahead); after the `200` the store gets the next seq. So a
 * retry after a timeout, a `503`, a server restart or a restart of this process sends the same
 * bytes under the same seq, and the server runs it once (`Producer-Duplicate: true` is a
 * success: the receipt is the original one).
 *
 * ## Out of order
 * A `409` `producer_out_of_order` with an expected seq lower than ours means the server holds
 * fewer of our batches than we sent (it lost its data, or our store was restored from an old
 * copy): nothing at or after the expected seq was committed, so by default the pending batch is
 * renumbered to it and sent again (`onGap` is told). `renumber: false` throws instead.
 *
 * ## Reused and stale seqs
 * A `409` `producer_seq_reused` says the server committed another body under this epoch and seq:
 * someone else writes under this id and epoch (or a run without a store was given an `epoch`
 * a previous run used). A `409` `producer_seq_stale` says the seq is so old that the server no
 * longer keeps its receipt. Neither is a retry the server can confirm, so neither is renumbered
 * or taken for a success: `send` throws `seq_reused` / `seq_stale` with the server's next seq,
 * and the batch stays pending (it was not published under this epoch).
 */
import { Backoff, retryAfterMs, Sleep } from './backoff.js';
import { ProducerError } from './errors.js';
import { memoryStore, type ProducerStore, type SavedProducer } from './store.js';
import type { TokenSource } from './view.js';

export interface ProducerOptions {
  /** The producer id (`Producer-Id`): one per logical source of batches. */
  id: string;
  /**
   * `Producer-Epoch`; a higher one fences older producers. Without it the stored epoch is used,
   * and with no stored position a new epoch is claimed from the server (see the module docs).
   */
  epoch?: number;
  /** `Authorization: Bearer …`; a function is called again after a 401/403. */
  token?: TokenSource;
  /**
   * Keeps the epoch, the next seq and the batch in flight, so a restart resumes under the same
   * epoch. Without one (a memory store) every run claims a new epoch.
   */
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
  /**
   * Told of every failed attempt that will be retried. An epoch claim's retries come with seq 0
   * (the seq the first batch takes) and a reason that starts with `epoch claim:`.
   */
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

  /** The epoch the batches go under (after `ready()`): the given, stored or claimed one. */
  get epoch(): number | undefined {
    return this.#saved?.epoch;
  }

  /**
   * Loads the store (claiming a new epoch when it holds no position and no `epoch` was given)
   * and sends the batch a previous life left pending, if any; resolves with its receipt (or
   * undefined). `send` does this by itself first.
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
   * @throws ProducerError `fenced`, `unauthorized`, `rejected`, `out_of_order`, `seq_reused`,
   * `seq_stale`, `closed`, `store`.
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
      stored = (await this.#store.load(this.#storeKey)) ?? undefined;
    } catch (cause) {
      throw new ProducerError('store', `cannot read the producer store: ${String(cause)}`, { cause });
    }
    if (stored === undefined && this.options.epoch === undefined) {
      await this.#write({ epoch: await this.#claim(), nextSeq: 0 });
      return;
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

  /** Claims a new epoch for this id (one more than the highest the server knows), until answered. */
  #claim(): Promise<number> {
    const url = `${this.#runtimeUrl()}/producers/${encodeURIComponent(this.options.id)}`;
    return this.#untilDone({ what: () => 'the epoch claim', seq: () => 0, reason: r => `epoch claim: ${r}` }, async (): Promise<Step<number>> => {
      const answer = await this.#request(url, {}, undefined, 'the epoch claim');
      if (answer.kind !== 'answer') return answer;
      if (answer.status !== 200) return refusal(answer, 'the epoch claim');
      const epoch = (answer.json as { epoch?: unknown } | undefined)?.epoch;
      if (typeof epoch === 'number' && Number.isSafeInteger(epoch) && epoch >= 0) return { kind: 'done', value: epoch };
      return {
        kind: 'fatal',
        error: new ProducerError('rejected', `the answer to the epoch claim names no epoch: ${answer.text.slice(0, 200)}`, { status: 200, body: answer.json }),
      };
    });
  }

  /** Sends `body` as `seq` until the server commits it (or refuses it for good). */
  #deliver(initialSeq: number, body: string | Uint8Array): Promise<Receipt> {
    let seq = initialSeq;
    const url = `${this.#runtimeUrl()}/ingest`;
    return this.#untilDone({ what: () => `batch ${seq}`, seq: () => seq, reason: r => r }, async (): Promise<Step<Receipt>> => {
      const epoch = this.#saved!.epoch;
      const headers = {
        'Content-Type': 'application/x-ndjson',
        'Producer-Id': this.options.id,
        'Producer-Epoch': String(epoch),
        'Producer-Seq': String(seq),
      };
      const answer = await this.#request(url, headers, body, `batch ${seq}`);
      if (answer.kind !== 'answer') return answer;
      const { status, json } = answer;
      if (status === 200) {
        const duplicate = answer.headers.get('producer-duplicate') === 'true';
        await this.#write({ epoch, nextSeq: seq + 1 });
        return { kind: 'done', value: { ...(json as object), seq, epoch, duplicate } as Receipt };
      }
      const code = (json as { error?: unknown } | undefined)?.error;
      if (status === 409) {
        const expected = expectedSeq(answer);
        const known = { status, body: json, expectedSeq: expected };
        switch (code) {
          case 'producer_seq_reused':
            return { kind: 'fatal', error: new ProducerError('seq_reused', `seq ${seq} of epoch ${epoch} was already used for another batch; the server's next seq is ${expected}`, known) };
          case 'producer_seq_stale':
            return { kind: 'fatal', error: new ProducerError('seq_stale', `seq ${seq} of epoch ${epoch} is older than the receipts the server keeps; its next seq is ${expected}`, known) };
          case 'producer_out_of_order':
            if (expected === undefined || expected >= seq || this.options.renumber === false) {
              return { kind: 'fatal', error: new ProducerError('out_of_order', `the server expects seq ${expected}, this batch is ${seq}`, known) };
            }
            this.options.onGap?.({ sent: seq, expected });
            seq = expected;
            await this.#write({ epoch, nextSeq: seq, pending: encodeBody(seq, body) });
            return { kind: 'again' };
        }
      }
      if (status === 403 && code === 'producer_fenced') {
        return { kind: 'fatal', error: new ProducerError('fenced', `epoch ${epoch} of producer ${this.options.id} is fenced by a newer one`, { status, body: json }) };
      }
      return refusal(answer, `batch ${seq}`);
    });
  }

  /**
   * Runs `step` until it is done or fails for good: retries with backoff (a `Retry-After` is the
   * floor), asks a token callback once more after a refusal, and stops when the producer closes.
   */
  async #untilDone<T>(
    task: { readonly what: () => string; readonly seq: () => number; readonly reason: (reason: string) => string },
    step: () => Promise<Step<T>>,
  ): Promise<T> {
    const backoff = new Backoff(this.options.minDelay ?? 250, this.options.maxDelay ?? 30_000);
    let renewed = false;
    for (;;) {
      if (this.#closed) throw new ProducerError('closed', `the producer was closed before ${task.what()} was acknowledged`);
      const result = await step();
      switch (result.kind) {
        case 'done':
          return result.value;
        case 'again':
          continue;
        case 'renew':
          if (renewed || typeof this.options.token !== 'function') throw result.error;
          renewed = true;
          this.#token = undefined;
          continue;
        case 'fatal':
          throw result.error;
        case 'retry': {
          renewed = false;
          const delay = backoff.next(result.floor);
          this.options.onRetry?.({ seq: task.seq(), attempt: backoff.attempts, delay, reason: task.reason(result.reason) });
          await this.#sleep.wait(delay);
        }
      }
    }
  }

  /** One POST with the token and the time limit; a failure to get an answer is a retry. */
  async #request(url: string, headers: Record<string, string>, body: string | Uint8Array | undefined, what: string): Promise<Answer> {
    const sent: Record<string, string> = { ...headers };
    try {
      const token = await this.#currentToken();
      if (token !== undefined) sent['Authorization'] = `Bearer ${token}`;
    } catch (cause) {
      return { kind: 'retry', floor: 0, reason: `the token callback failed: ${String(cause)}` };
    }
    const controller = new AbortController();
    this.#inFlight = controller;
    const timeout = this.options.timeout ?? 30_000;
    const timer = setTimeout(() => controller.abort(), timeout);
    try {
      const response = await (this.options.fetch ?? globalThis.fetch)(url, {
        method: 'POST',
        headers: sent,
        body: body as BodyInit | undefined,
        signal: controller.signal,
      });
      const text = await response.text();
      return { kind: 'answer', status: response.status, headers: response.headers, text, json: parseJson(text) };
    } catch (cause) {
      if (this.#closed) return { kind: 'fatal', error: new ProducerError('closed', `the producer was closed before ${what} was acknowledged`, { cause }) };
      const reason = controller.signal.aborted ? `no answer within ${timeout} ms` : String(cause);
      return { kind: 'retry', floor: 0, reason };
    } finally {
      clearTimeout(timer);
      if (this.#inFlight === controller) this.#inFlight = undefined;
    }
  }

  #runtimeUrl(): string {
    return `${this.baseUrl.replace(/\/+$/, '')}/runtimes/${encodeURIComponent(this.runtime)}`;
  }

  async #currentToken(): Promise<string | undefined> {
    const source = this.options.token;
    if (source === undefined || typeof source === 'string') return source;
    return (this.#token ??= await source());
  }
}

/** What one attempt came to: done, sent again at once (renumbered), retried, renewed or failed. */
type Step<T> =
  | { readonly kind: 'done'; readonly value: T }
  | { readonly kind: 'again' }
  | { readonly kind: 'retry'; readonly floor: number; readonly reason: string }
  | { readonly kind: 'renew'; readonly error: ProducerError }
  | { readonly kind: 'fatal'; readonly error: ProducerError };

/** The server's answer to one request, or the retry or failure that took its place. */
type Answer =
  | { readonly kind: 'answer'; readonly status: number; readonly headers: Headers; readonly text: string; readonly json: unknown }
  | Extract<Step<never>, { kind: 'retry' | 'fatal' }>;

/** A refusal that is not particular to the request: a token refused, a retryable status, or a 4xx. */
function refusal(answer: Extract<Answer, { kind: 'answer' }>, what: string): Step<never> {
  const { status, json, text } = answer;
  if (status === 401 || status === 403) {
    return { kind: 'renew', error: new ProducerError('unauthorized', `the server refused the token (${status})`, { status, body: json }) };
  }
  if (RETRY_STATUSES.has(status)) {
    return { kind: 'retry', floor: retryAfterMs(answer.headers.get('retry-after')), reason: `status ${status}` };
  }
  return { kind: 'fatal', error: new ProducerError('rejected', `the server rejected ${what} (${status}): ${text.slice(0, 200)}`, { status, body: json }) };
}

/** The seq a 409 says the server expects next: the body's `next_seq`, else `Producer-Expected-Seq`. */
function expectedSeq(answer: Extract<Answer, { kind: 'answer' }>): number | undefined {
  const fromBody = (answer.json as { next_seq?: unknown } | undefined)?.next_seq;
  if (typeof fromBody === 'number' && Number.isSafeInteger(fromBody) && fromBody >= 0) return fromBody;
  const header = answer.headers.get('producer-expected-seq');
  return header !== null && /^\d+$/.test(header) ? Number(header) : undefined;
}

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

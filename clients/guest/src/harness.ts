// The test harness of @viewtape/guest: runs a built guest (one bundled `.js` file, or a `.wasm`)
// in the engine the server runs it in, by running the `viewtape` binary: each `feed` is one batch
// of `viewtape run GUEST --state … --save-state …`, so what a test sees is what a
// server would publish — the same JS engine, limits, schema checks and all-or-nothing batches.
//
// The state lives between feeds as the host saved it (a file in a temporary directory): a
// rejected batch leaves it as it was, as a server does. Finding the binary: the `viewtape`
// option, then the environment variable VIEWTAPE_BIN, then PATH.

import { spawn } from 'node:child_process';
import { accessSync, constants, statSync } from 'node:fs';
import { mkdtemp, readFile, rename, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { delimiter, join, resolve } from 'node:path';

import type { LogLevel } from './index.js';

/** How to run a guest. */
export interface RunGuestOptions {
  /** The runtime's `config` string, handed to `init` (default: empty). */
  config?: string;
  /** The `viewtape` binary; default: `VIEWTAPE_BIN`, then `viewtape` on PATH. */
  viewtape?: string;
  /**
   * A state to start from instead of `init`'s, as `savedState()` returned it (from this guest or
   * from an earlier build of it: then the guest's `migrate` runs, as at a deploy).
   */
  savedState?: Uint8Array;
  /** CPU per batch, in fuel (`[runtime.limits] fuel`); default: the server's default. */
  fuel?: number;
  /** How long one run of the binary may take before it is killed (default 120 000 ms). */
  timeoutMs?: number;
}

/** How to run one batch. */
export interface FeedOptions {
  /**
   * The batch's ingest time, what `Date.now()` gives the guest during the batch (Unix
   * milliseconds, or a `Date`); default: the clock when it runs, as on a server.
   */
  at?: number | Date;
}

/** A value a batch published. */
export interface Published {
  view: string;
  key: string;
  /** The value as a subscriber gets it: JSON-decoded (bytes that are not JSON: `null`). */
  value: unknown;
}

/** A key a batch deleted. */
export interface Deleted {
  view: string;
  key: string;
}

/** A line the guest logged with `ctx.log`. */
export interface LogLine {
  level: LogLevel;
  message: string;
}

/**
 * What one batch did. With `error` set the batch was rejected: `published`, `deleted` and `gaps`
 * are then empty, and the state is as it was before it.
 */
export interface Batch {
  published: Published[];
  deleted: Deleted[];
  gaps: string[];
  /** The guest's log lines, in order (those of a rejected batch too). */
  logs: LogLine[];
  /** Why the batch was rejected: the guest threw, a value did not fit its view's schema, it ran out of fuel or memory… */
  error?: string;
}

/** A guest under test. Feeds run one at a time, in the order they were called. */
export interface GuestRun<State = unknown> {
  /** The module, as an absolute path. */
  readonly module: string;
  /** The binary that runs it. */
  readonly viewtape: string;
  /**
   * Runs `input` as one batch: the lines of an array (each without its `\n`), or a string of
   * lines. The guest gets the lines as `viewtape run` reads them: each ending in `\n`, a `\r`
   * before it dropped. No lines: nothing runs.
   *
   * Rejects (with a `GuestError`) only when the binary could not run the batch at all; a batch the
   * guest rejects resolves with its `error`.
   */
  feed(input: readonly string[] | string, options?: FeedOptions): Promise<Batch>;
  /** The state after the last good batch (`init`'s before any): the guest's state, JSON-decoded. */
  state(): State;
  /** The state after the last good batch as the host saved it: bytes for `savedState`. */
  savedState(): Uint8Array;
  /** Removes the temporary files. */
  close(): Promise<void>;
}

/** The binary is missing, the module does not load, or a run failed or timed out. */
export class GuestError extends Error {
  override name = 'GuestError';
}

const DEFAULT_TIMEOUT_MS = 120_000;
/** The guest's log lines are the host engine's events with a `guest` field. */
const LOG_TARGET = 'viewtape_server::host::engine';
/** The host's header on a saved state: `\xffVTS`, then a version (u32). */
const STATE_MAGIC = [0xff, 0x56, 0x54, 0x53];
const STATE_HEADER_LEN = 8;

/**
 * The `viewtape` binary to run: `explicit`, else `VIEWTAPE_BIN`, else the first `viewtape` on
 * PATH. `undefined` when none is found (an `explicit` or `VIEWTAPE_BIN` is returned as given,
 * found or not, so that a wrong path fails loudly instead of falling back).
 */
export function findViewtape(explicit?: string): string | undefined {
  if (explicit) return resolve(explicit);
  const fromEnv = process.env.VIEWTAPE_BIN;
  if (fromEnv) return resolve(fromEnv);
  const names = process.platform === 'win32' ? ['viewtape.exe', 'viewtape'] : ['viewtape'];
  for (const dir of (process.env.PATH ?? '').split(delimiter)) {
    if (!dir) continue;
    for (const name of names) {
      const candidate = join(dir, name);
      try {
        if (!statSync(candidate).isFile()) continue;
        accessSync(candidate, constants.X_OK);
        return candidate;
      } catch {
        // Not there, or not executable: the next one.
      }
    }
  }
  return undefined;
}

/**
 * Loads the guest `module` (a built `.js` bundle, or a `.wasm`) and runs its `init` (or restores
 * `options.savedState`), in the `viewtape` binary.
 *
 * ```ts
 * const g = await runGuest<State>('dist/guest.js', { config: '' });
 * const out = await g.feed(['{"key":"a","amount":5}']);
 * assert.deepEqual(out.published, [{ view: 'totals', key: 'a', value: { total: 5 } }]);
 * assert.deepEqual(g.state(), { totals: { a: 5 } });
 * await g.close();
 * ```
 *
 * Rejects with a `GuestError` when no binary is found, or the module does not load (it does not
 * compile, `init` throws, the saved state does not restore), saying why.
 */
export async function runGuest<State = unknown>(
  module: string,
  options: RunGuestOptions = {},
): Promise<GuestRun<State>> {
  const viewtape = findViewtape(options.viewtape);
  if (viewtape === undefined) {
    throw new GuestError(
      'no viewtape binary: pass the `viewtape` option, set VIEWTAPE_BIN, or put `viewtape` on PATH',
    );
  }
  const dir = await mkdtemp(join(tmpdir(), 'viewtape-guest-'));
  try {
    const run = new Run<State>(resolve(module), viewtape, dir, options);
    await run.start();
    return run;
  } catch (error) {
    await rm(dir, { recursive: true, force: true });
    throw error;
  }
}

class Run<State> implements GuestRun<State> {
  private saved: Uint8Array = new Uint8Array();
  private queue: Promise<unknown> = Promise.resolve();
  private closed = false;
  private readonly statePath: string;
  private readonly configPath: string;

  constructor(
    readonly module: string,
    readonly viewtape: string,
    private readonly dir: string,
    private readonly options: RunGuestOptions,
  ) {
    this.statePath = join(dir, 'state');
    this.configPath = join(dir, 'config');
  }

  async start(): Promise<void> {
    await writeFile(this.configPath, this.options.config ?? '');
    // No input: nothing runs, and the state written is init's (or the restored one).
    const hasState = this.options.savedState !== undefined;
    if (hasState) await writeFile(this.statePath, this.options.savedState as Uint8Array);
    await this.invoke('', 1, hasState);
  }

  feed(input: readonly string[] | string, options: FeedOptions = {}): Promise<Batch> {
    const next = this.queue.then(() => this.feedNow(input, options));
    this.queue = next.catch(() => undefined);
    return next;
  }

  private async feedNow(input: readonly string[] | string, options: FeedOptions): Promise<Batch> {
    if (this.closed) throw new GuestError('feed after close()');
    let text = typeof input === 'string' ? input : input.map(line => `${line}\n`).join('');
    if (text && !text.endsWith('\n')) text += '\n';
    const lines = text.split('\n').length - 1;
    if (lines === 0) return { published: [], deleted: [], gaps: [], logs: [] };
    const at = options.at instanceof Date ? options.at.getTime() : options.at;
    if (at !== undefined && !(Number.isSafeInteger(at) && at >= 0)) {
      throw new GuestError(`feed: at must be a time at or after 1970, in whole milliseconds (got ${at})`);
    }
    return this.invoke(text, lines, true, at);
  }

  /** One run of the binary over `input`, as one batch of `lines` lines ingested at `at`. */
  private async invoke(input: string, lines: number, fromState: boolean, at?: number): Promise<Batch> {
    const next = `${this.statePath}.next`;
    const args = ['--log-format', 'json', 'run', this.module, '--batch-lines', String(lines)];
    args.push('--config', this.configPath, '--save-state', next);
    if (fromState) args.push('--state', this.statePath);
    if (this.options.fuel !== undefined) args.push('--fuel', String(this.options.fuel));
    if (at !== undefined) args.push('--batch-time', String(at));
    const { code, stdout, stderr } = await execute(
      this.viewtape,
      args,
      input,
      this.options.timeoutMs ?? DEFAULT_TIMEOUT_MS,
    );
    const batch: Batch = { published: [], deleted: [], gaps: [], logs: [] };
    let finished = false;
    for (const line of stdout.split('\n')) {
      if (!line.trim()) continue;
      const record = parseJson(line) as Record<string, unknown> | undefined;
      if (record === undefined || typeof record !== 'object' || record === null) continue;
      if ('state_bytes' in record) finished = true;
      const update = record.update as Published | undefined;
      const deleted = record.delete as Deleted | undefined;
      if (update) batch.published.push({ view: update.view, key: update.key, value: update.value });
      if (deleted) batch.deleted.push({ view: deleted.view, key: deleted.key });
      if (typeof record.gap === 'string') batch.gaps.push(record.gap);
      if (typeof record.error === 'string') batch.error = record.error;
    }
    const failures: string[] = [];
    for (const line of stderr.split('\n')) {
      const record = parseJson(line) as Record<string, unknown> | undefined;
      if (record && typeof record === 'object' && record.target === LOG_TARGET && typeof record.guest === 'string') {
        batch.logs.push({ level: logLevel(record.level), message: record.guest });
      } else if (line.startsWith('error: ')) {
        failures.push(line.slice('error: '.length));
      }
    }
    // Exit 1 with the final state line: the batch was rejected, and reported on stdout.
    if (!finished || (code !== 0 && batch.error === undefined)) {
      const why = failures.join('; ') || stderr.trim().split('\n').slice(-5).join('\n') || `exit ${code}`;
      throw new GuestError(`${this.module}: ${why}`);
    }
    await rename(next, this.statePath);
    this.saved = new Uint8Array(await readFile(this.statePath));
    if (batch.error !== undefined) {
      // Nothing of a rejected batch counts.
      batch.published = [];
      batch.deleted = [];
      batch.gaps = [];
    }
    return batch;
  }

  state(): State {
    let bytes = this.saved;
    if (STATE_MAGIC.every((b, i) => bytes[i] === b)) bytes = bytes.subarray(STATE_HEADER_LEN);
    const saved = parseJson(new TextDecoder().decode(bytes)) as { state?: unknown } | undefined;
    if (saved === undefined || typeof saved !== 'object' || saved === null || !('state' in saved)) {
      throw new GuestError(`${this.module}: its saved state is not a JavaScript guest's (use savedState() for the bytes)`);
    }
    return saved.state as State;
  }

  savedState(): Uint8Array {
    return this.saved.slice();
  }

  async close(): Promise<void> {
    this.closed = true;
    await this.queue;
    await rm(this.dir, { recursive: true, force: true });
  }
}

function parseJson(text: string): unknown {
  try {
    return JSON.parse(text);
  } catch {
    return undefined;
  }
}

function logLevel(level: unknown): LogLevel {
  switch (level) {
    case 'ERROR':
      return 'error';
    case 'WARN':
      return 'warn';
    case 'INFO':
      return 'info';
    default:
      return 'debug';
  }
}

interface Exit {
  code: number | null;
  stdout: string;
  stderr: string;
}

/** Runs `bin args` with `input` on stdin; resolves when it exits, killing it after `timeoutMs`. */
function execute(bin: string, args: string[], input: string, timeoutMs: number): Promise<Exit> {
  return new Promise((resolvePromise, reject) => {
    const child = spawn(bin, args, {
      stdio: ['pipe', 'pipe', 'pipe'],
      // Only the guest's own log lines (the host engine's), as JSON.
      env: { ...process.env, RUST_LOG: `error,${LOG_TARGET}=trace`, NO_COLOR: '1' },
    });
    const stdout: Buffer[] = [];
    const stderr: Buffer[] = [];
    child.stdout.on('data', (chunk: Buffer) => stdout.push(chunk));
    child.stderr.on('data', (chunk: Buffer) => stderr.push(chunk));
    const timer = setTimeout(() => {
      child.kill('SIGKILL');
      reject(new GuestError(`${bin} ${args.join(' ')}: no answer in ${timeoutMs} ms`));
    }, timeoutMs);
    child.on('error', error => {
      clearTimeout(timer);
      reject(new GuestError(`cannot run ${bin}: ${error.message}`));
    });
    child.on('close', code => {
      clearTimeout(timer);
      resolvePromise({
        code,
        stdout: Buffer.concat(stdout).toString('utf8'),
        stderr: Buffer.concat(stderr).toString('utf8'),
      });
    });
    // A binary that exits before reading its input (a module that does not load) closes the pipe.
    child.stdin.on('error', () => undefined);
    child.stdin.end(input);
  });
}

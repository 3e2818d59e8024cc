// @viewtape/guest: the contract of a viewtape guest written in JavaScript or TypeScript, as
// types. A guest is an ES module, bundled to one file with no imports left, that the
// server runs in its embedded JS engine; these names are what the engine looks for:
//
//   export function init(config: string): State
//   export function onBatch(state: State, input: string, ctx: Ctx): State
//   export const schemas: Schemas                 (optional)
//   export function migrate(old: unknown): State  (optional)
//
// This entry point is types only: `import type { Ctx } from '@viewtape/guest'` leaves nothing in
// the bundle. The test harness, which needs Node, is the subpath `@viewtape/guest/harness`.

/** The level of a guest's log line (`ctx.log`). */
export type LogLevel = 'debug' | 'info' | 'warn' | 'error';

/**
 * What a batch can do besides returning the new state. Everything it does counts only if the
 * batch succeeds: a throw from `onBatch` rejects the whole batch (nothing published, deleted or
 * reported, the state as before it).
 */
export interface Ctx {
  /**
   * Publishes `value` under `key` in `view` (a view the runtime's config declares). A JSON value
   * is published as its JSON; a string or a `Uint8Array` as its bytes. A view with a schema
   * refuses the batch when the value does not fit it.
   */
  publish(view: string, key: string, value: unknown): void;
  /** Deletes `key` from `view`. */
  delete(view: string, key: string): void;
  /** Says that input was lost before it reached the guest (a sequence jump, say): readers see a gap. */
  reportGap(reason: string): void;
  /** A log line, in the server's log with the runtime's name. */
  log(level: LogLevel, message: string): void;
}

/** A JSON Schema (draft 2020-12) of a view's values, as a JSON object. */
export type JsonSchema = { readonly [keyword: string]: unknown } | boolean;

/** The `schemas` export: the JSON Schema of each view's values, by view name. */
export type Schemas = { readonly [view: string]: JsonSchema };

/**
 * `init(config)`: the runtime's initial state, from its `config` string (empty without one). The
 * state is any JSON value; it is saved as JSON after every batch.
 */
export type Init<State> = (config: string) => State;

/**
 * `onBatch(state, input, ctx)`: runs one batch (`input`, the batch's bytes as text: usually
 * NDJSON, one record per line) and returns the new state. It may change `state` in place and return it. Throwing
 * rejects the batch as a whole.
 *
 * Deterministic by construction: `Date.now()` and `new Date()` are the batch's ingest time as the
 * log holds it (the same on every node and at every replay), `Math.random()` is seeded from the
 * runtime's count of batches and that time; there are no timers, no I/O and no other clock.
 */
export type OnBatch<State> = (state: State, input: string, ctx: Ctx) => State;

/**
 * `migrate(old)`: at a deploy of another build, the state the running build saved; returns the
 * state this build works with. Without it the old state is taken as it is.
 */
export type Migrate<State> = (old: unknown) => State;

/**
 * A guest module's exports, to check a module against: `import * as guest from './guest.js';
 * const checked: Guest<State> = guest;`.
 */
export interface Guest<State> {
  init: Init<State>;
  onBatch: OnBatch<State>;
  schemas?: Schemas;
  migrate?: Migrate<State>;
}

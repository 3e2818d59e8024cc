/**
 * `@viewtape/client/types` (Node only): TypeScript types for a view's values, generated from the
 * JSON Schema the server serves at `GET /views/{view}/schema` by
 * [json-schema-to-typescript](https://github.com/bcherny/json-schema-to-typescript). What
 * `npx viewtape-types URL VIEW` prints. A separate entry point: `@viewtape/client` (and the
 * browser bundle) never load the generator.
 *
 * ```ts
 * import { typesFor, viewSchema } from '@viewtape/client/types';
 * const schema = await viewSchema('http://localhost:8080', 'prices', { token });
 * const source = await typesFor(schema, 'Prices'); // "export interface Prices { … }"
 * ```
 */
import { compile } from 'json-schema-to-typescript';

import type { TokenSource } from './view.js';

/** A JSON Schema: an object, or `true`/`false`. */
export type JsonSchema = boolean | { readonly [keyword: string]: unknown };

/** What went wrong, as a stable code. */
export type ViewTypesErrorCode =
  /** 404 `no_schema`: the view exists but is untyped; its values are `unknown`. */
  | 'no_schema'
  /** 404 (`not_found` or any other 404): no such view, or a server without the schema route. */
  | 'not_found'
  /** 401: a token is needed, or the one sent was refused. */
  | 'unauthorized'
  /** 403: the token does not grant this view. */
  | 'forbidden'
  /** The server could not be reached, or did not answer in time. */
  | 'network'
  /** Another HTTP status. */
  | 'http_status'
  /** A 200 that is not JSON (a proxy or a login page answered instead). */
  | 'bad_response'
  /** JSON that the generator cannot turn into types. */
  | 'bad_schema'
  /** The type name is not one the generator keeps as given (use a PascalCase identifier). */
  | 'bad_name';

/** An error of {@link viewSchema}, {@link typesFor} or {@link viewTypes}. */
export class ViewTypesError extends Error {
  override readonly name = 'ViewTypesError';

  constructor(
    readonly code: ViewTypesErrorCode,
    message: string,
    readonly options: { status?: number; serverMessage?: string; cause?: unknown } = {},
  ) {
    super(message, options.cause === undefined ? undefined : { cause: options.cause });
  }

  get status(): number | undefined {
    return this.options.status;
  }

  /** The `message` of the server's JSON error body, if it sent one. */
  get serverMessage(): string | undefined {
    return this.options.serverMessage;
  }
}

export interface SchemaOptions {
  /** Sent as `Authorization: Bearer …`. */
  token?: TokenSource | undefined;
  /** A `fetch` to use instead of the global one. */
  fetch?: typeof globalThis.fetch;
  /** Give up after this many ms (default 30,000). */
  timeout?: number;
  signal?: AbortSignal;
}

export interface TypesForOptions {
  /** A comment put at the top of the module. */
  banner?: string;
  /** The view's name, for the comment on `<name>State`. */
  view?: string;
}

export interface ViewTypesOptions extends SchemaOptions {
  /** The value type's name (default: {@link typeName} of the view). */
  name?: string | undefined;
}

/** The default type name of a view: its name in PascalCase (`prices` → `Prices`,
 * `order.book` → `OrderBook`, `price_ticks` → `PriceTicks`). */
export function typeName(view: string): string {
  const words = view.split(/[^A-Za-z0-9]+/).filter(Boolean);
  // A letter after digits starts a word, as the generator would have it (`top10views` → `Top10Views`).
  const name = words.map(word => word.replace(/^[a-z]|(?<=\d)[a-z]/g, c => c.toUpperCase())).join('');
  return /^[A-Za-z]/.test(name) ? name : `View${name}`;
}

/**
 * `GET {baseUrl}/views/{view}/schema`: the JSON Schema of one value of `view` (what the server
 * checks every value published to it against). Throws a {@link ViewTypesError} whose message
 * names the URL and quotes the server's: `no_schema` for an untyped view, `not_found`,
 * `unauthorized` (401), `forbidden` (403), `network`, …
 */
export async function viewSchema(baseUrl: string, view: string, options: SchemaOptions = {}): Promise<JsonSchema> {
  const url = schemaUrl(baseUrl, view);
  const headers: Record<string, string> = { Accept: 'application/schema+json, application/json' };
  const token = typeof options.token === 'function' ? await options.token() : options.token;
  if (token) headers['Authorization'] = `Bearer ${token}`;
  const timeout = options.timeout ?? 30_000;
  const controller = new AbortController();
  const timer = setTimeout(() => controller.abort(new ViewTypesError('network', `no answer from ${url} within ${timeout} ms`)), timeout);
  const onAbort = () => controller.abort(options.signal?.reason);
  options.signal?.addEventListener('abort', onAbort, { once: true });
  if (options.signal?.aborted) onAbort();
  try {
    let response: Response;
    let text: string;
    try {
      response = await (options.fetch ?? globalThis.fetch)(url, { headers, signal: controller.signal });
      text = await response.text();
    } catch (cause) {
      const reason: unknown = controller.signal.aborted ? controller.signal.reason : cause;
      if (reason instanceof ViewTypesError) throw reason;
      throw new ViewTypesError('network', `cannot reach ${url}: ${describe(reason)}`, { cause: reason });
    }
    if (response.status !== 200) throw refusal(response.status, text, url, view);
    const type = response.headers.get('content-type') ?? '';
    let schema: unknown;
    try {
      if (!/json/i.test(type)) throw new Error(`Content-Type ${JSON.stringify(type)}`);
      schema = JSON.parse(text);
    } catch {
      throw new ViewTypesError(
        'bad_response',
        `${url} answered 200 with Content-Type ${JSON.stringify(type)} and not a JSON Schema (${JSON.stringify(text.slice(0, 80))}…): is a proxy or a login page answering in the server's place?`,
        { status: 200 },
      );
    }
    if (typeof schema !== 'boolean' && (typeof schema !== 'object' || schema === null || Array.isArray(schema))) {
      throw new ViewTypesError('bad_schema', `${url} answered JSON that is not a schema (an object or a boolean): ${oneLine(text).slice(0, 80)}`, { status: 200 });
    }
    return schema as JsonSchema;
  } finally {
    clearTimeout(timer);
    options.signal?.removeEventListener('abort', onAbort);
  }
}

/**
 * A TypeScript module for `schema`, the schema of one value: `export interface <name>` (or
 * `export type <name> = …`), a type for each `$defs` entry it refers to, and
 * `export type <name>State = ReadonlyMap<string, <name>>`, the type of `openView<name>(…).state`.
 *
 * Objects that declare `properties` and say nothing of other properties are closed (no index
 * signature): a value is what the runtime serialized, and a misspelt field then fails to
 * compile. An object with no declared properties stays open (`[k: string]: unknown`).
 */
export async function typesFor(schema: JsonSchema, name: string, options: TypesForOptions = {}): Promise<string> {
  if (!/^[A-Za-z_$][A-Za-z0-9_$]*$/.test(name)) {
    throw new ViewTypesError('bad_name', `${JSON.stringify(name)} is not a TypeScript identifier: give a PascalCase name such as ${typeName(name)}`);
  }
  const banner = options.banner === undefined ? '' : `${comment(options.banner)}\n\n`;
  const state = stateAlias(name, options.view);
  let body: string;
  if (schema === true || schema === false || unconstrained(schema)) {
    const description = typeof schema === 'object' && typeof schema['description'] === 'string' ? `${comment(schema['description'])}\n` : '';
    body = `${description}export type ${name} = ${schema === false ? 'never' : 'unknown'};\n`;
  } else {
    const root = structuredClone(schema) as Record<string, unknown>;
    closeObjects(root);
    root['title'] = name; // the root type's name, whatever the schema's own title
    try {
      body = await compile(root, name, {
        bannerComment: '',
        // $refs are local (`#/$defs/…`): a schema from a server never makes this read files or URLs.
        $refOptions: { resolve: { external: false } },
        strictIndexSignatures: true,
        unknownAny: true,
      });
    } catch (cause) {
      throw new ViewTypesError('bad_schema', `json-schema-to-typescript cannot read the schema: ${describe(cause)}`, { cause });
    }
    if (!new RegExp(`^export (interface|type) ${escape(name)}\\b`, 'm').test(body)) {
      throw new ViewTypesError('bad_name', `the generator did not keep the name ${JSON.stringify(name)}: give a PascalCase name such as ${typeName(name)}`);
    }
    if (new RegExp(`^export (interface|type|(const )?enum) ${escape(name)}State\\b`, 'm').test(body)) {
      throw new ViewTypesError('bad_name', `the schema defines ${name}State itself: choose another name for the view's type`);
    }
  }
  return `${banner}${body.trimEnd()}\n\n${state}`;
}

/**
 * The TypeScript types of view `view`'s values, from the server's schema: the module
 * `npx viewtape-types baseUrl view` prints ({@link typesFor} of {@link viewSchema}).
 * Throws a {@link ViewTypesError}; a view without a schema is `no_schema`.
 */
export async function viewTypes(baseUrl: string, view: string, options: ViewTypesOptions = {}): Promise<string> {
  const name = options.name ?? typeName(view);
  const schema = await viewSchema(baseUrl, view, options);
  const again = `npx viewtape-types ${baseUrl} ${view}${options.name === undefined ? '' : ` --name ${name}`}`;
  const banner = `Generated by viewtape-types from ${schemaUrl(baseUrl, view)}: the type of one value of view ${JSON.stringify(view)}. Do not edit; run \`${again}\` again when the view's type changes.`;
  return typesFor(schema, name, { banner, view });
}

function schemaUrl(baseUrl: string, view: string): string {
  return `${baseUrl.replace(/\/+$/, '')}/views/${encodeURIComponent(view)}/schema`;
}

/** A non-200 answer, with the server's JSON error (`{"error", "message"}`) when it sent one: one
 * line naming the URL and quoting the server. */
function refusal(status: number, text: string, url: string, view: string): ViewTypesError {
  let error: string | undefined;
  let message: string | undefined;
  try {
    const body = JSON.parse(text) as { error?: unknown; message?: unknown };
    if (typeof body.error === 'string') error = oneLine(body.error);
    if (typeof body.message === 'string') message = oneLine(body.message);
  } catch {
    // not JSON: a proxy's page
  }
  const page = oneLine(text).slice(0, 200);
  const said = `GET ${url} answered ${status}${error ? ` ${error}` : ''}${message ? `: ${message}` : !error && page ? `: ${page}` : ''}`;
  const options = { status, ...(message === undefined ? {} : { serverMessage: message }) };
  const quoted = JSON.stringify(view);
  if (status === 404 && error === 'no_schema') {
    return new ViewTypesError('no_schema', `${said} (view ${quoted} is untyped: its values are \`unknown\`, openView's default, unless you declare a type by hand)`, options);
  }
  if (status === 404) {
    const older = error === 'not_found' ? '' : '; a server without GET /views/{view}/schema answers 404 for every view';
    return new ViewTypesError('not_found', `${said} (no view ${quoted} on this server${older})`, options);
  }
  if (status === 401) return new ViewTypesError('unauthorized', `${said} (a token is needed for view ${quoted}, or the one sent was refused)`, options);
  if (status === 403) return new ViewTypesError('forbidden', `${said} (the token does not grant view ${quoted})`, options);
  return new ViewTypesError('http_status', said, options);
}

function oneLine(text: string): string {
  return text.replace(/\s+/g, ' ').trim();
}

/** A schema that constrains nothing (`{}`, or only annotations): any JSON value. */
function unconstrained(schema: { readonly [keyword: string]: unknown }): boolean {
  const annotations = new Set(['$schema', '$id', '$comment', 'title', 'description', 'default', 'examples', 'deprecated', 'readOnly', 'writeOnly', '$defs', 'definitions']);
  return Object.keys(schema).every(keyword => annotations.has(keyword));
}

const SCHEMA_MAPS = ['properties', 'patternProperties', '$defs', 'definitions', 'dependentSchemas'];
const SUBSCHEMAS = ['additionalProperties', 'unevaluatedProperties', 'items', 'additionalItems', 'unevaluatedItems', 'contains', 'propertyNames', 'not', 'if', 'then', 'else'];
const SCHEMA_LISTS = ['allOf', 'anyOf', 'oneOf', 'prefixItems', 'items'];

/** Sets `additionalProperties: false` on every object schema with `properties` that says nothing
 * about other properties (what serde writes for a struct: its fields, no others). */
function closeObjects(node: unknown): void {
  if (!isObject(node)) return;
  if (isObject(node['properties']) && !('additionalProperties' in node) && !('patternProperties' in node) && !('unevaluatedProperties' in node)) {
    node['additionalProperties'] = false;
  }
  for (const keyword of SCHEMA_MAPS) {
    const map = node[keyword];
    if (isObject(map)) Object.values(map).forEach(closeObjects);
  }
  for (const keyword of SUBSCHEMAS) closeObjects(node[keyword]);
  for (const keyword of SCHEMA_LISTS) {
    const list = node[keyword];
    if (Array.isArray(list)) list.forEach(closeObjects);
  }
}

function stateAlias(name: string, view: string | undefined): string {
  const of = view === undefined ? 'the view' : `view ${JSON.stringify(view)}`;
  return (
    `${comment(`The state of ${of}, key → value: what \`openView<${name}>(…).state\` and \`useView<${name}>(…).state\` hold.`)}\n` +
    `export type ${name}State = ReadonlyMap<string, ${name}>;\n`
  );
}

function comment(text: string): string {
  const lines = text.replace(/\*\//g, '*\\/').split('\n');
  return lines.length === 1 ? `/** ${lines[0]} */` : `/**\n${lines.map(line => ` * ${line}`.trimEnd()).join('\n')}\n */`;
}

function isObject(value: unknown): value is Record<string, unknown> {
  return typeof value === 'object' && value !== null && !Array.isArray(value);
}

function escape(text: string): string {
  return text.replace(/[$]/g, '\\$');
}

function describe(error: unknown): string {
  if (!(error instanceof Error)) return String(error);
  // fetch's "fetch failed" says why in its cause (ECONNREFUSED, ENOTFOUND, …).
  const cause = error.cause instanceof Error ? ` (${error.cause.message})` : '';
  return `${error.message}${cause}`;
}

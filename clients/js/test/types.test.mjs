// Typed views, with no viewtape server: `viewtape-types` (the built bin, dist/types-cli.js) and
// `@viewtape/client/types` against a small node:http server that answers
// `GET /views/{view}/schema` as the real one does, the offline `--schema FILE` mode, and `tsc`
// over a file that uses `openView<Generated>`: a field the schema has compiles, a misspelt one
// does not. Run by `npm test` (after `npm run build`).
import { execFile } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { mkdir, mkdtemp, readFile, rm, symlink, writeFile } from 'node:fs/promises';
import { createServer } from 'node:http';
import { createRequire } from 'node:module';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { after, before, describe, test } from 'node:test';
import { fileURLToPath } from 'node:url';
import assert from 'node:assert/strict';

import { openView } from '@viewtape/client';
import { typeName, typesFor, viewSchema, viewTypes, ViewTypesError } from '@viewtape/client/types';

const root = dirname(dirname(fileURLToPath(import.meta.url)));
const cli = join(root, 'dist', 'types-cli.js');
// TypeScript's bin, by its package.json (its `exports` do not list the bin).
const typescript = createRequire(join(root, 'package.json')).resolve('typescript/package.json');
const tsc = join(dirname(typescript), JSON.parse(readFileSync(typescript, 'utf8')).bin.tsc);
const TOKEN = 'reader-token';

/** The schema of one value of `prices`, as a runtime would declare it: `$defs` and `$ref`s. */
const PRICES_SCHEMA = {
  $schema: 'https://json-schema.org/draft/2020-12/schema',
  title: 'Tick',
  description: 'The last trade of a symbol.',
  type: 'object',
  properties: {
    symbol: { type: 'string' },
    price: { type: 'number', description: 'Last trade price.' },
    seq: { type: 'integer' },
    venue: { $ref: '#/$defs/Venue' },
    history: { type: 'array', items: { $ref: '#/$defs/Point' } },
    side: { enum: ['buy', 'sell'] },
    note: { type: ['string', 'null'] },
  },
  required: ['symbol', 'price', 'seq', 'venue'],
  $defs: {
    Venue: {
      type: 'object',
      properties: { mic: { type: 'string' }, open: { type: 'boolean' } },
      required: ['mic', 'open'],
    },
    Point: {
      type: 'object',
      properties: { at: { type: 'integer' }, price: { type: 'number' } },
      required: ['at', 'price'],
    },
  },
};

const json = (res, status, body, type = 'application/json') => {
  res.writeHead(status, { 'content-type': type });
  res.end(JSON.stringify(body));
};

/** `GET /views/{view}/schema` as the server answers it: `prices` is typed and open, `secret` is
 * typed and wants `Bearer reader-token` (401 without a token, 403 with another), `raw` is
 * untyped, every other view does not exist. */
function schemaServer() {
  const requests = [];
  const server = createServer((req, res) => {
    requests.push({ url: req.url, authorization: req.headers.authorization });
    const match = /^\/views\/([^/]+)\/schema$/.exec(req.url);
    const view = match && decodeURIComponent(match[1]);
    if (req.method !== 'GET' || !match) return json(res, 404, { error: 'not_found', message: `no route ${req.url}` });
    if (view === 'prices') return json(res, 200, PRICES_SCHEMA, 'application/schema+json');
    if (view === 'secret') {
      if (!req.headers.authorization) return json(res, 401, { error: 'unauthorized', message: 'a bearer token is required' });
      if (req.headers.authorization !== `Bearer ${TOKEN}`) return json(res, 403, { error: 'forbidden', message: 'the token does not grant view secret' });
      return json(res, 200, { type: 'object', properties: { level: { type: 'integer' } }, required: ['level'] }, 'application/schema+json');
    }
    if (view === 'raw') return json(res, 404, { error: 'no_schema', message: 'view raw has no schema: its values are untyped' });
    return json(res, 404, { error: 'not_found', message: `no view ${view}` });
  });
  return { server, requests };
}

/** Runs the bin; resolves with its exit code and output (never rejects on a non-zero exit). */
function run(args, env = {}) {
  return new Promise(resolve => {
    const environment = { ...process.env, ...env };
    if (!('VIEWTAPE_TOKEN' in env)) delete environment.VIEWTAPE_TOKEN;
    execFile(process.execPath, [cli, ...args], { env: environment, timeout: 60_000 }, (error, stdout, stderr) => {
      resolve({ code: error ? (typeof error.code === 'number' ? error.code : -1) : 0, stdout, stderr });
    });
  });
}

/** The one line of an error on stderr. */
function oneLine(stderr) {
  const lines = stderr.trimEnd().split('\n');
  assert.equal(lines.length, 1, `one line on stderr, got:\n${stderr}`);
  assert.match(lines[0], /^viewtape-types: /);
  return lines[0];
}

let base;
let requests;
let server;
let scratch;

before(async () => {
  ({ server, requests } = schemaServer());
  await new Promise(resolve => server.listen(0, '127.0.0.1', resolve));
  base = `http://127.0.0.1:${server.address().port}`;
  scratch = await mkdtemp(join(tmpdir(), 'viewtape-types-'));
});

after(async () => {
  await new Promise(resolve => server.close(resolve));
  await rm(scratch, { recursive: true, force: true });
});

describe('viewtape-types URL VIEW', () => {
  test('prints the interface of a value, its $defs and the state alias', async () => {
    const { code, stdout, stderr } = await run([base, 'prices']);
    assert.equal(code, 0, stderr);
    assert.equal(stderr, '');
    assert.match(stdout, /^export interface Prices \{$/m);
    assert.match(stdout, /^ {2}symbol: string;$/m);
    assert.match(stdout, /^ {2}venue: Venue;$/m);
    assert.match(stdout, /^ {2}history\?: Point\[\];$/m);
    assert.match(stdout, /^ {2}side\?: "buy" \| "sell";$/m);
    assert.match(stdout, /^ {2}note\?: string \| null;$/m);
    assert.match(stdout, /^export interface Venue \{$/m);
    assert.match(stdout, /^export interface Point \{$/m);
    assert.match(stdout, /^export type PricesState = ReadonlyMap<string, Prices>;$/m);
    assert.match(stdout, /Last trade price\./, 'descriptions become doc comments');
    assert.ok(stdout.startsWith(`/** Generated by viewtape-types from ${base}/views/prices/schema`), stdout.slice(0, 200));
    // Objects with declared properties are closed: no index signature that would let a
    // misspelt field through.
    assert.doesNotMatch(stdout, /\[k: string\]/);
  });

  test('--name and --out write the module to a file', async () => {
    const out = join(scratch, 'tick.ts');
    const { code, stdout, stderr } = await run([base, 'prices', '--name', 'Tick', '--out', out]);
    assert.equal(code, 0, stderr);
    assert.equal(stdout, '');
    assert.match(stderr, /wrote Tick and TickState to /);
    const source = await readFile(out, 'utf8');
    assert.match(source, /^export interface Tick \{$/m);
    assert.match(source, /^export type TickState = ReadonlyMap<string, Tick>;$/m);
    assert.match(source, /--name Tick/, 'the banner says how to run it again');
  });

  test('--token (or VIEWTAPE_TOKEN) is sent as a bearer token', async () => {
    const before = requests.length;
    const flag = await run([base, 'secret', '--token', TOKEN]);
    assert.equal(flag.code, 0, flag.stderr);
    assert.match(flag.stdout, /^export interface Secret \{\n {2}level: number;\n\}$/m);
    const env = await run([base, 'secret'], { VIEWTAPE_TOKEN: TOKEN });
    assert.equal(env.code, 0, env.stderr);
    assert.deepEqual(
      requests.slice(before).map(r => r.authorization),
      [`Bearer ${TOKEN}`, `Bearer ${TOKEN}`],
    );
  });

  test('401 without a token: exit 1, one line naming the URL and the server message', async () => {
    const { code, stdout, stderr } = await run([base, 'secret']);
    assert.equal(code, 1);
    assert.equal(stdout, '');
    const line = oneLine(stderr);
    assert.ok(line.includes(`${base}/views/secret/schema`), line);
    assert.ok(line.includes('401 unauthorized: a bearer token is required'), line);
    assert.ok(line.includes('--token T, or set VIEWTAPE_TOKEN'), line);
  });

  test('403 with a token that does not grant the view', async () => {
    const { code, stderr } = await run([base, 'secret', '--token', 'another']);
    assert.equal(code, 1);
    const line = oneLine(stderr);
    assert.ok(line.includes(`${base}/views/secret/schema answered 403 forbidden: the token does not grant view secret`), line);
  });

  test('404 no_schema: the view is untyped', async () => {
    const { code, stdout, stderr } = await run([base, 'raw']);
    assert.equal(code, 1);
    assert.equal(stdout, '');
    const line = oneLine(stderr);
    assert.ok(line.includes(`GET ${base}/views/raw/schema answered 404 no_schema: view raw has no schema: its values are untyped`), line);
    assert.match(line, /untyped/);
  });

  test('404 not_found: no such view', async () => {
    const { code, stderr } = await run([base, 'nosuch']);
    assert.equal(code, 1);
    const line = oneLine(stderr);
    assert.ok(line.includes(`GET ${base}/views/nosuch/schema answered 404 not_found: no view nosuch`), line);
    assert.ok(line.includes('no view "nosuch" on this server'), line);
  });

  test('a server that cannot be reached: exit 1, the URL and why', async () => {
    const closed = createServer();
    await new Promise(resolve => closed.listen(0, '127.0.0.1', resolve));
    const port = closed.address().port;
    await new Promise(resolve => closed.close(resolve));
    const { code, stdout, stderr } = await run([`http://127.0.0.1:${port}`, 'prices']);
    assert.equal(code, 1);
    assert.equal(stdout, '');
    const line = oneLine(stderr);
    assert.ok(line.includes(`cannot reach http://127.0.0.1:${port}/views/prices/schema`), line);
    assert.match(line, /ECONNREFUSED/);
  });

  test('a bad command line: exit 2 and the usage', async () => {
    const none = await run([]);
    assert.equal(none.code, 2);
    assert.match(none.stderr, /usage: viewtape-types URL VIEW/);
    const notUrl = await run(['localhost:8080', 'prices']);
    assert.equal(notUrl.code, 2);
    assert.match(notUrl.stderr, /URL must start with http/);
    const help = await run(['--help']);
    assert.equal(help.code, 0);
    assert.match(help.stdout, /--schema FILE/);
  });
});

describe('viewtape-types --schema FILE (offline)', () => {
  test('types a schema file with $defs, no server asked', async () => {
    const file = join(scratch, 'prices.schema.json');
    await writeFile(file, JSON.stringify(PRICES_SCHEMA, null, 2));
    const before = requests.length;
    const named = await run(['--schema', file, '--name', 'Quote']);
    assert.equal(named.code, 0, named.stderr);
    assert.match(named.stdout, /^export interface Quote \{$/m);
    assert.match(named.stdout, /^ {2}venue: Venue;$/m);
    assert.match(named.stdout, /^export interface Venue \{$/m);
    assert.match(named.stdout, /^export type QuoteState = ReadonlyMap<string, Quote>;$/m);
    const unnamed = await run(['--schema', file]);
    assert.equal(unnamed.code, 0, unnamed.stderr);
    assert.match(unnamed.stdout, /^export interface Prices \{$/m, 'the name defaults to the file name');
    assert.equal(requests.length, before);
  });

  test('a missing file, a file that is not JSON, a $ref to nowhere: exit 1, one line', async () => {
    const missing = await run(['--schema', join(scratch, 'missing.json'), '--name', 'T']);
    assert.equal(missing.code, 1);
    assert.match(oneLine(missing.stderr), /cannot read the schema .*missing\.json: ENOENT/);
    const notJson = join(scratch, 'not.json');
    await writeFile(notJson, '{"type": "object",');
    const bad = await run(['--schema', notJson, '--name', 'T']);
    assert.equal(bad.code, 1);
    assert.match(oneLine(bad.stderr), /cannot read the schema .*not\.json: /);
    const dangling = join(scratch, 'dangling.json');
    await writeFile(dangling, JSON.stringify({ type: 'object', properties: { a: { $ref: '#/$defs/Missing' } } }));
    const ref = await run(['--schema', dangling, '--name', 'T']);
    assert.equal(ref.code, 1);
    assert.match(oneLine(ref.stderr), /dangling\.json: json-schema-to-typescript cannot read the schema: .*Missing/);
  });

  test('a URL with --schema is a bad command line', async () => {
    const { code, stderr } = await run(['--schema', 'x.json', base, 'prices']);
    assert.equal(code, 2);
    assert.match(stderr, /--schema reads a file/);
  });
});

describe('@viewtape/client/types', () => {
  test('viewSchema fetches the schema, with the token', async () => {
    assert.deepEqual(await viewSchema(base, 'prices'), PRICES_SCHEMA);
    const before = requests.length;
    assert.deepEqual(await viewSchema(`${base}/`, 'secret', { token: async () => TOKEN }), {
      type: 'object',
      properties: { level: { type: 'integer' } },
      required: ['level'],
    });
    assert.equal(requests[before].url, '/views/secret/schema');
    assert.equal(requests[before].authorization, `Bearer ${TOKEN}`);
  });

  test('viewSchema throws ViewTypesError with the code, status and server message', async () => {
    const cases = [
      ['raw', {}, 'no_schema', 404, 'view raw has no schema: its values are untyped'],
      ['nosuch', {}, 'not_found', 404, 'no view nosuch'],
      ['secret', {}, 'unauthorized', 401, 'a bearer token is required'],
      ['secret', { token: 'another' }, 'forbidden', 403, 'the token does not grant view secret'],
    ];
    for (const [view, options, code, status, serverMessage] of cases) {
      await assert.rejects(viewSchema(base, view, options), error => {
        assert.ok(error instanceof ViewTypesError, String(error));
        assert.equal(error.code, code);
        assert.equal(error.status, status);
        assert.equal(error.serverMessage, serverMessage);
        assert.ok(error.message.includes(`${base}/views/${view}/schema`), error.message);
        return true;
      });
    }
  });

  test('typesFor and viewTypes', async () => {
    const source = await typesFor(PRICES_SCHEMA, 'Prices');
    assert.match(source, /^export interface Prices \{$/m);
    assert.match(source, /^export interface Point \{$/m);
    assert.match(await typesFor({ type: 'integer' }, 'Count'), /^export type Count = number;$/m);
    assert.match(await typesFor({}, 'Anything'), /^export type Anything = unknown;$/m);
    assert.match(await viewTypes(base, 'prices'), /^export interface Prices \{$/m);
    await assert.rejects(typesFor(PRICES_SCHEMA, 'not a name'), { name: 'ViewTypesError', code: 'bad_name' });
    assert.equal(typeName('order.book'), 'OrderBook');
    assert.equal(typeName('price_ticks'), 'PriceTicks');
  });

  test('the main entry point does not load json-schema-to-typescript', async () => {
    const main = await readFile(join(root, 'dist', 'index.js'), 'utf8');
    assert.doesNotMatch(main, /types\.js|json-schema-to-typescript/);
  });
});

describe('openView at run time', () => {
  test('a stream of state, synced, update and delete: the changes and the state', async () => {
    const epoch = '00000000000000ab';
    const frames = [
      `event: state\ndata: {"key": "ACME", "value": {"symbol": "ACME", "price": 1}}\n\n`,
      `event: state\ndata: {"key": "BOLT", "value": {"symbol": "BOLT", "price": 2}}\n\n`,
      `event: synced\nid: ${epoch}-4\ndata: {}\n\n`,
      `event: update\nid: ${epoch}-5\ndata: {"key": "ACME", "value": {"symbol": "ACME", "price": 3}}\n\n`,
      `event: delete\nid: ${epoch}-6\ndata: {"key": "BOLT"}\n\n`,
    ];
    // A server that sends these frames and holds the stream open, as the real one does.
    const fetch = async (_url, init) => {
      const body = new ReadableStream({
        start(controller) {
          for (const frame of frames) controller.enqueue(new TextEncoder().encode(frame));
          init.signal.addEventListener('abort', () => controller.error(init.signal.reason), { once: true });
        },
      });
      return new Response(body, { status: 200, headers: { 'content-type': 'text/event-stream' } });
    };
    const view = openView('http://viewtape.test', 'prices', { fetch, releaseWhenHiddenAfter: false });
    const changes = [];
    view.on('change', change => changes.push(change));
    await view.synced();
    const deadline = Date.now() + 10_000;
    while (view.cursor !== `${epoch}-6` && Date.now() < deadline) await new Promise(resolve => setTimeout(resolve, 10));
    await view.close();
    assert.deepEqual(changes, [
      { key: 'ACME', value: { symbol: 'ACME', price: 1 }, deleted: false, cursor: `${epoch}-4`, fromState: true },
      { key: 'BOLT', value: { symbol: 'BOLT', price: 2 }, deleted: false, cursor: `${epoch}-4`, fromState: true },
      { key: 'ACME', value: { symbol: 'ACME', price: 3 }, deleted: false, cursor: `${epoch}-5`, fromState: false },
      { key: 'BOLT', value: undefined, deleted: true, cursor: `${epoch}-6`, fromState: false },
    ]);
    assert.deepEqual([...view.state], [['ACME', { symbol: 'ACME', price: 3 }]]);
  });
});

describe('openView<Generated> type-checks', () => {
  /** A project that depends on this package (a link to it) and holds the generated types. */
  let app;

  before(async () => {
    app = join(scratch, 'app');
    await mkdir(join(app, 'node_modules', '@viewtape'), { recursive: true });
    await symlink(root, join(app, 'node_modules', '@viewtape', 'client'), 'dir');
    await writeFile(join(app, 'package.json'), JSON.stringify({ name: 'app', private: true, type: 'module' }));
    const { code, stderr } = await run([base, 'prices', '--out', join(app, 'prices.ts')]);
    assert.equal(code, 0, stderr);
  });

  /** `tsc --noEmit` over `prices.ts` and `file`: its exit code and diagnostics. */
  function typecheck(file) {
    const args = [tsc, '--noEmit', '--strict', '--module', 'nodenext', '--moduleResolution', 'nodenext', '--target', 'es2022', '--skipLibCheck', 'prices.ts', file];
    return new Promise(resolve => {
      execFile(process.execPath, args, { cwd: app, timeout: 120_000 }, (error, stdout, stderr) => {
        resolve({ code: error ? (typeof error.code === 'number' ? error.code : -1) : 0, output: stdout + stderr });
      });
    });
  }

  test('fields the schema declares compile, end to end', async () => {
    await writeFile(
      join(app, 'ok.ts'),
      `import { openView, type Change, type View } from '@viewtape/client';
import { useView } from '@viewtape/client/react';
import type { Prices, PricesState, Venue } from './prices.js';

export async function follow(): Promise<string> {
  const view: View<Prices> = openView<Prices>('http://localhost:8080', 'prices');
  view.on('change', (change: Change<Prices>) => {
    if (!change.deleted) console.log(change.value.price.toFixed(2), change.value.venue.mic);
  });
  view.on('change', ({ key, value, deleted }) => console.log(key, deleted ? 'gone' : value.symbol));
  await view.synced();
  const state: PricesState = view.state;
  const tick: Prices | undefined = state.get('ACME');
  const venue: Venue | undefined = tick?.venue;
  const last = tick?.history?.at(-1)?.price;
  const untyped = openView('http://localhost:8080', 'prices');
  const raw: ReadonlyMap<string, unknown> = untyped.state;
  await Promise.all([view.close(), untyped.close()]);
  return \`\${tick?.symbol} \${tick?.seq} \${venue?.open} \${last} \${tick?.side ?? ''} \${tick?.note ?? ''} \${raw.size}\`;
}

export function usePrices(): number {
  const { state } = useView<Prices>('prices', { baseUrl: 'http://localhost:8080' });
  return [...state.values()].reduce((sum, tick) => sum + tick.price, 0);
}
`,
    );
    const { code, output } = await typecheck('ok.ts');
    assert.equal(code, 0, `tsc failed:\n${output}`);
  });

  test('a field the schema does not declare does not compile', async () => {
    await writeFile(
      join(app, 'bad.ts'),
      `import { openView } from '@viewtape/client';
import type { Prices } from './prices.js';

const view = openView<Prices>('http://localhost:8080', 'prices');
export const price: number | undefined = view.state.get('ACME')?.pricee;
`,
    );
    const { code, output } = await typecheck('bad.ts');
    assert.notEqual(code, 0, 'tsc accepted a misspelt field');
    assert.match(output, /bad\.ts\(5,\d+\): error TS2551: Property 'pricee' does not exist on type 'Prices'/);
    assert.equal(output.match(/error TS/g)?.length, 1, output);
  });

  test('a value of the wrong type does not compile', async () => {
    await writeFile(
      join(app, 'wrong.ts'),
      `import { openView } from '@viewtape/client';
import type { Prices } from './prices.js';

const view = openView<Prices>('http://localhost:8080', 'prices');
view.on('change', change => {
  if (!change.deleted) {
    const symbol: number = change.value.symbol;
    console.log(symbol);
  }
});
`,
    );
    const { code, output } = await typecheck('wrong.ts');
    assert.notEqual(code, 0, 'tsc accepted a string as a number');
    assert.match(output, /wrong\.ts\(7,\d+\): error TS2322: Type 'string' is not assignable to type 'number'/);
  });
});

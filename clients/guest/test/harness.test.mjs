// The harness against the real binary: examples/js/ticker.js, and small guests written here, run
// by `viewtape run`. The binary: VIEWTAPE_BIN (scripts/test points it at target/debug/viewtape),
// else `viewtape` on PATH; without one the tests that need it are skipped, saying so — except
// under CI, where a missing binary fails the run.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { chmod, mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';

import { findViewtape, GuestError, runGuest } from '../dist/harness.js';

const ticker = fileURLToPath(new URL('../../../examples/js/ticker.js', import.meta.url));
const viewtape = findViewtape();
if (viewtape === undefined && process.env.CI) {
  throw new Error('no viewtape binary under CI: set VIEWTAPE_BIN');
}
const needsBinary = {
  skip: viewtape === undefined
    ? 'no viewtape binary: set VIEWTAPE_BIN or put viewtape on PATH (cargo build -p viewtape-server --bin viewtape)'
    : false,
};

const tick = (symbol, price, seq) => JSON.stringify({ symbol, price, seq });

/** Writes `source` as a guest module in a temporary directory; returns its path. */
async function guestFile(source) {
  const dir = await mkdtemp(join(tmpdir(), 'viewtape-guest-test-'));
  const path = join(dir, 'guest.js');
  await writeFile(path, source);
  return { path, remove: () => rm(dir, { recursive: true, force: true }) };
}

test('a batch publishes, reports gaps and logs, and the state follows it', needsBinary, async () => {
  const g = await runGuest(ticker);
  try {
    assert.deepEqual(g.state(), { last: null }, "init's state before any batch");
    const out = await g.feed([tick('ACME', 12.5, 1), tick('ACME', 12.5, 1), tick('XYZ', 3, 4)]);
    assert.equal(out.error, undefined);
    assert.deepEqual(out.published, [
      { view: 'prices', key: 'ACME', value: { symbol: 'ACME', price: 12.5, seq: 1 } },
      { view: 'prices', key: 'XYZ', value: { symbol: 'XYZ', price: 3, seq: 4 } },
    ]);
    assert.deepEqual(out.gaps, ['ticker seq jumped from 1 to 4: 2 tick(s) missing']);
    assert.deepEqual(out.logs, [
      { level: 'info', message: 'skipped 1 tick(s) already seen (seq at or below the last)' },
    ]);
    assert.deepEqual(g.state(), { last: 4 });
  } finally {
    await g.close();
  }
});

test('a rejected batch counts for nothing and leaves the state as it was', needsBinary, async () => {
  const g = await runGuest(ticker);
  try {
    await g.feed([tick('ACME', 1, 1)]);
    const rejected = await g.feed([tick('ACME', 2, 2), '{oops']);
    assert.match(rejected.error ?? '', /line 2: malformed tick/);
    assert.deepEqual(rejected.published, []);
    assert.deepEqual(g.state(), { last: 1 });
    // Seq 2 never counted: it is news, not a redelivery.
    const next = await g.feed(tick('ACME', 2, 2));
    assert.deepEqual(next.published.map(p => p.value), [{ symbol: 'ACME', price: 2, seq: 2 }]);
    assert.deepEqual(next.gaps, []);
  } finally {
    await g.close();
  }
});

test('a saved state starts another run where the first stopped', needsBinary, async () => {
  const first = await runGuest(ticker);
  await first.feed([tick('ACME', 1, 7)]);
  const saved = first.savedState();
  await first.close();
  const second = await runGuest(ticker, { savedState: saved });
  try {
    assert.deepEqual(second.state(), { last: 7 });
    const out = await second.feed([tick('ACME', 1, 7)]);
    assert.deepEqual(out.published, [], 'a redelivery');
  } finally {
    await second.close();
  }
});

test('Date.now() is the batch time a feed gives, and Math.random() is the same for the same batches', needsBinary, async () => {
  const guest = await guestFile(`
export function init() { return {}; }
export function onBatch(state, input, ctx) {
  ctx.publish('clock', 'now', { now: Date.now(), iso: new Date().toISOString(), r: Math.random() });
  return state;
}
`);
  const draws = async () => {
    const g = await runGuest(guest.path);
    try {
      const first = await g.feed(['a'], { at: 1_700_000_000_123 });
      const second = await g.feed(['b'], { at: new Date('2026-12-05T12:00:00Z') });
      assert.equal(g.state() !== undefined, true);
      return [first, second].map(batch => batch.published[0].value);
    } finally {
      await g.close();
    }
  };
  try {
    const [first, second] = await draws();
    assert.equal(first.now, 1_700_000_000_123);
    assert.equal(first.iso, '2023-11-14T22:13:20.123Z');
    assert.equal(second.now, Date.parse('2026-12-05T12:00:00Z'));
    assert.notEqual(first.r, second.r);
    assert.deepEqual(await draws(), [first, second], 'the same batches at the same times draw the same');
    const g = await runGuest(guest.path);
    try {
      await assert.rejects(g.feed(['c'], { at: -1 }), GuestError);
    } finally {
      await g.close();
    }
  } finally {
    await guest.remove();
  }
});

test('config reaches init; deletes and schema checks are as the server has them', needsBinary, async () => {
  const guest = await guestFile(`
    export function init(config) { return { view: config.trim(), n: 0 }; }
    export function onBatch(state, input, ctx) {
      for (const line of input.split('\\n')) {
        if (!line) continue;
        const [op, key, value] = line.split(' ');
        if (op === 'del') ctx.delete(state.view, key);
        else ctx.publish(state.view, key, JSON.parse(value));
        state.n++;
      }
      return state;
    }
    export const schemas = { counts: { type: 'integer', minimum: 0 } };
  `);
  const g = await runGuest(guest.path, { config: 'counts\n' });
  try {
    assert.deepEqual(g.state(), { view: 'counts', n: 0 });
    const out = await g.feed(['put a 1', 'del b']);
    assert.deepEqual(out.published, [{ view: 'counts', key: 'a', value: 1 }]);
    assert.deepEqual(out.deleted, [{ view: 'counts', key: 'b' }]);
    const refused = await g.feed(['put c 2', 'put d -1']);
    assert.match(refused.error ?? '', /minimum/);
    assert.deepEqual(refused.published, [], 'not even c');
    assert.deepEqual(g.state(), { view: 'counts', n: 2 });
  } finally {
    await g.close();
    await guest.remove();
  }
});

test('a module that does not compile is refused at runGuest, saying where', needsBinary, async () => {
  const guest = await guestFile('export function init(config) {\n  return {;\n}\n');
  try {
    await assert.rejects(runGuest(guest.path), error => {
      assert.ok(error instanceof GuestError, String(error));
      assert.match(error.message, /does not compile: SyntaxError/);
      assert.match(error.message, /guest\.js:2:/, 'the line');
      return true;
    });
  } finally {
    await guest.remove();
  }
});

test('the binary is the option, then VIEWTAPE_BIN, then PATH', async () => {
  const dir = await mkdtemp(join(tmpdir(), 'viewtape-path-'));
  const saved = { bin: process.env.VIEWTAPE_BIN, path: process.env.PATH };
  try {
    const onPath = join(dir, 'viewtape');
    await writeFile(onPath, '#!/bin/sh\n');
    await chmod(onPath, 0o755);
    process.env.PATH = dir;
    delete process.env.VIEWTAPE_BIN;
    assert.equal(findViewtape(), onPath);
    process.env.VIEWTAPE_BIN = '/opt/viewtape/bin/viewtape';
    assert.equal(findViewtape(), '/opt/viewtape/bin/viewtape');
    assert.equal(findViewtape('/usr/local/bin/viewtape'), '/usr/local/bin/viewtape');
    process.env.PATH = join(dir, 'nothing-here');
    delete process.env.VIEWTAPE_BIN;
    assert.equal(findViewtape(), undefined);
    await assert.rejects(runGuest(ticker), /no viewtape binary/);
  } finally {
    process.env.PATH = saved.path;
    if (saved.bin === undefined) delete process.env.VIEWTAPE_BIN;
    else process.env.VIEWTAPE_BIN = saved.bin;
    await rm(dir, { recursive: true, force: true });
  }
});

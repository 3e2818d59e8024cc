// Helpers shared by the Node client scripts. Run by tests/tests/clients.rs; see clients/README.md.
import { createHmac } from 'node:crypto';
import { createInterface } from 'node:readline';

/** Fails the script with a message (exit status 1 via the unhandled rejection). */
export function check(condition, message) {
  if (!condition) throw new Error(`assertion failed: ${typeof message === 'function' ? message() : message}`);
}

export function log(...args) {
  console.log(...args);
}

/** Waits until `predicate()` is truthy, polling; throws after `ms`. */
export async function until(predicate, ms, what) {
  const deadline = Date.now() + ms;
  for (;;) {
    const value = await predicate();
    if (value) return value;
    if (Date.now() > deadline) throw new Error(`timed out after ${ms} ms waiting for ${typeof what === "function" ? what() : what}`);
    await new Promise(r => setTimeout(r, 25));
  }
}

/** Ticks for the embedded ticker guest: one global, dense `seq` over all symbols. */
export class Feed {
  constructor(symbols, nextSeq = 1) { this.symbols = symbols; this.nextSeq = nextSeq; }
  symbolOf(seq) { return this.symbols[(seq - 1) % this.symbols.length]; }
  static priceOf(seq) { return (seq % 10000) / 4 + 1; }
  batch(n) {
    let out = '';
    for (let i = 0; i < n; i++, this.nextSeq++) {
      const seq = this.nextSeq;
      out += JSON.stringify({ symbol: this.symbolOf(seq), price: Feed.priceOf(seq), seq }) + '\n';
    }
    return out;
  }
}

/** `POST /runtimes/{runtime}/ingest`, requiring a 200; `headers` (e.g. `Authorization`) go along. */
export async function ingest(base, runtime, body, headers = {}) {
  const res = await fetch(`${base}/runtimes/${runtime}/ingest`, { method: 'POST', body, headers, signal: AbortSignal.timeout(10000) });
  const text = await res.text();
  check(res.status === 200, `ingest into ${runtime}: status ${res.status}: ${text}`);
  return JSON.parse(text);
}

export async function getJson(base, path, headers = {}) {
  const res = await fetch(`${base}${path}`, { headers, signal: AbortSignal.timeout(10000) });
  check(res.status === 200, `GET ${path}: status ${res.status}`);
  return res.json();
}

/** A JWT over `claims`, signed HS256 with `secret` (what the server takes with VIEWTAPE_JWT_SECRET). */
export function hs256(secret, claims) {
  const part = value => Buffer.from(JSON.stringify(value)).toString('base64url');
  const signed = `${part({ alg: 'HS256', typ: 'JWT' })}.${part(claims)}`;
  return `${signed}.${createHmac('sha256', secret).update(signed).digest('base64url')}`;
}

/** A cursor `<16 hex epoch>-<offset>` split into its parts. */
export function parseCursor(id) {
  const m = /^([0-9a-f]{16})-(\d+)$/.exec(id ?? '');
  check(m, `${JSON.stringify(id)} is not a cursor`);
  return { epoch: m[1], offset: Number(m[2]) };
}

/** An epoch that is certainly not `epoch`. */
export function otherEpoch(epoch) {
  for (;;) {
    const e = [...Array(16)].map(() => '0123456789abcdef'[Math.floor(Math.random() * 16)]).join('');
    if (e !== epoch) return e;
  }
}

// Control channel to the Rust driver: print `@@ctl <command>`, read `ok …` / `err …` on stdin.
const replies = [];
const waiters = [];
const rl = createInterface({ input: process.stdin });
rl.on('line', line => { const w = waiters.shift(); if (w) w(line); else replies.push(line); });

export async function control(command, ms = 90000) {
  console.log(`@@ctl ${command}`);
  const reply = replies.length ? replies.shift() : await new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`no reply to ${command} within ${ms} ms`)), ms);
    waiters.push(line => { clearTimeout(timer); resolve(line); });
  });
  check(reply.startsWith('ok'), `${command}: ${reply}`);
}

/** Ends the script: closes stdin so the process can exit. */
export function done(message = 'PASS') {
  rl.close();
  process.stdin.destroy();
  log(message);
}

// Test support for the @viewtape/client tests: a fault-injecting TCP proxy in front of the real
// server, and the end-of-scenario checks (the client's map equals `GET /views/{view}` at the same
// cursor; every event applied once, in order). Shared helpers (control channel, ingest, getJson)
// come from clients/common.mjs.
import { createServer, connect } from 'node:net';

import { check, getJson, until } from '../../common.mjs';

/**
 * A TCP proxy to `target` (`host:port`). Each new client connection takes the next fault from
 * `plan` (then `mode`, default `pass`):
 *  - `pass`: bytes both ways;
 *  - `503`: answers `503` with `Retry-After: <retryAfter>` itself;
 *  - `html`: answers `200 text/html` (a captive portal, a login page);
 *  - `buffer`: forwards the response head, holds back every byte of the body;
 *  - `strip-ids`: renames every `id:` field of the stream to `ix:` (same length, so chunked
 *    framing stays valid), as a proxy that mangles SSE would;
 *  - `cut`: passes bytes until the response carries an `event: update`, forwards half of that
 *    frame and closes both sides: a connection cut mid-frame.
 * `requests` records each connection's request line and the time it arrived; `retryHints`, each
 * `retry:` value a passed-through stream carried, with its connection's index in `requests`.
 */
export class FaultProxy {
  constructor(target) {
    const [host, port] = target.split(':');
    this.host = host;
    this.targetPort = Number(port);
    this.mode = 'pass';
    this.plan = [];
    this.retryAfter = 1;
    this.requests = [];
    this.retryHints = [];
    this.sockets = new Set();
    this.server = createServer(socket => this.#accept(socket));
  }

  async listen() {
    await new Promise(resolve => this.server.listen(0, '127.0.0.1', resolve));
    this.port = this.server.address().port;
    this.url = `http://127.0.0.1:${this.port}`;
    return this;
  }

  /** Sends new connections to `target` (`host:port`) from now on: a load balancer's switch. */
  retarget(target) {
    const [host, port] = target.split(':');
    this.host = host;
    this.targetPort = Number(port);
  }

  /** Closes every open connection (as a load balancer that drops them would). */
  dropAll() {
    for (const socket of this.sockets) socket.destroy();
  }

  async close() {
    this.dropAll();
    await new Promise(resolve => this.server.close(resolve));
  }

  #track(socket) {
    this.sockets.add(socket);
    socket.on('close', () => this.sockets.delete(socket));
    socket.on('error', () => {});
  }

  #accept(client) {
    this.#track(client);
    let head = Buffer.alloc(0);
    const onData = chunk => {
      head = Buffer.concat([head, chunk]);
      const end = head.indexOf('\r\n\r\n');
      if (end < 0) return;
      client.off('data', onData);
      client.pause();
      const line = head.subarray(0, head.indexOf('\r\n')).toString();
      const mode = this.plan.length ? this.plan.shift() : this.mode;
      this.requests.push({ line, mode, at: Date.now() });
      this.#serve(client, head, mode, this.requests.length - 1);
    };
    client.on('data', onData);
  }

  #serve(client, head, mode, index) {
    if (mode === '503' || mode === 'html') {
      const body = mode === '503' ? '{"error":"unavailable","message":"try later"}' : '<html>please log in</html>';
      const type = mode === '503' ? 'application/json' : 'text/html';
      const status = mode === '503' ? '503 Service Unavailable' : '200 OK';
      const extra = mode === '503' ? `Retry-After: ${this.retryAfter}\r\n` : '';
      client.end(`HTTP/1.1 ${status}\r\n${extra}Content-Type: ${type}\r\nContent-Length: ${body.length}\r\nConnection: close\r\n\r\n${body}`);
      return;
    }
    const upstream = connect(this.targetPort, this.host);
    this.#track(upstream);
    upstream.on('close', () => client.destroy());
    client.on('close', () => upstream.destroy());
    upstream.write(head);
    client.on('data', chunk => upstream.write(chunk));
    client.resume();
    let sawHead = false;
    upstream.on('data', chunk => {
      for (const [, ms] of chunk.toString('latin1').matchAll(/(?:^|\n)retry: ?(\d+)\r?\n/g)) {
        this.retryHints.push({ connection: index, ms: Number(ms) });
      }
      if (mode === 'pass') return void client.write(chunk);
      if (mode === 'strip-ids') {
        return void client.write(Buffer.from(chunk.toString('latin1').replace(/(^|\n)id:/g, '$1ix:'), 'latin1'));
      }
      if (mode === 'buffer') {
        if (sawHead) return;
        const end = chunk.indexOf('\r\n\r\n');
        if (end >= 0) {
          sawHead = true;
          client.write(chunk.subarray(0, end + 4));
        } else client.write(chunk);
        return;
      }
      if (mode === 'cut') {
        const at = chunk.indexOf('event: update');
        if (at < 0) return void client.write(chunk);
        const frameEnd = chunk.indexOf('\n\n', at);
        const half = at + Math.floor(((frameEnd < 0 ? chunk.length : frameEnd) - at) / 2);
        client.write(chunk.subarray(0, half), () => {
          client.destroy();
          upstream.destroy();
        });
      }
    });
  }
}

/**
 * Records what a view applies: every change that came from a live event (not a state swap),
 * and every reset. `check()` asserts each cursor was applied at most once and in order.
 */
export function recordChanges(view) {
  const record = { live: [], swaps: 0, resets: [], errors: [], statuses: [] };
  view.on('change', c => {
    if (c.fromState) return;
    record.live.push(c);
  });
  view.on('synced', () => void (record.swaps += 1));
  view.on('reset', r => void record.resets.push(r));
  view.on('error', e => void record.errors.push(e));
  view.on('status', s => void record.statuses.push(s));
  return record;
}

/** Every live change's cursor is unique and increasing within its epoch. */
export function checkAppliedOnce(record) {
  const seen = new Set();
  let last;
  for (const c of record.live) {
    check(!seen.has(c.cursor), `cursor ${c.cursor} applied twice`);
    seen.add(c.cursor);
    const [epoch, offset] = c.cursor.split('-');
    if (last && last.epoch === epoch) {
      check(Number(offset) > last.offset, `cursor ${c.cursor} after ${last.epoch}-${last.offset}`);
    }
    last = { epoch, offset: Number(offset) };
  }
}

/**
 * Waits until the view's cursor is the one `GET /views/{view}` reports, then requires the
 * client's map to equal the server's entries exactly.
 */
export async function checkMatchesServer(base, view, name, { headers = {}, ms = 30000 } = {}) {
  let server;
  await until(async () => {
    server = await getJson(base, `/views/${name}`, headers);
    return view.cursor === server.cursor;
  }, ms, () => `the client at ${view.cursor} to reach the server's cursor ${server?.cursor}`);
  const mine = Object.fromEntries(view.state);
  check(JSON.stringify(sortKeys(mine)) === JSON.stringify(sortKeys(server.entries)),
    () => `the client's map differs from GET /views/${name} at ${server.cursor}:\nclient ${JSON.stringify(sortKeys(mine))}\nserver ${JSON.stringify(sortKeys(server.entries))}`);
  return server;
}

function sortKeys(object) {
  return Object.fromEntries(Object.entries(object).sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0)));
}

export const sleep = ms => new Promise(resolve => setTimeout(resolve, ms));

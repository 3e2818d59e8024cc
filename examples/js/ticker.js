// ticker.js — the demo ticker (examples/guests/ticker) as a JavaScript guest (DESIGN.md §15).
//
// Input: NDJSON, one tick per line: {"symbol":"ACME","price":12.5,"seq":7}.
// Output: view `prices`, key = the symbol, value = {symbol, price, seq}.
// A malformed line rejects the whole batch, naming the line; a `seq` jump reports a gap; a tick
// at or below the last `seq` is a redelivery and is skipped. State: the last `seq` seen.
//
//   viewtape run examples/js/ticker.js < ticks.ndjson
//
// [[runtime]]
// name = "demo"
// module = "examples/js/ticker.js"
// views = ["prices"]

const MAX_SEQ_JUMP = 1000000;

export function init(config) {
  return { last: null };
}

export function onBatch(state, input, ctx) {
  const lines = input.split('\n');
  let skipped = 0;
  for (let i = 0; i < lines.length; i++) {
    const line = lines[i];
    if (!line) continue;
    let t;
    try {
      t = JSON.parse(line);
    } catch (e) {
      // A blank line is skipped; blank lines are rare, so this is asked only of a line that
      // does not parse (JSON.parse takes the spaces around a tick, and an \r at its end).
      if (!line.trim()) continue;
      throw new Error(`line ${i + 1}: malformed tick: ${e.message}`);
    }
    if (typeof t.symbol !== 'string' || !t.symbol) throw new Error(`line ${i + 1}: empty symbol`);
    if (typeof t.price !== 'number' || !Number.isFinite(t.price)) {
      throw new Error(`line ${i + 1}: price is not a finite number`);
    }
    if (!Number.isSafeInteger(t.seq) || t.seq < 0) throw new Error(`line ${i + 1}: seq is not a count`);
    const last = state.last;
    if (last !== null) {
      if (t.seq <= last) { skipped++; continue; }
      if (t.seq - last > MAX_SEQ_JUMP) {
        throw new Error(`line ${i + 1}: seq ${t.seq} is ${t.seq - last} ahead of the last seq ${last}`);
      }
      if (t.seq > last + 1) {
        ctx.reportGap(`ticker seq jumped from ${last} to ${t.seq}: ${t.seq - last - 1} tick(s) missing`);
      }
    }
    state.last = t.seq;
    ctx.publish('prices', t.symbol, { symbol: t.symbol, price: t.price, seq: t.seq });
  }
  if (skipped > 0) ctx.log('info', `skipped ${skipped} tick(s) already seen (seq at or below the last)`);
  return state;
}

export const schemas = {
  prices: {
    type: 'object',
    required: ['symbol', 'price', 'seq'],
    properties: {
      symbol: { type: 'string', minLength: 1 },
      price: { type: 'number' },
      seq: { type: 'integer', minimum: 0 },
    },
    additionalProperties: false,
  },
};

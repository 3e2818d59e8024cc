// vwap.js — the volume-weighted average price of each symbol over its last N trades: what a few
// lines of JavaScript say and a Rust guest would take a crate's worth of parsing to.
//
// Input: NDJSON, one trade per line: {"symbol":"ACME","price":12.5,"qty":100}.
// Config: N, the window (a whole number, default 20).
// Output: view `vwap`, key = the symbol, after every batch for each symbol it traded:
// {"symbol":"ACME","vwap":12.52,"volume":300,"trades":3}, over that symbol's last N trades.
// A malformed trade rejects the whole batch, naming the line.
//
//   echo 3 > window; viewtape run examples/js/vwap.js --config window < trades.ndjson
//
// [[runtime]]
// name = "trades"
// module = "examples/js/vwap.js"
// views = ["vwap"]
// config = "50"

export function init(config) {
  const n = config.trim() === '' ? 20 : Number(config);
  if (!Number.isInteger(n) || n < 1 || n > 10000) {
    throw new Error(`config: the window is a whole number of trades in 1..10000, not ${JSON.stringify(config)}`);
  }
  return { n, trades: {} }; // symbol -> [[price, qty], …], oldest first, at most n
}

export function onBatch(state, input, ctx) {
  const touched = new Set();
  input.split('\n').forEach((line, i) => {
    if (!line.trim()) return;
    const { symbol, price, qty } = JSON.parse(line);
    if (typeof symbol !== 'string' || !symbol) throw new Error(`line ${i + 1}: no symbol`);
    if (!(price > 0) || !(qty > 0) || !Number.isFinite(price * qty)) {
      throw new Error(`line ${i + 1}: price and qty must be positive numbers`);
    }
    const window = (state.trades[symbol] ??= []);
    window.push([price, qty]);
    if (window.length > state.n) window.splice(0, window.length - state.n);
    touched.add(symbol);
  });
  for (const symbol of [...touched].sort()) {
    const window = state.trades[symbol];
    const volume = window.reduce((sum, [, qty]) => sum + qty, 0);
    const notional = window.reduce((sum, [price, qty]) => sum + price * qty, 0);
    const vwap = Math.round((notional / volume) * 1e6) / 1e6;
    ctx.publish('vwap', symbol, { symbol, vwap, volume, trades: window.length });
  }
  return state;
}

export const schemas = {
  vwap: {
    type: 'object',
    required: ['symbol', 'vwap', 'volume', 'trades'],
    properties: {
      symbol: { type: 'string', minLength: 1 },
      vwap: { type: 'number' },
      volume: { type: 'number' },
      trades: { type: 'integer', minimum: 1 },
    },
  },
};

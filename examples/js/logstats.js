// logstats.js — the logstats guest (examples/guests/logstats) as a JavaScript guest (DESIGN.md §15).
//
// Input: one log line per line, `<service> <level> <message…>`, e.g. `checkout ERROR payment
// declined`. Levels: error, warn, info, debug, trace (any case); anything else counts as `other`.
// The line `<service> retired` retires a service.
// Output: view `log-levels`, key = the service: once per batch for every service the batch
// touched, its totals, e.g.
// {"service":"checkout","error":1,"warn":0,"info":3,"debug":0,"trace":0,"other":0,"total":4}.
// A retired service's key is deleted and its counts forgotten. Frames are byte for byte those of
// the Rust guest, and `migrate` reads the Rust guest's state, so a deploy from builtin:logstats
// to this module keeps the counts.
//
//   viewtape run examples/js/logstats.js < app.log
//
// [[runtime]]
// name = "logs"
// module = "examples/js/logstats.js"
// views = ["log-levels"]

const VIEW = 'log-levels';
const LEVELS = ['error', 'warn', 'info', 'debug', 'trace', 'other'];
const SERVICE = /^[A-Za-z0-9._-]{1,128}$/;

export function init() {
  return { counts: {} }; // service -> [error, warn, info, debug, trace, other]
}

function levelIndex(level) {
  const i = LEVELS.indexOf(level.toLowerCase());
  return i >= 0 && i < 5 ? i : 5;
}

export function onBatch(state, input, ctx) {
  const touched = new Set();
  const retired = new Set();
  const lines = input.split('\n');
  for (let i = 0; i < lines.length; i++) {
    const words = lines[i].split(/\s+/).filter((w) => w !== '');
    if (words.length === 0) continue;
    const [service, level = ''] = words;
    if (!SERVICE.test(service)) {
      throw new Error(`line ${i + 1}: service name ${JSON.stringify(service)} is not [A-Za-z0-9._-]{1,128}`);
    }
    if (level === 'retired' && words.length === 2) {
      delete state.counts[service];
      touched.delete(service);
      retired.add(service);
      continue;
    }
    retired.delete(service);
    const counts = (state.counts[service] ??= [0, 0, 0, 0, 0, 0]);
    counts[levelIndex(level)] += 1;
    touched.add(service);
  }
  for (const service of [...retired].sort()) ctx.delete(VIEW, service);
  for (const service of [...touched].sort()) {
    const counts = state.counts[service];
    const value = { service };
    LEVELS.forEach((name, i) => { value[name] = counts[i]; });
    value.total = counts.reduce((a, b) => a + b, 0);
    ctx.publish(VIEW, service, value);
  }
  return state;
}

// The Rust guest saves one line per service, `<service> <error> <warn> <info> <debug> <trace>
// <other>`; a state this module saved is taken as it is.
export function migrate(old) {
  if (typeof old !== 'string') return old;
  const counts = {};
  for (const line of old.split('\n')) {
    if (!line) continue;
    const [service, ...numbers] = line.split(' ');
    if (numbers.length !== 6) throw new Error(`not a logstats state line: ${JSON.stringify(line)}`);
    counts[service] = numbers.map(Number);
  }
  return { counts };
}

const count = { type: 'integer', minimum: 0 };
export const schemas = {
  [VIEW]: {
    type: 'object',
    required: ['service', ...LEVELS, 'total'],
    properties: {
      service: { type: 'string' },
      ...Object.fromEntries(LEVELS.map((l) => [l, count])),
      total: count,
    },
    additionalProperties: false,
  },
};

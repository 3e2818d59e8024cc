// Writes @viewtape/client as one ES module for browsers (eventsource-parser included), what the
// server serves as /viewtape-client.js: `node scripts/bundle.mjs [outfile]`.
import { build } from 'esbuild';

await build({
  entryPoints: [new URL('../src/index.ts', import.meta.url).pathname],
  outfile: process.argv[2] ?? new URL('../../../server/static/viewtape-client.js', import.meta.url).pathname,
  bundle: true,
  format: 'esm',
  target: 'es2022',
  minify: true,
  legalComments: 'none',
  banner: { js: '// @viewtape/client (MIT) with eventsource-parser (MIT), one ES module for browsers: `npm run bundle` in clients/js writes it.' },
  logLevel: 'warning',
});

// `prepack`: builds dist/, what the package ships, from src/ with TypeScript, a devDependency. On a
// clean checkout (no node_modules) `npm pack` would otherwise stop at "tsc: not found": the build
// tools are installed first, exactly as the lockfile pins them (`npm ci`). Output goes to stderr,
// so that `npm pack`'s stdout stays the tarball's name.
import { execFileSync } from 'node:child_process';
import { existsSync } from 'node:fs';

const root = new URL('..', import.meta.url).pathname;
// The npm running this script (npm sets npm_execpath), else the one on PATH.
const npm = process.env.npm_execpath
  ? [process.execPath, process.env.npm_execpath]
  : [process.platform === 'win32' ? 'npm.cmd' : 'npm'];
const run = args =>
  execFileSync(npm[0], [...npm.slice(1), ...args], { cwd: root, stdio: ['ignore', 2, 2] });

if (!existsSync(new URL('../node_modules/typescript/package.json', import.meta.url))) {
  console.error('@viewtape/guest: no build tools yet (node_modules): installing them from the lockfile (npm ci) to build dist/');
  run(['ci', '--no-audit', '--no-fund']);
}
run(['run', 'build']);

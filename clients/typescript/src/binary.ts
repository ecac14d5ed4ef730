// Where oac-shim and oac-image are found: the option, then the environment
// (OAC_SHIM, OAC_IMAGE), then beside this package (its bin/ directory, where
// an app ships them), then PATH.
import { existsSync } from 'node:fs';
import { join, sep } from 'node:path';
import { fileURLToPath } from 'node:url';

import { LaunchError } from './errors.js';

/** The binaries this client runs. */
export type Binary = 'oac-shim' | 'oac-image';

const envName: Record<Binary, string> = { 'oac-shim': 'OAC_SHIM', 'oac-image': 'OAC_IMAGE' };

/** This package's directory: dist/src/binary.js is two levels below it. */
const packageRoot = fileURLToPath(new URL('../..', import.meta.url));

/**
 * A path inside an Electron app's asar archive, as the unpacked copy: no
 * process can be started from inside the archive, so the app lists the
 * binaries in asarUnpack and they are in app.asar.unpacked beside it.
 */
export function unpacked(path: string): string {
  return path.replace(`${sep}app.asar${sep}`, `${sep}app.asar.unpacked${sep}`);
}

/** The binary beside this package: bin/NAME (NAME.exe on Windows). */
export function besidePackage(name: Binary, platform: NodeJS.Platform = process.platform): string {
  return unpacked(join(packageRoot, 'bin', name + (platform === 'win32' ? '.exe' : '')));
}

/** Finds a binary: option, then its variable in env, then beside this package, then the bare name (PATH). */
export function findBinary(name: Binary, option: string | undefined, env: NodeJS.ProcessEnv = process.env): string {
  if (option) return option;
  const fromEnv = env[envName[name]];
  if (fromEnv) return fromEnv;
  const beside = besidePackage(name);
  if (existsSync(beside)) return beside;
  return name;
}

/** The typed error of a binary that could not be started (ENOENT, EACCES, ...). */
export function launchError(name: Binary, path: string, err: unknown): LaunchError {
  const errno = (err as NodeJS.ErrnoException | undefined)?.code;
  const hint =
    errno === 'ENOENT'
      ? `no ${name} there: give its path (the ${name === 'oac-shim' ? 'shim' : 'image'} option or ${envName[name]}), ship it in this package's bin/, or put it in PATH`
      : `check that it is the ${name} binary of this platform and executable`;
  return new LaunchError(path, errno, err, hint);
}

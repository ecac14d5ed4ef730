// The short oac-shim commands: kept sandboxes (create, reset, destroy,
// list) and the sandboxes a keep root runs now (list --running, stop).
import { execFile } from 'node:child_process';

import { findBinary } from './binary.js';
import { KeptError, OacError } from './errors.js';
import type { ListReport } from './generated/list.js';
import type { RunningReport } from './generated/running.js';
import type { StopReport } from './generated/stop.js';

/** Where the short commands on kept sandboxes run. */
export interface KeptOptions {
  /** The oac-shim binary (default: OAC_SHIM, then beside this package, then PATH). */
  shim?: string;
  /** --keep-root (default: the shim's, /var/lib/oac for root). */
  keepRoot?: string;
  /** The shim's environment (default: this process's). */
  env?: NodeJS.ProcessEnv;
}

/** How to create a kept sandbox (`oac-shim create`). */
export interface CreateOptions extends KeptOptions {
  name: string;
  /** --provider (default bwrap). */
  provider?: string;
  /** More create flags: --rootfs, --sandbox-io, --install, --agent, the provider's own. */
  args?: string[];
}

function runKept(o: KeptOptions, args: string[]): Promise<string> {
  if (o.keepRoot) args.push('--keep-root', o.keepRoot);
  return new Promise((resolve, reject) => {
    execFile(findBinary('oac-shim', o.shim, o.env), args, { env: o.env ?? process.env, maxBuffer: 16 << 20, windowsHide: true }, (err, stdout, stderr) => {
      if (err) {
        const status = typeof err.code === 'number' ? err.code : null;
        reject(new KeptError(`oac-shim ${args[0]}: ${stderr.trim() || err.message}`, status, stderr));
        return;
      }
      resolve(stdout);
    });
  });
}

/** Creates a kept sandbox (`oac-shim create`): its record and kept state, nothing booted. Start it with Shim.start({ name, kept: {} }). */
export async function createKept(o: CreateOptions): Promise<void> {
  await runKept(o, ['create', '--name', o.name, '--provider', o.provider ?? 'bwrap', ...(o.args ?? [])]);
}

/** Takes a kept sandbox back to its image (`oac-shim reset`), keeping its name and record. */
export async function resetKept(name: string, o: KeptOptions & { agent?: string } = {}): Promise<void> {
  const args = ['reset', '--name', name];
  if (o.agent) args.push('--agent', o.agent);
  await runKept(o, args);
}

/** Removes every byte of a kept sandbox (`oac-shim destroy`). */
export async function destroyKept(name: string, o: KeptOptions = {}): Promise<void> {
  await runKept(o, ['destroy', '--name', name]);
}

/** Lists the kept sandboxes (`oac-shim list --json`). */
export async function listKept(o: KeptOptions = {}): Promise<ListReport> {
  return JSON.parse(await runKept(o, ['list', '--json'])) as ListReport;
}

/** Runs a short oac-shim command; resolves with its exit status and output (a launch error rejects). */
function runShort(o: KeptOptions, args: string[]): Promise<{ status: number | null; stdout: string; stderr: string }> {
  if (o.keepRoot) args.push('--keep-root', o.keepRoot);
  return new Promise((resolve, reject) => {
    execFile(findBinary('oac-shim', o.shim, o.env), args, { env: o.env ?? process.env, maxBuffer: 16 << 20, windowsHide: true }, (err, stdout, stderr) => {
      if (err && typeof err.code !== 'number') {
        reject(err);
        return;
      }
      resolve({ status: err ? (err.code as number) : 0, stdout, stderr });
    });
  });
}

/**
 * Lists the sandboxes a shim runs now under the keep root, throwaway and
 * kept alike, with each shim's pid and control socket (`oac-shim list
 * --running --json`). Records of shims that died are removed and listed in
 * `cleaned`, never as running.
 */
export async function list(o: KeptOptions = {}): Promise<RunningReport> {
  return JSON.parse(await runKept(o, ['list', '--running', '--json'])) as RunningReport;
}

/** A stop that did not stop every sandbox in order: report says what happened to each (killed, failed). */
export class StopError extends OacError {
  override name = 'StopError';
  declare readonly code: 'not_stopped';
  constructor(
    message: string,
    readonly report: StopReport,
  ) {
    super(message, 'not_stopped', false);
  }
}

/** How long each shim gets to exit once asked (--grace; default the shim's, 30 s). */
export interface StopOptions extends KeptOptions {
  graceMs?: number;
}

async function stopWith(o: StopOptions, what: string[]): Promise<StopReport> {
  const args = ['stop', '--json'];
  if (o.graceMs !== undefined) args.push('--grace', `${o.graceMs}ms`);
  args.push(...what);
  const r = await runShort(o, args);
  if (r.status !== 0 && r.status !== 1) throw new KeptError(`oac-shim stop: ${r.stderr.trim()}`, r.status, r.stderr);
  const report = JSON.parse(r.stdout) as StopReport;
  if (!report.all_stopped) {
    const not = report.sandboxes.filter((e) => e.outcome !== 'stopped' && e.outcome !== 'not_running');
    throw new StopError(`not every sandbox stopped in order: ${not.map((e) => `${e.name} ${e.outcome}`).join(', ')}`, report);
  }
  return report;
}

/**
 * Stops every running sandbox of the keep root in order with one call
 * (`oac-shim stop --all`): each shim is asked on its control socket, or by
 * SIGTERM when it serves none, and waited for within the grace. Resolves
 * with the report when every one stopped; rejects with a StopError (and the
 * report) when one was killed or could not be stopped.
 */
export function stopAll(o: StopOptions = {}): Promise<StopReport> {
  return stopWith(o, ['--all']);
}

/** stopAll for the named sandboxes only (`oac-shim stop NAME...`); a name not running is reported not_running. */
export function stopNamed(names: string[], o: StopOptions = {}): Promise<StopReport> {
  if (names.length === 0) return Promise.reject(new TypeError('name the sandboxes to stop (stopAll stops every one)'));
  return stopWith(o, [...names]);
}

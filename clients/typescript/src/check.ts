// check(): can this host run sandboxes, and what to fix when not
// (`oac-shim check --json`, typed from schema/check.schema.json).
import { execFile } from 'node:child_process';

import { findBinary, launchError } from './binary.js';
import { OacError, TimeoutError } from './errors.js';
import type { CheckReport, ProviderStatus } from './generated/check.js';
import { abortError, type WaitOptions } from './wait.js';

/** What check() resolves with: the shim's report, and what it means. */
export interface CheckResult extends CheckReport {
  /** A provider can run sandboxes here and the OS policy does not block (the exit status was 0). */
  ok: boolean;
  /** The providers that can run sandboxes here, in the shim's order. */
  available: ProviderStatus[];
  /** What to tell the user: the policy's message when it warns or blocks, then each unavailable provider's reason. */
  toFix: string[];
}

export interface CheckOptions extends WaitOptions {
  /** The oac-shim binary (default: OAC_SHIM, then beside this package, then PATH). */
  shim?: string;
  /** The shim's environment, and where OAC_SHIM is looked up (default: this process's). */
  env?: NodeJS.ProcessEnv;
  /** Provider flags check takes (for example --qemu-binary PATH). */
  args?: string[];
}

/** Runs `oac-shim check --json`: the OS policy's verdict and every provider's state here. Rejects only when the shim could not say (a LaunchError, an OacError). */
export function check(o: CheckOptions = {}): Promise<CheckResult> {
  const path = findBinary('oac-shim', o.shim, o.env);
  if (o.signal?.aborted) return Promise.reject(abortError(o.signal, 'check'));
  return new Promise((resolve, reject) => {
    const child = execFile(
      path,
      ['check', '--json', ...(o.args ?? [])],
      { env: o.env ?? process.env, maxBuffer: 16 << 20, windowsHide: true, ...(o.signal ? { signal: o.signal } : {}), ...(o.timeoutMs !== undefined ? { timeout: o.timeoutMs } : {}) },
      (err, stdout, stderr) => {
        if (o.signal?.aborted) return reject(abortError(o.signal, 'check'));
        if (err && child.pid === undefined) return reject(launchError('oac-shim', path, err));
        const status = err ? (typeof err.code === 'number' ? err.code : null) : 0;
        if (err?.killed && o.timeoutMs !== undefined) return reject(new TimeoutError(`check: not within ${o.timeoutMs} ms`));
        if (status !== 0 && status !== 1) {
          return reject(new OacError(`oac-shim check: ${stderr.trim() || `exit status ${status ?? err?.signal}`}`, 'check_failed', false));
        }
        let r: CheckReport;
        try {
          r = JSON.parse(stdout) as CheckReport;
        } catch (e) {
          return reject(new OacError(`oac-shim check --json printed no report (${String(e)}): is ${path} an oac-shim?`, 'check_failed', false, { cause: e }));
        }
        const toFix: string[] = [];
        if (r.policy.level !== 'ok') toFix.push(r.policy.message);
        for (const p of r.providers) if (!p.available && p.reason) toFix.push(`${p.name}: ${p.reason}`);
        resolve({ ...r, ok: status === 0, available: r.providers.filter((p) => p.available), toFix });
      },
    );
  });
}

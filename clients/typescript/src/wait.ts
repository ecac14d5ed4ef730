// Waits bounded by an AbortSignal and a timeout: the one place that turns
// either into this client's typed errors.
import { AbortError, TimeoutError } from './errors.js';

/** How every wait, command and stop can be bounded. */
export interface WaitOptions {
  /** Rejects with an AbortError when it fires (a TimeoutError for AbortSignal.timeout). */
  signal?: AbortSignal;
  /** Rejects with a TimeoutError after this many milliseconds. */
  timeoutMs?: number;
}

/** The typed error of a signal that fired while waiting for what. */
export function abortError(signal: AbortSignal, what: string): Error {
  const reason: unknown = signal.reason;
  if (reason instanceof Error && reason.name === 'TimeoutError') return new TimeoutError(`${what}: timed out (the signal's timeout)`, { cause: reason });
  return new AbortError(`${what}: aborted`, { cause: reason });
}

/**
 * Runs f and rejects when the signal fires or the timeout passes first,
 * whichever comes first; onGiveUp runs then (to stop what f started).
 */
export async function bounded<T>(what: string, o: WaitOptions, f: () => Promise<T>, onGiveUp?: () => void): Promise<T> {
  const { signal, timeoutMs } = o;
  if (signal?.aborted) {
    onGiveUp?.();
    throw abortError(signal, what);
  }
  if (!signal && timeoutMs === undefined) return f();
  let timer: NodeJS.Timeout | undefined;
  let onAbort: (() => void) | undefined;
  const stop = new Promise<never>((_, reject) => {
    if (timeoutMs !== undefined) {
      timer = setTimeout(() => {
        onGiveUp?.();
        reject(new TimeoutError(`${what}: not within ${timeoutMs} ms`));
      }, timeoutMs);
    }
    if (signal) {
      onAbort = () => {
        onGiveUp?.();
        reject(abortError(signal, what));
      };
      signal.addEventListener('abort', onAbort, { once: true });
    }
  });
  try {
    return await Promise.race([f(), stop]);
  } finally {
    clearTimeout(timer);
    if (onAbort) signal!.removeEventListener('abort', onAbort);
  }
}

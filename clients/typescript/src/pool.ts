// A pool of warm sandboxes of one configuration (the operator's start
// options: provider, binaries, flags): N kept booted for nobody
// (oac-shim run --warm), refilled in the background with a bound on
// concurrent boots, the oldest still warm claimed for a tenant, every one
// it still holds stopped on close. docs/warm.md says what a warm sandbox
// holds and what a claim does.
import { randomBytes } from 'node:crypto';

import { CommandError, OacError, ShimError } from './errors.js';
import type { ClaimResult, ReadyEvent } from './generated/event.js';
import type { Command } from './generated/command.js';
import { Sandbox, type StartOptions } from './shim.js';
import { abortError, type WaitOptions } from './wait.js';

/** Why the pool boots a sandbox for itself. */
export type RefillReason = 'fill' | 'claimed' | 'expired' | 'failed';

/** What a pool reports: its hits, misses, boots and losses, with the sandbox's name and its shim's pid. */
export type PoolEvent =
  /** A boot for the pool started (the first fill, or replacing one claimed, expired or failed). */
  | { event: 'refill'; name: string; pid?: number; reason: RefillReason }
  /** A sandbox the pool booted is warm and waits in the pool; bootMs from its start. */
  | { event: 'warm'; name: string; pid?: number; bootMs: number }
  /** A claim took a warm sandbox; ageMs: how long it had been warm. */
  | { event: 'hit'; name: string; pid?: number; ageMs: number }
  /** A claim found none warm and booted one for itself; bootMs: its boot to warm. */
  | { event: 'miss'; name: string; pid?: number; bootMs: number }
  /** A warm sandbox stopped by itself at its maximum age (it is replaced: a refill follows); ageMs: how long it was warm. */
  | { event: 'expired'; name: string; pid?: number; ageMs: number; message?: string }
  /** A boot for the pool failed, or a warm sandbox ended otherwise (it is replaced, after a backoff when boots keep failing). */
  | { event: 'failed'; name: string; pid?: number; code: string; message: string; booting: boolean }
  /** close() stopped every sandbox the pool held. */
  | { event: 'closed'; stopped: number };

/** How to keep a pool. */
export interface PoolOptions {
  /**
   * The operator's start options of every sandbox (shim, provider, keepRoot,
   * env, args such as --sandbox-io and --install, timeouts). Not the
   * tenant's (bootstrap, identity, allow, upstreams, forwards, password):
   * those come with each claim. name is made per sandbox from namePrefix.
   */
  start: Omit<StartOptions, 'name' | 'bootstrap' | 'coreBootstrap' | 'identity' | 'allow' | 'upstreams' | 'forwards' | 'password' | 'kept' | 'outlive'>;
  /** How many warm sandboxes to keep (N). */
  size: number;
  /** At most this many boots at once, the pool's and the misses' (default 2). */
  maxBoots?: number;
  /** --warm-max-age: a sandbox warm that long stops by itself and is replaced (default: none). */
  maxAgeMs?: number;
  /** The sandboxes' names: PREFIX-RANDOM (default 'pool'). */
  namePrefix?: string;
  /** Receives the pool's events. */
  onEvent?: (e: PoolEvent) => void;
  /** How long close() lets each sandbox stop in order before it is killed (default 10 s). */
  graceMs?: number;
}

/** A claim: the tenant's part of a sandbox, as Shim.claim takes it. */
export type PoolClaim = Omit<Extract<Command, { cmd: 'claim' }>, 'id' | 'cmd'> & WaitOptions & {
  /** The daemon's password, for a bootstrap with credentials and no password of its own (default: made here). */
  password?: string;
};

/** What a claim resolves with: the sandbox, ready and now the caller's (stop it when done). */
export interface Claimed {
  sandbox: Sandbox;
  /** True when it was warm in the pool; false for a miss, booted for this claim. */
  hit: boolean;
  /** How long it had been warm (0 for a miss). */
  ageMs: number;
  /** The claim's answer: the attempt, the forwards bound, the policy in force. */
  claim: ClaimResult;
  /** Its ready state. */
  ready: ReadyEvent;
}

/** The pool's counts now. */
export interface PoolStats {
  warm: number;
  booting: number;
  hits: number;
  misses: number;
  /** How long each warm sandbox has been warm, oldest first. */
  agesMs: number[];
}

interface Entry {
  sandbox: Sandbox;
  started: number;
  /** When it reported warm. */
  warmAt?: number;
  /** Taken by a claim (or by close): the pool no longer counts it as warm. */
  taken: boolean;
}

const DEFAULT_GRACE_MS = 10_000;
const BACKOFF_MIN_MS = 500;
const BACKOFF_MAX_MS = 30_000;

/**
 * Keeps `size` warm sandboxes of one configuration. Claims take the oldest
 * still warm (a hit), or boot one when none is (a miss); each claimed,
 * expired or failed one is replaced in the background, never more than
 * maxBoots booting at once. close() stops what it holds and waits for
 * their shims to exit.
 */
export class SandboxPool {
  private readonly o: PoolOptions;
  private readonly maxBoots: number;
  /** Warm, oldest first. */
  private warm: Entry[] = [];
  /** Every sandbox the pool holds: booting, warm, or being claimed (not yet the caller's). */
  private readonly held = new Set<Entry>();
  /** Boots in flight (the pool's and the misses'), and the pool's own among them. */
  private boots = 0;
  private refilling = 0;
  /** The refills in flight: close() waits for them to give their boot slot back. */
  private readonly refills = new Set<Promise<void>>();
  /** Misses waiting for a boot slot: they go before the pool's refills. */
  private readonly slotWaiters: Array<() => void> = [];
  /** Why sandboxes are missing, in order: each refill says which it replaces. */
  private readonly reasons: RefillReason[] = [];
  private failures = 0;
  private backoff: NodeJS.Timeout | undefined;
  private closed = false;
  private closing: Promise<void> | undefined;
  private hits = 0;
  private misses = 0;

  constructor(o: PoolOptions) {
    if (!Number.isInteger(o.size) || o.size < 0) throw new TypeError('size is a whole number of sandboxes, 0 or more');
    const maxBoots = o.maxBoots ?? 2;
    if (!Number.isInteger(maxBoots) || maxBoots < 1) throw new TypeError('maxBoots is 1 or more');
    if (o.maxAgeMs !== undefined && !(o.maxAgeMs > 0)) throw new TypeError('maxAgeMs is more than 0');
    this.o = o;
    this.maxBoots = maxBoots;
    this.fill();
  }

  /** The pool's counts now. */
  stats(): PoolStats {
    const now = performance.now();
    return {
      warm: this.warm.length,
      booting: this.boots,
      hits: this.hits,
      misses: this.misses,
      agesMs: this.warm.map((e) => now - e.warmAt!),
    };
  }

  private emit(e: PoolEvent): void {
    try {
      this.o.onEvent?.(e);
    } catch {
      // A listener's error is its own: the pool goes on.
    }
  }

  /** Starts refills while the pool is short and a boot slot is free (misses first). */
  private fill(): void {
    while (!this.closed && !this.backoff && this.slotWaiters.length === 0 && this.boots < this.maxBoots && this.warm.length + this.refilling < this.o.size) {
      this.boots++;
      this.refilling++;
      const r = this.refill(this.reasons.shift() ?? 'fill');
      this.refills.add(r);
      void r.finally(() => this.refills.delete(r));
    }
  }

  private release(): void {
    this.boots--;
    const next = this.slotWaiters.shift();
    if (next) {
      this.boots++;
      next();
    } else this.fill();
  }

  /** A boot slot for a miss: at once when one is free, else the next one freed. */
  private async slot(o: WaitOptions): Promise<void> {
    if (this.boots < this.maxBoots) {
      this.boots++;
      return;
    }
    let granted!: () => void;
    const got = new Promise<void>((resolve) => (granted = resolve));
    this.slotWaiters.push(granted);
    const { signal } = o;
    if (!signal) return got;
    let onAbort = (): void => {};
    const aborted = new Promise<never>((_, reject) => {
      onAbort = () => {
        const i = this.slotWaiters.indexOf(granted);
        if (i >= 0) this.slotWaiters.splice(i, 1);
        else this.release(); // granted as it fired: hand the slot on
        reject(abortError(signal, 'claim'));
      };
      if (signal.aborted) onAbort();
      else signal.addEventListener('abort', onAbort, { once: true });
    });
    try {
      await Promise.race([got, aborted]);
    } finally {
      signal.removeEventListener('abort', onAbort);
    }
  }

  /** Starts one sandbox with --warm, held by the pool. */
  private startOne(): Entry {
    const base = this.o.start;
    const args = [...(base.args ?? []), '--warm'];
    if (this.o.maxAgeMs !== undefined) args.push('--warm-max-age', `${Math.ceil(this.o.maxAgeMs)}ms`);
    const name = `${this.o.namePrefix ?? 'pool'}-${randomBytes(4).toString('hex')}`;
    const e: Entry = { sandbox: Sandbox.start({ ...base, name, args }), started: performance.now(), taken: false };
    this.held.add(e);
    void e.sandbox.exited().catch(() => {}).finally(() => this.held.delete(e));
    return e;
  }

  /** Waits for a booting sandbox to be warm; on failure stops it and throws. */
  private async booted(e: Entry, o: WaitOptions): Promise<void> {
    try {
      await e.sandbox.waitFor('warm', o);
      e.warmAt = performance.now();
    } catch (err) {
      await this.discard(e);
      throw err;
    }
  }

  private async refill(reason: RefillReason): Promise<void> {
    let e: Entry | undefined;
    try {
      e = this.startOne();
      this.emit({ event: 'refill', name: e.sandbox.name, pid: e.sandbox.pid, reason });
      await this.booted(e, {});
      this.failures = 0;
      if (this.closed) return; // close() stops it
      this.warm.push(e);
      this.watch(e);
      this.emit({ event: 'warm', name: e.sandbox.name, pid: e.sandbox.pid, bootMs: e.warmAt! - e.started });
    } catch (err) {
      if (!this.closed) {
        const { code, message } = described(err);
        this.emit({ event: 'failed', name: e?.sandbox.name ?? '', pid: e?.sandbox.pid, code, message, booting: true });
        this.reasons.push('failed');
        this.failures++;
        // Boots that keep failing are retried later and later, not at once.
        const wait = Math.min(BACKOFF_MIN_MS * 2 ** (this.failures - 1), BACKOFF_MAX_MS);
        this.backoff ??= setTimeout(() => {
          this.backoff = undefined;
          this.fill();
        }, wait);
        this.backoff.unref();
      }
    } finally {
      this.refilling--;
      this.release();
    }
  }

  /** A warm sandbox that ends while the pool holds it (its maximum age, a failure) is dropped and replaced. */
  private watch(e: Entry): void {
    void e.sandbox.exited().catch(() => undefined).then((x) => {
      if (e.taken || this.closed) return;
      this.warm = this.warm.filter((w) => w !== e);
      const last = x?.last;
      const ageMs = performance.now() - e.warmAt!;
      const expired = e.sandbox.received.some((ev) => ev.event === 'warm_expired');
      if (last?.state === 'stopped' && expired) {
        this.emit({ event: 'expired', name: e.sandbox.name, pid: e.sandbox.pid, ageMs, ...(last.message ? { message: last.message } : {}) });
        this.reasons.push('expired');
      } else {
        const code = last?.state === 'failed' ? last.code : 'exited';
        this.emit({ event: 'failed', name: e.sandbox.name, pid: e.sandbox.pid, code, message: last?.message ?? `its shim exited with status ${x?.status ?? x?.signal}`, booting: false });
        this.reasons.push('failed');
      }
      this.fill();
    });
  }

  /** The oldest warm sandbox still warm and alive, taken out of the pool. */
  private takeWarm(): Entry | undefined {
    for (;;) {
      const e = this.warm.shift();
      if (!e) return undefined;
      e.taken = true;
      if (stateOf(e.sandbox) === 'warm') return e;
      // Leaving warm already (its exit is on its way): replaced here, as the watcher skips a taken one.
      this.reasons.push('failed');
      this.fill();
    }
  }

  /**
   * Claims a sandbox for a tenant: the oldest still warm (a hit), else one
   * booted for this claim (a miss, said in the result and an event). Sends
   * the claim (bootstrap, allow, upstreams, forwards, volumes; the password as
   * Shim.claim makes it), waits for ready and resolves with the sandbox,
   * now the caller's: the pool forgets it and boots another. A claim that
   * fails (the sandbox failed to become ready, the signal fired) stops
   * that sandbox and rejects; a claim refused for its input (a
   * CommandError coded invalid_argument, or a TypeError for a password
   * refused here) or for volumes its provider cannot mount (a
   * CommandError coded unsupported) leaves the warm sandbox in the pool. Claims in flight
   * when close() begins reject with an OacError coded closed.
   */
  async claim(c: PoolClaim): Promise<Claimed> {
    const { signal, timeoutMs, password, ...claim } = c;
    const bound = timeoutMs !== undefined ? AbortSignal.any([AbortSignal.timeout(timeoutMs), ...(signal ? [signal] : [])]) : signal;
    const o: WaitOptions = bound ? { signal: bound } : {};
    for (;;) {
      if (this.closed) throw new OacError('claim: the pool is closed', 'closed', false);
      if (bound?.aborted) throw abortError(bound, 'claim');
      const e = this.takeWarm();
      if (e) {
        const ageMs = performance.now() - e.warmAt!;
        let r: ClaimResult;
        try {
          r = await e.sandbox.claim(claim, { ...o, ...(password !== undefined ? { password } : {}) });
        } catch (err) {
          if ((err instanceof CommandError && (err.code === 'invalid_argument' || err.code === 'unsupported')) || err instanceof TypeError) {
            // Nothing of the claim reached it (refused by the shim for its input or for volumes its provider
            // cannot mount, which every sandbox of the pool would refuse, or a password refused here): still
            // warm, back in its place.
            e.taken = false;
            if (!this.closed && stateOf(e.sandbox) === 'warm') this.warm.unshift(e);
            else await this.replace(e, 'failed');
            throw err;
          }
          if ((err instanceof CommandError && err.code === 'conflict') || err instanceof ShimError) {
            // It left warm as it was claimed (its maximum age, a failure): the next one.
            await this.replace(e, 'failed');
            continue;
          }
          await this.replace(e, 'failed');
          throw err;
        }
        this.hits++;
        this.emit({ event: 'hit', name: e.sandbox.name, pid: e.sandbox.pid, ageMs });
        this.reasons.push('claimed');
        this.fill();
        return { sandbox: await this.untilReady(e, r, o), hit: true, ageMs, claim: r, ready: e.sandbox.ready! };
      }
      // None warm: a miss boots one for this claim, before the pool's refills.
      await this.slot(o);
      let m: Entry;
      try {
        if (this.closed) throw new OacError('claim: the pool is closed', 'closed', false);
        m = this.startOne();
        m.taken = true;
        await this.booted(m, o);
      } finally {
        this.release();
      }
      this.misses++;
      this.emit({ event: 'miss', name: m.sandbox.name, pid: m.sandbox.pid, bootMs: m.warmAt! - m.started });
      let r: ClaimResult;
      try {
        r = await m.sandbox.claim(claim, { ...o, ...(password !== undefined ? { password } : {}) });
      } catch (err) {
        await this.discard(m);
        throw err;
      }
      return { sandbox: await this.untilReady(m, r, o), hit: false, ageMs: 0, claim: r, ready: m.sandbox.ready! };
    }
  }

  /** Waits for a claimed sandbox to be ready and hands it over; on failure stops it and throws. */
  private async untilReady(e: Entry, r: ClaimResult, o: WaitOptions): Promise<Sandbox> {
    try {
      await e.sandbox.waitFor('ready', { ...o, attempt: r.attempt });
    } catch (err) {
      await this.discard(e);
      if (this.closed) throw new OacError('claim: the pool was closed', 'closed', false, { cause: err });
      throw err;
    }
    if (this.closed) {
      // close() stops what the pool still holds: this one was not handed over.
      await this.discard(e);
      throw new OacError('claim: the pool was closed', 'closed', false);
    }
    this.held.delete(e);
    return e.sandbox;
  }

  /** Stops a sandbox taken out of the pool that is of no use, and boots another. */
  private async replace(e: Entry, reason: RefillReason): Promise<void> {
    await this.discard(e);
    this.reasons.push(reason);
    this.fill();
  }

  /** Stops a sandbox in order (killed after graceMs) and waits for its shim to exit. */
  private async discard(e: Entry): Promise<void> {
    e.taken = true;
    this.warm = this.warm.filter((w) => w !== e);
    await e.sandbox.stop({ timeoutMs: this.o.graceMs ?? DEFAULT_GRACE_MS }).catch(() => e.sandbox.kill());
    await e.sandbox.exited().catch(() => {});
    this.held.delete(e);
  }

  /**
   * Stops every sandbox the pool holds (warm, booting, or being claimed:
   * not the ones handed to callers) and waits for their shims to exit.
   * Claims after it, and claims in flight, reject with code closed.
   */
  close(): Promise<void> {
    this.closing ??= (async () => {
      this.closed = true;
      clearTimeout(this.backoff);
      this.backoff = undefined;
      for (const w of this.slotWaiters.splice(0)) {
        this.boots++; // released by the claim, which sees closed
        w();
      }
      let stopped = 0;
      // Until nothing is held: a boot started as close began is held too;
      // and until every refill has given its boot slot back.
      while (this.held.size > 0 || this.refills.size > 0) {
        const now = [...this.held];
        stopped += now.length;
        await Promise.all(now.map((e) => this.discard(e)));
        await Promise.allSettled([...this.refills]);
      }
      this.warm = [];
      this.emit({ event: 'closed', stopped });
    })();
    return this.closing;
  }
}

/** A sandbox's last state, as its events said. */
function stateOf(s: Sandbox): string | undefined {
  const r = s.received;
  for (let i = r.length - 1; i >= 0; i--) {
    const v = r[i]!;
    if (v.event === 'state') return v.state;
  }
  return undefined;
}

function described(err: unknown): { code: string; message: string } {
  if (err instanceof OacError) return { code: err.code, message: err.message };
  return { code: 'error', message: String(err) };
}

// One oac-shim process and the sandbox it runs (or attaches to): its
// events, kept in a bounded history; its control commands and their
// answers, matched by id; its password, made here and handed over on
// stdin; its end. Only stdio 0-2 are used, so it works the same on Linux,
// macOS and Windows.
import { spawn, type ChildProcess } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { isAbsolute, resolve } from 'node:path';
import { createInterface } from 'node:readline';

import { findBinary, launchError } from './binary.js';
import { AbortError, HistoryError, OacError, SchemaVersionError, ShimError, CommandError, TimeoutError } from './errors.js';
import type { AnswerCode } from './errors.js';
import { SCHEMA_VERSION } from './generated/codes.js';
import type {
  Answer,
  ClaimResult,
  ErrorAnswer,
  Event as AnyLine,
  ForwardResult,
  PolicyResult,
  ReadyEvent,
  StartingEvent,
  FailedEvent,
  StartResult,
  StatusResult,
  StoppedEvent,
  TimeResult,
  WarmEvent,
} from './generated/event.js';
import type { Command } from './generated/command.js';
import type { Bootstrap } from './generated/bootstrap.js';
import type { CoreBootstrap } from './generated/core-bootstrap.js';
import { DEFAULT_HISTORY_SIZE, Ring } from './history.js';
import { abortError, bounded, type WaitOptions } from './wait.js';

export type { AnswerCode };

/** The name of a control command. */
export type CommandName = Command['cmd'];

/** An event: any line of oac-shim's output but an answer. */
export type Event = Exclude<AnyLine, Answer>;
/**
 * A state event of each state. warm (oac-shim run --warm) is a sandbox
 * booted for nobody, waiting for claim(): waitFor('ready') waits on
 * through it, as through starting.
 */
export type StateEvent = StartingEvent | WarmEvent | ReadyEvent | FailedEvent | StoppedEvent;
export type State = StateEvent['state'];
type StateEventOf<S extends State> = Extract<StateEvent, { state: S }>;

/** The result each command answers with. */
export interface ResultOf {
  status: StatusResult;
  stop: StatusResult;
  start: StartResult;
  reset: StartResult;
  set_policy: PolicyResult;
  add_forward: ForwardResult;
  remove_forward: Record<string, never>;
  push_time: TimeResult;
  claim: ClaimResult;
}
type CommandOf<C extends CommandName> = Omit<Extract<Command, { cmd: C }>, 'id'>;

/** The sandbox's own identity: a hosted sandbox (--tenant, --environment, --allocation). */
export interface Identity {
  tenant: string;
  environment: string;
  allocation: string;
  /** Accept ws:// or wss:// on a loopback host (development). */
  allowLoopbackLink?: boolean;
}

/** Where events start: the oldest kept (default), only new ones, or the first whose seq is at least this. */
export type From = 'start' | 'now' | number;

/** What every oac-shim process of this client shares. */
export interface ProcessOptions {
  /** The oac-shim binary (default: OAC_SHIM, then bin/oac-shim beside this package, then PATH). */
  shim?: string;
  /** --keep-root: where running sandboxes are registered (default: the shim's). */
  keepRoot?: string;
  /** The shim's environment, and where OAC_SHIM is looked up (default: this process's). */
  env?: NodeJS.ProcessEnv;
  /** Receives the shim's diagnostics (stderr), line by line. */
  onStderr?: (line: string) => void;
  /** How many events are kept for events(), waitForEvent() and received (default DEFAULT_HISTORY_SIZE, 1024). */
  historySize?: number;
  /** Receives every event as it arrives (the progress of a create, before it resolves). */
  onEvent?: (e: Event) => void;
}

/** How to start oac-shim. */
export interface StartOptions extends ProcessOptions {
  /** The sandbox's name (--name). */
  name: string;
  /** --provider (default bwrap); not with kept, whose provider was fixed at create. */
  provider?: string;
  /**
   * Start the kept sandbox of this name (`oac-shim start`, created with
   * createKept) instead of a throwaway one (`oac-shim run`): what it
   * writes in /home, /environment and /usr/local outlives this shim.
   * keepRoot is --keep-root (default: the shim's).
   */
  kept?: { keepRoot?: string };
  /** The bootstrap, handed over on standard input (--bootstrap -): it touches no disk. */
  bootstrap?: Bootstrap;
  /** Core's sandbox.Bootstrap instead, on standard input (--bootstrap-format core). */
  coreBootstrap?: CoreBootstrap;
  /**
   * The daemon's password, handed over as the first line of stdin
   * (--password-stdin) before the bootstrap; with a bootstrap that has
   * credentials only. Default: 32 random bytes, base64url, made
   * here. password() returns it; it is never in argv, environment, a file
   * or an event. The same for every attempt.
   */
  password?: string;
  /**
   * The sandbox outlives this process: when it exits or is killed, the
   * sandbox keeps running, and attach(name) reaches its events and control
   * again. Stop it with stop() (or stopNamed) when done.
   */
  outlive?: boolean;
  identity?: Identity;
  /** --forward LISTEN=GUESTPORT, e.g. "127.0.0.1:0=4096". */
  forwards?: string[];
  /** Egress rules (--allow) and named upstreams (--upstream NAME:PORT=ADDR). */
  allow?: string[];
  upstreams?: string[];
  /** --boot-timeout and --timeout, in milliseconds. */
  bootTimeoutMs?: number;
  timeoutMs?: number;
  /** More flags of `oac-shim run`. */
  args?: string[];
}

/** How to attach to a running sandbox that outlives its parent. */
export interface AttachOptions extends ProcessOptions, WaitOptions {
  /** The first event: every one the sandbox still journals ('start', default), only new ones ('now'), or from this seq on (--from). */
  from?: From;
  /** The daemon's password, as its creator made it (an attach cannot learn it). */
  password?: string;
}

/** How a shim ended. */
export interface Exit {
  /** The exit status (0 after a clean stop; docs/schema.md lists the others), or null when a signal ended it. */
  status: number | null;
  signal: NodeJS.Signals | null;
  /** The last state event. */
  last?: StateEvent;
}

interface Pending {
  command: CommandName;
  resolve: (a: Answer) => void;
  reject: (e: Error) => void;
}

/** The flag of `oac-shim run|start` for a sandbox that outlives its parent. */
export const OUTLIVE_FLAG = '--outlive-parent';

/** How many state events are kept for waitFor (each attempt has a few). */
const STATE_HISTORY = 64;

/** How many lines of the shim's stderr are kept for error messages. */
const STDERR_TAIL = 8;

/** oac-shim attach's exit statuses of its own (docs/events-and-control.md#oac-shim-attach). */
const ATTACH_NOT_RUNNING = 10;
const ATTACH_SHIM_DIED = 11;

/** How long a sandbox that failed to become ready gets to stop in order before it is killed. */
const CLEANUP_GRACE_MS = 10_000;

/** The seq of an event, when the shim numbers them. */
function seqOf(e: Event): number | undefined {
  const s = (e as { seq?: unknown }).seq;
  return typeof s === 'number' ? s : undefined;
}

/** What to spawn: the binary, its arguments, the lines stdin starts with. */
interface Spec {
  name: string;
  path: string;
  args: string[];
  prelude: string[];
  password?: string;
  /** A session of its own (POSIX): a terminal's Ctrl-C to this process's group does not reach a sandbox that outlives it. */
  detached?: boolean;
  o: ProcessOptions;
}

function runSpec(opts: StartOptions): Spec {
  const path = findBinary('oac-shim', opts.shim, opts.env);
  if (opts.bootstrap && opts.coreBootstrap) throw new TypeError('give bootstrap or coreBootstrap, not both');
  const input = opts.bootstrap ?? opts.coreBootstrap;
  // A bootstrap with credentials gets the daemon's password: its own, or
  // one this client makes and hands in first on stdin (--password-stdin).
  // Without credentials the daemon has no password.
  const rt = opts.coreBootstrap?.runtime;
  const credentials = !!opts.bootstrap?.credentials || !!(rt && (rt.username || rt.password || rt.username_env || rt.password_env));
  const own = opts.bootstrap?.credentials?.password || opts.coreBootstrap?.runtime?.password || undefined;
  if (own !== undefined && opts.password !== undefined) throw new TypeError('give the password option or a bootstrap password, not both');
  if (!credentials && opts.password !== undefined) throw new TypeError('the password option needs a bootstrap with credentials (username_env, password_env)');
  const password = own ?? (credentials ? (opts.password ?? randomBytes(32).toString('base64url')) : undefined);
  if (own === undefined && password !== undefined && !/^[\x21-\x7e]{16,1024}$/.test(password)) {
    throw new TypeError('the password is 16 to 1024 printable ASCII characters without spaces (the rule of --password-stdin)');
  }
  const args = [opts.kept ? 'start' : 'run', '--name', opts.name, '--control', 'stdin'];
  if (password !== undefined && own === undefined) args.push('--password-stdin');
  if (opts.kept && opts.provider) throw new TypeError('a kept sandbox has its provider from createKept');
  const keepRoot = opts.kept?.keepRoot ?? opts.keepRoot;
  if (keepRoot) args.push('--keep-root', keepRoot);
  if (opts.provider) args.push('--provider', opts.provider);
  if (opts.outlive) args.push(OUTLIVE_FLAG);
  if (input) args.push('--bootstrap', '-');
  if (opts.coreBootstrap) args.push('--bootstrap-format', 'core');
  if (opts.identity) {
    const id = opts.identity;
    args.push('--tenant', id.tenant, '--environment', id.environment, '--allocation', id.allocation);
    if (id.allowLoopbackLink) args.push('--allow-loopback-link');
  }
  for (const f of opts.forwards ?? []) args.push('--forward', f);
  for (const a of opts.allow ?? []) args.push('--allow', a);
  for (const u of opts.upstreams ?? []) args.push('--upstream', u);
  if (opts.bootTimeoutMs !== undefined) args.push('--boot-timeout', `${opts.bootTimeoutMs}ms`);
  if (opts.timeoutMs !== undefined) args.push('--timeout', `${opts.timeoutMs}ms`);
  args.push(...(opts.args ?? []));
  // The password first, then the bootstrap, then commands: the order the shim reads them in.
  const prelude: string[] = [];
  if (password !== undefined && own === undefined) prelude.push(password);
  if (input) prelude.push(JSON.stringify(input));
  return { name: opts.name, path, args, prelude, ...(password !== undefined ? { password } : {}), detached: !!opts.outlive && process.platform !== 'win32', o: opts };
}

function attachSpec(name: string, o: AttachOptions): Spec {
  const path = findBinary('oac-shim', o.shim, o.env);
  const args = ['attach', name];
  // Default: from the oldest line the journal keeps.
  if (o.from !== undefined && o.from !== 'start') args.push('--from', String(o.from));
  if (o.keepRoot) args.push('--keep-root', o.keepRoot);
  return { name, path, args, prelude: [], ...(o.password !== undefined ? { password: o.password } : {}), o };
}

/** One running oac-shim: `run`, `start`, or `attach` to a sandbox another one runs. */
export class Shim {
  readonly name: string;
  /** The oac-shim binary this runs. */
  readonly path: string;
  private readonly child: ChildProcess;
  private readonly history: Ring<Event>;
  private readonly states = new Ring<StateEvent>(STATE_HISTORY);
  private ended = false;
  /** Why the shim cannot be used, when it is for a reason of its own: it could not be started, or speaks another schema. */
  private broken: OacError | undefined;
  private checked = false;
  private readonly pending = new Map<string, Pending>();
  private nextId = 0;
  private pw: string | undefined;
  private readonly exitPromise: Promise<Exit>;
  private readonly onEvent: ((e: Event) => void) | undefined;
  /** The shim's last lines of diagnostics, for the errors that have no event to say why. */
  private readonly stderrTail = new Ring<string>(STDERR_TAIL);

  /** Starts `oac-shim run --name NAME --control stdin --password-stdin ...` (`oac-shim start` with opts.kept). Does not wait: see Sandbox.create. */
  static start(opts: StartOptions): Shim {
    return new Shim(runSpec(opts));
  }

  protected constructor(spec: Spec) {
    this.name = spec.name;
    this.path = spec.path;
    this.pw = spec.password;
    this.onEvent = spec.o.onEvent;
    this.history = new Ring<Event>(spec.o.historySize ?? DEFAULT_HISTORY_SIZE);
    this.child = spawn(spec.path, spec.args, {
      env: spec.o.env ?? process.env,
      stdio: ['pipe', 'pipe', 'pipe'],
      windowsHide: true,
      detached: spec.detached ?? false,
    });
    // A shim that is gone makes writes fail with EPIPE: its exit says why.
    this.child.stdin!.on('error', () => {});
    for (const l of spec.prelude) this.child.stdin!.write(l + '\n');

    const closed = new Promise<void>((resolve) => {
      const lines = createInterface({ input: this.child.stdout!, crlfDelay: Infinity });
      lines.on('line', (l) => this.onLine(l));
      lines.on('close', resolve);
    });
    const stderr = createInterface({ input: this.child.stderr!, crlfDelay: Infinity });
    const onStderr = spec.o.onStderr;
    stderr.on('line', (l) => {
      this.stderrTail.push(l);
      onStderr?.(l);
    });

    const exited = new Promise<{ status: number | null; signal: NodeJS.Signals | null }>((resolve, reject) => {
      this.child.on('error', (err) => {
        // Only a launch error rejects: a failed kill of a process that is gone does not.
        if (this.child.pid === undefined) reject(launchError('oac-shim', spec.path, err));
      });
      this.child.on('exit', (status, signal) => resolve({ status, signal }));
    });
    this.exitPromise = Promise.all([exited, closed]).then(([x]) => {
      this.end();
      return { ...x, last: this.lastState() };
    });
    this.exitPromise.catch((e: unknown) => {
      this.broken ??= e instanceof OacError ? e : new OacError(String(e), 'launch_failed', false, { cause: e });
      this.end();
    });
  }

  private end(): void {
    this.ended = true;
    for (const [, p] of this.pending) p.reject(this.exitedError(`${p.command}: oac-shim has exited`));
    this.pending.clear();
    this.history.notify();
    this.states.notify();
  }

  /** The shim's pid (of the attach process, for an attached sandbox). */
  get pid(): number | undefined {
    return this.child.pid;
  }

  private onLine(line: string): void {
    let v: AnyLine;
    try {
      v = JSON.parse(line) as AnyLine;
    } catch {
      return; // not a line of the schema: ignored
    }
    if (typeof v !== 'object' || v === null) return;
    if (!this.checked) {
      // The first line says which schema the shim speaks: another one's
      // lines would be misread, so nothing of it is used.
      this.checked = true;
      if (v.schema_version !== SCHEMA_VERSION) {
        this.broken = new SchemaVersionError(this.path, v.schema_version);
        this.child.kill('SIGKILL');
        this.history.notify();
        return;
      }
    }
    if (this.broken) return;
    if (v.event === 'answer') {
      const p = v.id === undefined ? undefined : this.pending.get(v.id);
      if (p && v.id !== undefined) {
        this.pending.delete(v.id);
        p.resolve(v);
      }
      return;
    }
    if (v.event === 'state') this.states.push(v);
    this.history.push(v);
    this.onEvent?.(v);
  }

  private lastState(): StateEvent | undefined {
    return this.states.items().at(-1);
  }

  private exitedError(message: string, status?: number | null): OacError {
    if (this.broken) return this.broken;
    const last = this.lastState();
    if (last?.state === 'failed') return new ShimError(`${message}: ${last.message ?? last.code}`, last.code, last, status);
    const said = this.stderrTail.items().at(-1);
    return new ShimError(said ? `${message}: ${said}` : message, 'exited', undefined, status);
  }

  /** What the shim last said on stderr. */
  protected get lastDiagnostic(): string | undefined {
    return this.stderrTail.items().at(-1);
  }

  /** The last ready state kept. */
  protected lastReady(): ReadyEvent | undefined {
    const s = this.states.items();
    for (let i = s.length - 1; i >= 0; i--) if (s[i]!.state === 'ready') return s[i] as ReadyEvent;
    return undefined;
  }

  /** Rejects as soon as the signal fires (never resolves). */
  private aborted(signal: AbortSignal | undefined, what: string): { p: Promise<never>; done: () => void } {
    if (!signal) return { p: new Promise<never>(() => {}), done: () => {} };
    let onAbort = (): void => {};
    const p = new Promise<never>((_, reject) => {
      onAbort = () => reject(abortError(signal, what));
      if (signal.aborted) onAbort();
      else signal.addEventListener('abort', onAbort, { once: true });
    });
    p.catch(() => {});
    return { p, done: () => signal.removeEventListener('abort', onAbort) };
  }

  /**
   * The events, in order, from `from` on, then each new one until the
   * shim's output ends. `from`: 'start' (default) every event still kept
   * (the last historySize), 'now' only new ones, a number the first kept
   * event whose seq is at least it. Each call iterates on its own. An
   * iterator asked for (or falling behind to) events no longer kept ends
   * with a HistoryError; the signal ends it with an AbortError.
   */
  async *events(o: { from?: From; signal?: AbortSignal } = {}): AsyncGenerator<Event, void, undefined> {
    const from = o.from ?? 'start';
    let i = this.history.oldest;
    if (from === 'now') i = this.history.next;
    else if (typeof from === 'number') {
      const kept = this.history.items();
      const first = kept[0] && seqOf(kept[0]);
      if (this.history.oldest > 0 && first !== undefined && first > from) {
        throw new HistoryError(`events from seq ${from}: the oldest kept is seq ${first} (the last ${this.history.size} are kept: raise historySize)`);
      }
      const k = kept.findIndex((e) => (seqOf(e) ?? -1) >= from);
      i = k < 0 ? this.history.next : this.history.oldest + k;
    }
    const abort = this.aborted(o.signal, 'events');
    try {
      for (;;) {
        while (i < this.history.next) {
          if (i < this.history.oldest) {
            throw new HistoryError(`events: this iterator fell ${this.history.oldest - i} events behind the kept history (the last ${this.history.size}): read faster or raise historySize`);
          }
          yield this.history.at(i++)!;
        }
        if (this.ended || this.broken) {
          if (this.broken) throw this.broken;
          return;
        }
        await Promise.race([this.history.changed(), abort.p]);
      }
    } finally {
      abort.done();
    }
  }

  /** The events kept so far (the last historySize), oldest first. */
  get received(): readonly Event[] {
    return this.history.items();
  }

  /** The first kept or new event that matches pred. Rejects when the shim exits first, on timeout, or when the signal fires. */
  async waitForEvent<E extends Event>(pred: (e: Event) => e is E, opts?: WaitOptions): Promise<E>;
  async waitForEvent(pred: (e: Event) => boolean, opts?: WaitOptions): Promise<Event>;
  async waitForEvent(pred: (e: Event) => boolean, opts: WaitOptions = {}): Promise<Event> {
    return bounded('an event', opts, async () => {
      let i = this.history.oldest;
      for (;;) {
        i = Math.max(i, this.history.oldest); // what is no longer kept cannot match
        while (i < this.history.next) {
          const e = this.history.at(i++)!;
          if (pred(e)) return e;
        }
        if (this.ended || this.broken) throw this.exitedError('oac-shim exited before the event');
        await this.history.changed();
      }
    });
  }

  /**
   * Waits for a state event (of attempt, when given), among the last ones
   * and the new ones. A failed state that was not asked for rejects with a
   * ShimError carrying its code.
   */
  async waitFor<S extends State>(state: S, opts: WaitOptions & { attempt?: number } = {}): Promise<StateEventOf<S>> {
    return bounded(`state ${state}`, opts, async () => {
      let i = this.states.oldest;
      for (;;) {
        i = Math.max(i, this.states.oldest);
        while (i < this.states.next) {
          const e = this.states.at(i++)!;
          if (opts.attempt !== undefined && e.attempt !== undefined && e.attempt !== opts.attempt) continue;
          if (e.state === state) return e as StateEventOf<S>;
          if (e.state === 'failed') throw new ShimError(`sandbox failed: ${e.message ?? e.code}`, e.code, e);
        }
        if (this.ended || this.broken) throw this.exitedError(`oac-shim exited before state ${state}`);
        await this.states.changed();
      }
    });
  }

  /**
   * Sends one command and resolves with its typed result; a refusal
   * rejects with a CommandError. The signal or timeout ends the wait for
   * the answer (the shim may still carry the command out).
   */
  async command<C extends CommandName>(cmd: C, args?: Omit<CommandOf<C>, 'cmd'>, opts: WaitOptions = {}): Promise<ResultOf[C]> {
    if (this.ended || this.broken) throw this.exitedError(`${cmd}: oac-shim has exited`);
    if (opts.signal?.aborted) throw abortError(opts.signal, cmd);
    const id = `c${++this.nextId}`;
    const answer = new Promise<Answer>((resolve, reject) => this.pending.set(id, { command: cmd, resolve, reject }));
    this.child.stdin!.write(JSON.stringify({ id, cmd, ...args }) + '\n');
    const a = await bounded(cmd, opts, () => answer, () => this.pending.delete(id));
    if (!a.ok) throw new CommandError(`${cmd}: ${a.error}`, cmd, a as ErrorAnswer);
    return (a as Extract<Answer, { ok: true }>).result as ResultOf[C];
  }

  status(opts?: WaitOptions): Promise<StatusResult> {
    return this.command('status', undefined, opts);
  }
  addForward(listen: string, guestPort: number, opts?: WaitOptions): Promise<ForwardResult> {
    return this.command('add_forward', { listen, guest_port: guestPort }, opts);
  }
  removeForward(listen: string, opts?: WaitOptions): Promise<Record<string, never>> {
    return this.command('remove_forward', { listen }, opts);
  }
  setPolicy(allow: string[], upstreams: string[] = [], opts?: WaitOptions): Promise<PolicyResult> {
    return this.command('set_policy', { allow, upstreams }, opts);
  }
  /** A new attempt (aborts the one in flight); resolves with its number. */
  async restart(opts?: WaitOptions): Promise<number> {
    return (await this.command('start', undefined, opts)).attempt;
  }
  pushTime(opts?: WaitOptions): Promise<TimeResult> {
    return this.command('push_time', undefined, opts);
  }
  /**
   * Makes a warm sandbox (started with args ['--warm'], waiting in state
   * warm) the tenant's: its egress policy set (allow, upstreams, as
   * setPolicy), its forwards opened (each as addForward), its bootstrap
   * sent. Resolves with the attempt it runs as, the forwards bound and
   * the policy in force; its state then goes starting, then ready
   * (waitFor('ready', { attempt })). Bad input rejects with a
   * CommandError coded invalid_argument and the sandbox stays warm; a
   * sandbox that is not warm rejects it with conflict.
   *
   * volumes (at most one for /home, one for /environment) mount each
   * host directory at its guest directory before the bootstrap reaches
   * the guest, as oac-shim run --volume binds them; a relative host
   * directory is made absolute against this process's working directory
   * (the shim may run in another). Only providers that share the host's
   * kernel, under a root shim, can: the others reject the claim with
   * unsupported and the sandbox stays warm.
   *
   * A bootstrap with credentials gets the daemon's password as at
   * create: its own credentials.password, else opts.password, else 32
   * random bytes made here; it travels inside the claim on stdin (never
   * argv, environment, a file or an event) and password() returns it.
   */
  async claim(claim: Omit<CommandOf<'claim'>, 'cmd'>, opts: WaitOptions & { password?: string } = {}): Promise<ClaimResult> {
    const { password: given, ...wait } = opts;
    const cred = claim.bootstrap.credentials;
    const own = cred?.password || undefined;
    if (own !== undefined && given !== undefined) throw new TypeError('give the password option or a bootstrap password, not both');
    if (!cred && given !== undefined) throw new TypeError('the password option needs a bootstrap with credentials (username_env, password_env)');
    const password = own ?? (cred ? (given ?? randomBytes(32).toString('base64url')) : undefined);
    if (own === undefined && password !== undefined && !/^[\x21-\x7e]{16,1024}$/.test(password)) {
      throw new TypeError('the password is 16 to 1024 printable ASCII characters without spaces (the rule of the bootstrap\'s credentials.password)');
    }
    // The generated type of credentials.password (an anyOf of lengths) reads as an object; it is a string.
    let sent = (cred && own === undefined ? { ...claim, bootstrap: { ...claim.bootstrap, credentials: { ...cred, password } } } : claim) as Omit<CommandOf<'claim'>, 'cmd'>;
    if (claim.volumes !== undefined) {
      // An empty host directory is left for the shim to refuse (invalid_argument).
      const volumes = claim.volumes.map((v) => (v.host === '' || isAbsolute(v.host) ? v : { ...v, host: resolve(v.host) }));
      sent = { ...sent, volumes: volumes as typeof claim.volumes };
    }
    const r = await this.command('claim', sent, wait);
    if (password !== undefined) this.pw = password;
    return r;
  }

  /**
   * The daemon's password: made by this client (or given as the password
   * option) and handed to the shim on stdin, so it is never on disk, in
   * argv or in an event. The same for every attempt.
   */
  async password(): Promise<string> {
    if (this.pw === undefined) throw new OacError(`${this.name}: no password: a bootstrap without credentials gives the daemon none, and an attached sandbox knows only what its creator gave (the password option of attach)`, 'no_password', false);
    return this.pw;
  }

  /** Resolves when the shim has exited (it rejects only when it could not be started: a LaunchError). */
  exited(): Promise<Exit> {
    return this.exitPromise;
  }

  /**
   * Stops the sandbox in order and waits for the shim to exit. Resolves
   * after a clean stop; rejects with a ShimError (and the code) when it
   * failed. When the signal fires or the timeout passes first, the shim is
   * killed and waited for, and the call rejects with an AbortError or a
   * TimeoutError. On an attached sandbox, the attach process is what is
   * killed then: the sandbox may still be stopping.
   */
  async stop(opts: WaitOptions = {}): Promise<Exit> {
    let x: Exit;
    try {
      x = await bounded(
        'stop',
        opts,
        async () => {
          if (!this.ended && !this.broken) {
            await this.command('stop').catch((e: unknown) => {
              // Exited already, or stopping already: the exit says how it ended.
              if (!(e instanceof ShimError) && !(e instanceof CommandError && e.code === 'stopping')) throw e;
            });
          }
          return this.exitPromise;
        },
        () => this.child.kill('SIGKILL'),
      );
    } catch (e) {
      await this.exitPromise.catch(() => {});
      throw e;
    }
    if (x.status !== 0) throw this.exitedError(`oac-shim exited with status ${x.status ?? x.signal}`, x.status);
    return x;
  }

  /** Kills the shim at once (its runtime dies with it) and waits for it. On an attached sandbox it ends the attach only. */
  async kill(): Promise<Exit> {
    if (!this.ended) this.child.kill('SIGKILL');
    return this.exitPromise.catch(() => ({ status: null, signal: null }));
  }

  /**
   * Gives up on a sandbox that is not wanted (a create that failed or was
   * aborted): stops it in order, kills it when that takes longer than
   * graceMs, and waits for the shim to exit. Never rejects.
   */
  protected async discard(graceMs = CLEANUP_GRACE_MS): Promise<void> {
    if (this.ended) {
      await this.exitPromise.catch(() => {});
      return;
    }
    await this.stop({ timeoutMs: graceMs }).catch(() => {});
  }
}

/**
 * A sandbox, in the shape of the E2B SDK: `Sandbox.create(opts, { signal })`
 * resolves once it is ready (or rejects, leaving nothing running),
 * `Sandbox.attach(name)` reaches one that outlives its parent, and the
 * instance is a Shim (events, commands, password, stop, kill).
 */
export class Sandbox extends Shim {
  private readyEvent: ReadyEvent | undefined;

  /** Starts a sandbox without waiting (Shim.start), as a Sandbox: what a pool boots warm and claims. */
  static override start(opts: StartOptions): Sandbox {
    return new Sandbox(runSpec(opts));
  }

  /**
   * Starts a sandbox and resolves when it is ready. It rejects with a
   * typed error (a LaunchError for a binary that cannot be started, a
   * ShimError with the failure code, a SchemaVersionError, an AbortError
   * or a TimeoutError), after the shim is stopped and has exited: nothing
   * is left running.
   */
  static async create(opts: StartOptions, o: WaitOptions = {}): Promise<Sandbox> {
    const s = new Sandbox(runSpec(opts));
    try {
      s.readyEvent = await s.waitFor('ready', o);
      return s;
    } catch (e) {
      await s.discard();
      throw e;
    }
  }

  /**
   * Attaches to a running sandbox that outlives its parent (created with
   * outlive: true), by name, through `oac-shim attach`: its events from
   * `from` on (replayed from its journal; an events_lost event says what
   * it no longer has), then the live ones, and its control (commands,
   * stop). Resolves once a status command was answered through it;
   * rejects with an OacError coded not_running when no such sandbox runs
   * (or it does not outlive its parent), shim_died when its shim died.
   */
  static async attach(name: string, o: AttachOptions = {}): Promise<Sandbox> {
    const s = new Sandbox(attachSpec(name, o));
    try {
      // A status answered through the attach: the sandbox runs and its control is reached.
      await s.status(o);
      return s;
    } catch (e) {
      await s.kill();
      const x = await s.exited().catch(() => undefined);
      // The caller's abort or timeout is the answer, even when the attach
      // had exited on its own by the time it was killed.
      if (e instanceof AbortError || e instanceof TimeoutError) throw e;
      if (x?.status === ATTACH_NOT_RUNNING) {
        throw new OacError(`attach ${name}: ${s.lastDiagnostic ?? 'no sandbox of that name outlives its parent under the keep root'}`, 'not_running', false, { cause: e });
      }
      if (x?.status === ATTACH_SHIM_DIED) {
        throw new OacError(`attach ${name}: ${s.lastDiagnostic ?? 'its shim died before its final state'}`, 'shim_died', false, { cause: e });
      }
      throw e;
    }
  }

  /** The ready event create resolved on, or the last one an attach has seen. */
  get ready(): ReadyEvent | undefined {
    return this.readyEvent ?? this.lastReady();
  }

  /** The daemon's URL on this host (the forward's, or the guest's). */
  get url(): string | undefined {
    return this.ready?.url;
  }

  /** The daemon's Basic auth user. */
  get username(): string | undefined {
    return this.ready?.username;
  }
}

/** Attaches to a running sandbox that outlives its parent: Sandbox.attach. */
export function attach(name: string, o: AttachOptions = {}): Promise<Sandbox> {
  return Sandbox.attach(name, o);
}

import { execFile, spawn, type ChildProcess } from 'node:child_process';
import { createInterface } from 'node:readline';
import type { Readable } from 'node:stream';

import type {
  Answer,
  ErrorAnswer,
  Event as AnyLine,
  FailedEvent,
  FailureCode,
  ForwardResult,
  PolicyResult,
  ReadyEvent,
  StartingEvent,
  StartResult,
  StatusResult,
  StoppedEvent,
  TimeResult,
} from './generated/event.js';
import type { Command } from './generated/command.js';

/** Why a command was refused or failed: the error answer's code (docs/schema.md#answer-codes). */
export type AnswerCode = ErrorAnswer['code'];

/** The name of a control command. */
export type CommandName = Command['cmd'];
import type { Bootstrap } from './generated/bootstrap.js';
import type { CoreBootstrap } from './generated/core-bootstrap.js';
import type { ListReport } from './generated/list.js';
import type { RunningReport } from './generated/running.js';
import type { StopReport } from './generated/stop.js';

/** An event: any line of oac-shim's output but an answer. */
export type Event = Exclude<AnyLine, Answer>;
/** A state event of each state. */
export type StateEvent = StartingEvent | ReadyEvent | FailedEvent | StoppedEvent;
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

/** How to start oac-shim. */
export interface StartOptions {
  /** The oac-shim binary (default "oac-shim", found in PATH). */
  shim?: string;
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
  /** The shim's environment (default: this process's). */
  env?: NodeJS.ProcessEnv;
  /** Receives the shim's diagnostics (stderr), line by line. */
  onStderr?: (line: string) => void;
}

/** Why a sandbox failed or a shim ended: code is the failed event's (docs/schema.md), or "exited" when the shim ended without one. */
export class ShimError extends Error {
  override readonly name = 'ShimError';
  constructor(
    message: string,
    readonly code: FailureCode | 'exited',
    /** The failed event, when there was one. */
    readonly event?: FailedEvent,
    /** The shim's exit status, when it has exited. */
    readonly exitStatus?: number | null,
  ) {
    super(message);
  }
}

/** A control command the shim refused or could not carry out: branch on code (docs/schema.md#answer-codes), never on the message. */
export class CommandError extends Error {
  override readonly name = 'CommandError';
  /** The answer's code. */
  readonly code: AnswerCode;
  constructor(
    message: string,
    readonly command: CommandName,
    readonly answer: ErrorAnswer,
  ) {
    super(message);
    this.code = answer.code;
  }
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

/** PASSWORD_FD is the descriptor the shim writes each attempt's password to. */
const PASSWORD_FD = 3;

/** One running oac-shim. */
export class Shim {
  readonly name: string;
  private readonly child: ChildProcess;
  private readonly all: Event[] = [];
  private wake: () => void = () => {};
  private woken: Promise<void>;
  private ended = false;
  private readonly pending = new Map<string, Pending>();
  private nextId = 0;
  private readonly passwords = new Map<number, string>();
  private readonly exitPromise: Promise<Exit>;

  /** Starts `oac-shim run --name NAME --control stdin ...` (`oac-shim start` with opts.kept). */
  static start(opts: StartOptions): Shim {
    return new Shim(opts);
  }

  private constructor(opts: StartOptions) {
    this.name = opts.name;
    this.woken = new Promise((r) => (this.wake = r));
    const args = [opts.kept ? 'start' : 'run', '--name', opts.name, '--control', 'stdin', '--password-fd', String(PASSWORD_FD)];
    if (opts.kept && opts.provider) throw new TypeError('a kept sandbox has its provider from createKept');
    if (opts.kept?.keepRoot) args.push('--keep-root', opts.kept.keepRoot);
    if (opts.provider) args.push('--provider', opts.provider);
    if (opts.bootstrap && opts.coreBootstrap) throw new TypeError('give bootstrap or coreBootstrap, not both');
    const input = opts.bootstrap ?? opts.coreBootstrap;
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

    this.child = spawn(opts.shim ?? 'oac-shim', args, {
      env: opts.env ?? process.env,
      stdio: ['pipe', 'pipe', 'pipe', 'pipe'],
    });
    // A shim that is gone makes writes fail with EPIPE: its exit says why.
    this.child.stdin!.on('error', () => {});
    if (input) this.child.stdin!.write(JSON.stringify(input) + '\n');

    const closed = new Promise<void>((resolve) => {
      const lines = createInterface({ input: this.child.stdout!, crlfDelay: Infinity });
      lines.on('line', (l) => this.onLine(l));
      lines.on('close', resolve);
    });
    const pw = createInterface({ input: this.child.stdio[PASSWORD_FD] as Readable, crlfDelay: Infinity });
    pw.on('line', (l) => {
      const sp = l.indexOf(' ');
      if (sp > 0) {
        this.passwords.set(Number(l.slice(0, sp)), l.slice(sp + 1));
        this.notify();
      }
    });
    const stderr = createInterface({ input: this.child.stderr!, crlfDelay: Infinity });
    stderr.on('line', (l) => opts.onStderr?.(l));

    const exited = new Promise<{ status: number | null; signal: NodeJS.Signals | null }>((resolve, reject) => {
      this.child.on('error', reject);
      this.child.on('exit', (status, signal) => resolve({ status, signal }));
    });
    this.exitPromise = Promise.all([exited, closed]).then(([x]) => {
      this.ended = true;
      for (const [, p] of this.pending) p.reject(this.exitedError(`${p.command}: oac-shim has exited`, x.status));
      this.pending.clear();
      this.notify();
      return { ...x, last: this.lastState() };
    });
    // Launch errors (ENOENT) surface through exited() and every wait.
    this.exitPromise.catch(() => {
      this.ended = true;
      this.notify();
    });
  }

  /** The shim's pid. */
  get pid(): number | undefined {
    return this.child.pid;
  }

  private notify(): void {
    const wake = this.wake;
    this.woken = new Promise((r) => (this.wake = r));
    wake();
  }

  private onLine(line: string): void {
    let v: AnyLine;
    try {
      v = JSON.parse(line) as AnyLine;
    } catch {
      return; // not a line of the schema: ignored
    }
    if (v.event === 'answer') {
      const p = v.id === undefined ? undefined : this.pending.get(v.id);
      if (p && v.id !== undefined) {
        this.pending.delete(v.id);
        p.resolve(v);
      }
      return;
    }
    this.all.push(v);
    this.notify();
  }

  private lastState(): StateEvent | undefined {
    for (let i = this.all.length - 1; i >= 0; i--) {
      const e = this.all[i]!;
      if (e.event === 'state') return e;
    }
    return undefined;
  }

  private exitedError(message: string, status?: number | null): ShimError {
    const last = this.lastState();
    if (last?.state === 'failed') return new ShimError(`${message}: ${last.message ?? last.code}`, last.code, last, status);
    return new ShimError(message, 'exited', undefined, status);
  }

  /** Every event since the start, in order, then each new one until the shim's output ends. Each call iterates on its own. */
  async *events(): AsyncGenerator<Event, void, undefined> {
    let i = 0;
    for (;;) {
      while (i < this.all.length) yield this.all[i++]!;
      if (this.ended) return;
      await this.woken;
    }
  }

  /** The events received so far. */
  get received(): readonly Event[] {
    return this.all;
  }

  /** The first event since the start that matches pred. Rejects when the shim exits first, or on timeout. */
  async waitForEvent<E extends Event>(pred: (e: Event) => e is E, opts?: { timeoutMs?: number }): Promise<E>;
  async waitForEvent(pred: (e: Event) => boolean, opts?: { timeoutMs?: number }): Promise<Event>;
  async waitForEvent(pred: (e: Event) => boolean, opts: { timeoutMs?: number } = {}): Promise<Event> {
    return this.withTimeout(opts.timeoutMs, 'an event', async () => {
      for await (const e of this.events()) if (pred(e)) return e;
      throw this.exitedError('oac-shim exited before the event');
    });
  }

  /**
   * Waits for a state event (of attempt, when given). A failed state that was
   * not asked for rejects with a ShimError carrying its code.
   */
  async waitFor<S extends State>(state: S, opts: { attempt?: number; timeoutMs?: number } = {}): Promise<StateEventOf<S>> {
    return this.withTimeout(opts.timeoutMs, `state ${state}`, async () => {
      for await (const e of this.events()) {
        if (e.event !== 'state' || (opts.attempt !== undefined && e.attempt !== undefined && e.attempt !== opts.attempt)) continue;
        if (e.state === state) return e as StateEventOf<S>;
        if (e.state === 'failed') throw new ShimError(`sandbox failed: ${e.message ?? e.code}`, e.code, e);
      }
      throw this.exitedError(`oac-shim exited before state ${state}`);
    });
  }

  private async withTimeout<T>(ms: number | undefined, what: string, f: () => Promise<T>): Promise<T> {
    if (ms === undefined) return f();
    let timer: NodeJS.Timeout | undefined;
    const timeout = new Promise<never>((_, reject) => {
      timer = setTimeout(() => reject(new Error(`no ${what} within ${ms} ms`)), ms);
    });
    try {
      return await Promise.race([f(), timeout]);
    } finally {
      clearTimeout(timer);
    }
  }

  /** Sends one command and resolves with its typed result; a refusal rejects with a CommandError. */
  async command<C extends CommandName>(cmd: C, args?: Omit<CommandOf<C>, 'cmd'>): Promise<ResultOf[C]> {
    if (this.ended) throw this.exitedError(`${cmd}: oac-shim has exited`);
    const id = `c${++this.nextId}`;
    const answer = new Promise<Answer>((resolve, reject) => this.pending.set(id, { command: cmd, resolve, reject }));
    this.child.stdin!.write(JSON.stringify({ id, cmd, ...args }) + '\n');
    const a = await answer;
    if (!a.ok) throw new CommandError(`${cmd}: ${a.error}`, cmd, a as ErrorAnswer);
    return (a as Extract<Answer, { ok: true }>).result as ResultOf[C];
  }

  status(): Promise<StatusResult> {
    return this.command('status');
  }
  addForward(listen: string, guestPort: number): Promise<ForwardResult> {
    return this.command('add_forward', { listen, guest_port: guestPort });
  }
  removeForward(listen: string): Promise<Record<string, never>> {
    return this.command('remove_forward', { listen });
  }
  setPolicy(allow: string[], upstreams: string[] = []): Promise<PolicyResult> {
    return this.command('set_policy', { allow, upstreams });
  }
  /** A new attempt (aborts the one in flight); resolves with its number. */
  async restart(): Promise<number> {
    return (await this.command('start')).attempt;
  }
  pushTime(): Promise<TimeResult> {
    return this.command('push_time');
  }

  /** The daemon's password of an attempt (default: the latest), from the descriptor the shim writes it to: never on disk. */
  async password(attempt?: number, opts: { timeoutMs?: number } = {}): Promise<string> {
    return this.withTimeout(opts.timeoutMs, 'password', async () => {
      for (;;) {
        const a = attempt ?? Math.max(0, ...this.passwords.keys());
        const p = this.passwords.get(a);
        if (p !== undefined) return p;
        if (this.ended) throw this.exitedError('oac-shim exited before it gave a password');
        await this.woken;
      }
    });
  }

  /** Resolves when the shim has exited (it never rejects but for a failed launch). */
  exited(): Promise<Exit> {
    return this.exitPromise;
  }

  /**
   * Stops the sandbox in order and waits for the shim to exit. Resolves after
   * a clean stop; rejects with a ShimError (and the code) when it failed.
   */
  async stop(opts: { timeoutMs?: number } = {}): Promise<Exit> {
    if (!this.ended) {
      await this.command('stop').catch((e: unknown) => {
        if (!(e instanceof ShimError)) throw e;
      });
    }
    let x: Exit;
    try {
      x = await this.withTimeout(opts.timeoutMs, 'exit after stop', () => this.exitPromise);
    } catch (e) {
      await this.kill();
      throw e;
    }
    if (x.status !== 0) throw this.exitedError(`oac-shim exited with status ${x.status ?? x.signal}`, x.status);
    return x;
  }

  /** Kills the shim at once (its runtime dies with it) and waits for it. */
  async kill(): Promise<Exit> {
    if (!this.ended) this.child.kill('SIGKILL');
    return this.exitPromise;
  }
}

/** Where the short commands on kept sandboxes run. */
export interface KeptOptions {
  /** The oac-shim binary (default "oac-shim", found in PATH). */
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

/** A short oac-shim command that failed: its exit status and what it said. */
export class KeptError extends Error {
  override readonly name = 'KeptError';
  constructor(
    message: string,
    readonly exitStatus: number | null,
    readonly stderr: string,
  ) {
    super(message);
  }
}

function runKept(o: KeptOptions, args: string[]): Promise<string> {
  if (o.keepRoot) args.push('--keep-root', o.keepRoot);
  return new Promise((resolve, reject) => {
    execFile(o.shim ?? 'oac-shim', args, { env: o.env ?? process.env, maxBuffer: 16 << 20 }, (err, stdout, stderr) => {
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
    execFile(o.shim ?? 'oac-shim', args, { env: o.env ?? process.env, maxBuffer: 16 << 20 }, (err, stdout, stderr) => {
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
export class StopError extends Error {
  override readonly name = 'StopError';
  constructor(
    message: string,
    readonly report: StopReport,
  ) {
    super(message);
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

// The errors of this client. Every one is an OacError: branch on `code`
// (stable), ask `retryable` whether the same call may succeed later, never
// parse the message. The failure, answer and stage codes and their
// retryability come from schema/codes.json (generated from the Go tables).
import { ANSWERS, CLIENT, FAILURES, SCHEMA_VERSION, STAGE } from './generated/codes.js';
import type { ErrorAnswer, FailedEvent } from './generated/event.js';
import type { StageEvent } from './generated/stage-progress.js';

/** Why a sandbox failed (docs/schema.md#failure-codes). */
export type FailureCode = keyof typeof FAILURES;
/** Why a command was refused or failed (docs/schema.md#answer-codes). */
export type AnswerCode = ErrorAnswer['code'];
/** Why staging failed (oac-image stage). */
export type StageCode = keyof typeof STAGE;

/** What a failure code means for a caller, from the published table: oac-shim's exit status, whether a retry can help, what to do. */
export function failureInfo(code: string): { exit: number; retryable: boolean; action: string } {
  return (FAILURES as Record<string, { exit: number; retryable: boolean; action: string }>)[code] ?? FAILURES.internal;
}

/** The base of every error of this client: a stable code and whether the same call may succeed later. */
export class OacError extends Error {
  override name = 'OacError';
  constructor(
    message: string,
    /** Stable: branch on it, never on the message. */
    readonly code: string,
    /** The same call, unchanged, may succeed later. */
    readonly retryable: boolean,
    options?: { cause?: unknown },
  ) {
    super(message, options);
  }
}

/** Why a sandbox failed or a shim ended: code is the failed event's, or "exited" when the shim ended without one. */
export class ShimError extends OacError {
  override name = 'ShimError';
  declare readonly code: FailureCode | 'exited';
  /** What to do about it (the published table's action). */
  readonly action: string | undefined;
  constructor(
    message: string,
    code: FailureCode | 'exited',
    /** The failed event, when there was one. */
    readonly event?: FailedEvent,
    /** The shim's exit status, when it has exited. */
    readonly exitStatus?: number | null,
  ) {
    const info = code === 'exited' ? undefined : failureInfo(code);
    super(message, code, info?.retryable ?? false);
    this.action = info?.action;
  }
}

/** A control command the shim refused or could not carry out: branch on code (docs/schema.md#answer-codes). */
export class CommandError extends OacError {
  override name = 'CommandError';
  declare readonly code: AnswerCode;
  constructor(
    message: string,
    readonly command: string,
    readonly answer: ErrorAnswer,
  ) {
    super(message, answer.code, (ANSWERS as Record<string, { retryable: boolean }>)[answer.code]?.retryable ?? false);
  }
}

/** A wait, command or stop that took longer than its timeoutMs (or an AbortSignal.timeout fired). */
export class TimeoutError extends OacError {
  override name = 'TimeoutError';
  declare readonly code: 'timeout';
  constructor(message: string, options?: { cause?: unknown }) {
    super(message, 'timeout', true, options);
  }
}

/** A call whose AbortSignal fired; cause is the signal's reason. */
export class AbortError extends OacError {
  override name = 'AbortError';
  declare readonly code: 'aborted';
  constructor(message: string, options?: { cause?: unknown }) {
    super(message, 'aborted', false, options);
  }
}

/** A binary that could not be started: errno is the system's code (ENOENT: no file at path; EACCES: not executable), cause the Node error. */
export class LaunchError extends OacError {
  override name = 'LaunchError';
  declare readonly code: 'launch_failed';
  constructor(
    readonly path: string,
    readonly errno: string | undefined,
    cause: unknown,
    hint: string,
  ) {
    super(`${path} could not be started: ${errno ?? String(cause)}: ${hint}`, 'launch_failed', false, { cause });
  }
}

/** The shim writes events of another schema version than this client reads: install the oac-shim of this client's release. */
export class SchemaVersionError extends OacError {
  override name = 'SchemaVersionError';
  declare readonly code: 'schema_version';
  readonly want = SCHEMA_VERSION;
  constructor(
    readonly path: string,
    readonly got: unknown,
  ) {
    super(
      `${path} writes events of schema version ${String(got)}, this client reads version ${SCHEMA_VERSION}: ` +
        `install the oac-shim of this client's release (${CLIENT}; its events carry schema_version ${SCHEMA_VERSION}), ` +
        'or point the shim option or OAC_SHIM at it',
      'schema_version',
      false,
    );
  }
}

/** Staging failed: code is the stage code of the error event (STAGE in codes), event that event. */
export class StageError extends OacError {
  override name = 'StageError';
  declare readonly code: StageCode | 'usage';
  constructor(
    message: string,
    code: StageCode | 'usage',
    readonly event?: StageEvent,
    readonly exitStatus?: number | null,
  ) {
    super(message, code, code === 'usage' ? false : ((STAGE as Record<string, { retryable: boolean }>)[code]?.retryable ?? false));
  }
}

/** An iterator of events that asked for events the bounded history no longer holds, or fell that far behind. */
export class HistoryError extends OacError {
  override name = 'HistoryError';
  declare readonly code: 'history_lost';
  constructor(message: string) {
    super(message, 'history_lost', false);
  }
}

/** A short oac-shim command that failed: its exit status and what it said. */
export class KeptError extends OacError {
  override name = 'KeptError';
  declare readonly code: 'command_failed';
  constructor(
    message: string,
    readonly exitStatus: number | null,
    readonly stderr: string,
  ) {
    super(message, 'command_failed', false);
  }
}

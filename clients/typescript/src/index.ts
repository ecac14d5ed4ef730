export { Shim, ShimError, CommandError, KeptError, createKept, resetKept, destroyKept, listKept } from './shim.js';
export type { Event, StateEvent, State, ResultOf, StartOptions, Identity, Exit, CommandName, AnswerCode, KeptOptions, CreateOptions } from './shim.js';
export type * from './generated/event.js';
export type { Command } from './generated/command.js';
export type { Bootstrap } from './generated/bootstrap.js';
export type { CoreBootstrap, Runtime as CoreRuntime } from './generated/core-bootstrap.js';
export type { PolicyFile } from './generated/policy.js';
export type { ListReport, ListEntry } from './generated/list.js';

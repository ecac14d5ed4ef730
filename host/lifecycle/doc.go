// Package lifecycle is the lifecycle state machine of one sandbox (see
// docs/events-and-control.md): the states (api.State) starting,
// warm (booted for nobody, waiting for a claim: docs/warm.md),
// ready{url, username, password}, failed{message} and stopped;
// single-flight jobs (a new start aborts the one in flight and runs only
// once it has ended); an attempt counter that every report carries, so
// late results of an old attempt are dropped; reset (stop, remove what
// persists, start afresh) and destroy (stop, remove what persists, accept
// no more starts). Server ids are sandbox:<name> (api.ServerID).
//
// It owns only the state machine and the ordering of jobs. What a job does
// (boot a guest with a provider) is the caller's Job; what persists and
// how to remove it is the caller's Destroy hook. It must not emit events,
// log, or know about providers, protocol or processes; and it never hands
// the password to anything but Status callers (Status.Password is not
// serialized).
package lifecycle

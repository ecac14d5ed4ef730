// Package sockfile listens on unix sockets that only their owner can
// connect to: the socket is bound inside a fresh 0700 directory beside the
// target, made 0600, then renamed into place, so there is no moment at
// which it exists at its path with looser permissions. A stale socket at
// the path (a crashed earlier run) is replaced; any other file is refused.
//
// It must not follow the caller's path anywhere but its own directory, and
// never removes anything that is not a socket.
package sockfile

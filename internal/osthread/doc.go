// Package osthread runs work on an OS thread that ends with it, for work
// that changes what a thread is (its namespaces, its filesystem context)
// and must never leave that change on a thread other code runs on.
//
// It owns only the choice and the end of the thread; it must not do the
// work itself (callers enter namespaces, mount, open) or keep threads.
package osthread

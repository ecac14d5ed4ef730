// Package errmark marks an error as being of a kind (a sentinel error)
// without changing its message, so a caller derives what failed with
// errors.Is instead of reading text.
//
// It owns only the marking; it must not define kinds (the packages that
// return errors own their sentinels) or format messages.
package errmark

// Package compat makes the 32-bit (i386) system calls a 64-bit process on
// x86-64 can still make with int 0x80, for the guard's tests: the kernel
// shows a compat setsockopt to no cgroup setsockopt program, so a hostile
// guest root can try exactly that.
package compat

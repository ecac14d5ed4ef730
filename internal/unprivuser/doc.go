// Package unprivuser makes the unprivileged users that the rootless
// scenarios run oac-shim as, as a desktop Linux machine has them: a system
// user with a subordinate id range of 65,536 (the usual desktop user) and
// one without (--single-uid). The e2e tests and make bench's rootless rows
// share it.
//
// It owns creating those users once (useradd, usermod) and reading
// /etc/subuid. It must not run the shim or touch any other user.
package unprivuser

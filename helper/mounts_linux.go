package helper

import (
	"errors"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"syscall"
)

// privateEnv marks the helper's child, which already runs in a mount
// namespace of its own.
const privateEnv = "OAC_HELPER_PRIVATE_MOUNTS"

// InPrivateMounts runs this helper again (the same arguments, stdin,
// stdout and stderr) in a mount namespace of its own whose mounts are
// private, forwards SIGTERM, SIGINT and SIGHUP to it, and returns its exit
// status with ok true. What the agent mounts there (its resolv.conf) is
// then never the platform's. ok is false in that child, and when the
// namespace cannot be made (no CAP_SYS_ADMIN): the helper then runs in
// this process, and its mounts are the platform's.
func InPrivateMounts(args []string, log *slog.Logger) (code int, ok bool) {
	if os.Getenv(privateEnv) != "" {
		os.Unsetenv(privateEnv)
		return 0, false
	}
	cmd := exec.Command("/proc/self/exe", args...)
	cmd.Args[0] = os.Args[0]
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	cmd.Env = append(os.Environ(), privateEnv+"=1")
	// Go makes / MS_REC|MS_PRIVATE in the child after the unshare. A
	// parent killed outright still stops the child in order.
	cmd.SysProcAttr = &syscall.SysProcAttr{Unshareflags: syscall.CLONE_NEWNS, Pdeathsig: syscall.SIGTERM}
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP)
	defer signal.Stop(sigs)
	if err := cmd.Start(); err != nil {
		log.Warn("no mount namespace of its own: what the helper mounts is the platform's", "err", err)
		return 0, false
	}
	done := make(chan struct{})
	go func() {
		for {
			select {
			case s := <-sigs:
				_ = cmd.Process.Signal(s)
			case <-done:
				return
			}
		}
	}()
	err := cmd.Wait()
	close(done)
	var ee *exec.ExitError
	switch {
	case err == nil:
		return 0, true
	case errors.As(err, &ee):
		if st, ok := ee.Sys().(syscall.WaitStatus); ok && st.Signaled() {
			return 128 + int(st.Signal()), true
		}
		return ee.ExitCode(), true
	}
	log.Error("helper", "err", err)
	return 1, true
}

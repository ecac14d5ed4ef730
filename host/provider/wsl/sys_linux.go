package wsl

import "syscall"

// sysProcAttr: wsl.exe (a fake one, on Linux) dies with the shim.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
}

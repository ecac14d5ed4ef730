package wsl

import (
	"syscall"

	"golang.org/x/sys/windows"
)

// sysProcAttr: wsl.exe opens no console window.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{HideWindow: true, CreationFlags: windows.CREATE_NO_WINDOW}
}

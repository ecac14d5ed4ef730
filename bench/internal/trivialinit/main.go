//go:build linux

// Command trivialinit is the baseline init for the qemu boot figure: PID 1
// that prints one line on the console and powers the VM off. It is a bench
// fixture, not part of any image.
package main

import (
	"os"

	"golang.org/x/sys/unix"
)

func main() {
	_, _ = os.Stdout.WriteString("oac-bench: trivial init ran\n")
	unix.Sync()
	_ = unix.Reboot(unix.LINUX_REBOOT_CMD_POWER_OFF)
	select {}
}

//go:build linux

// Command vmdaemon is the daemon the VM end-to-end tests put in their
// initramfs: the image has no shell, so this static binary reports what
// the tests check (one "key=value" line each) and then waits for SIGTERM.
package main

import (
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/oac/sandbox-agent/e2e/internal/standin/selfreport"
)

func main() {
	term := make(chan os.Signal, 1)
	signal.Notify(term, syscall.SIGTERM)
	groups, _ := os.Getgroups()
	gs := make([]string, 0, len(groups))
	for _, g := range groups {
		gs = append(gs, fmt.Sprint(g))
	}
	fmt.Printf("ids=uid=%d gid=%d groups=%s\n", os.Getuid(), os.Getgid(), strings.Join(gs, ","))
	fmt.Printf("nonewprivs=%s\n", selfreport.StatusField("NoNewPrivs"))
	fmt.Printf("capeff=%s\n", selfreport.StatusField("CapEff"))
	comm, _ := os.ReadFile("/proc/1/comm")
	fmt.Printf("pid1=%s\n", strings.TrimSpace(string(comm)))
	var ifaces []string
	dev, _ := os.ReadFile("/proc/net/dev")
	for _, line := range strings.Split(string(dev), "\n")[2:] {
		if name, _, ok := strings.Cut(line, ":"); ok {
			ifaces = append(ifaces, strings.TrimSpace(name))
		}
	}
	fmt.Printf("ifaces=%s\n", strings.Join(ifaces, ","))
	host, _ := os.Hostname()
	fmt.Printf("hostname=%s\n", host)
	_, err := os.Stat("/sys/fs/cgroup/cgroup.controllers")
	fmt.Printf("cgroup2=%t\n", err == nil)
	wd, _ := os.Getwd()
	fmt.Printf("cwd=%s\n", wd)
	fmt.Printf("unix_ms=%d\n", time.Now().UnixMilli())
	fmt.Printf("vda=%s\n", disk())
	<-term
	fmt.Println("term")
}

// disk describes /dev/vda as the kernel sees it ("SECTORS ro=0|1"), waiting
// up to 5 s for the virtio-blk probe, or "none".
func disk() string {
	if _, err := os.Stat("/sys/module/virtio_blk"); err != nil {
		return "none"
	}
	for i := 0; i < 50; i++ {
		size, err := os.ReadFile("/sys/block/vda/size")
		if err == nil {
			ro, _ := os.ReadFile("/sys/block/vda/ro")
			_, derr := os.Stat("/dev/vda")
			return fmt.Sprintf("%s ro=%s dev=%t", strings.TrimSpace(string(size)), strings.TrimSpace(string(ro)), derr == nil)
		}
		time.Sleep(100 * time.Millisecond)
	}
	return "none"
}

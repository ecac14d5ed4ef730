//go:build linux

// Command vmdaemon is the daemon the VM end-to-end tests put in their
// images: the image has no shell, so this static binary reports what the
// tests check (one "key=value" line each) and then waits for SIGTERM.
//
// Flags: --write DIR (repeatable) creates DIR/written-by-vmdaemon and
// reports "wrote DIR=ok" or the error; --read FILE reports "read
// FILE=CONTENT" or the error. VMDAEMON_CLOCK_EVERY=DUR reports the
// guest's wall clock ("clock_ms=UNIX_MS") that often.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/oac/sandbox-agent/e2e/internal/standin/selfreport"
)

type list []string

func (l *list) String() string     { return strings.Join(*l, ",") }
func (l *list) Set(v string) error { *l = append(*l, v); return nil }

func main() {
	var writes, reads list
	flag.Var(&writes, "write", "directory to create written-by-vmdaemon in (repeatable)")
	flag.Var(&reads, "read", "file to report the content of (repeatable)")
	flag.Parse()
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
	fmt.Printf("root=%s\n", rootMount())
	for _, d := range writes {
		err := os.WriteFile(filepath.Join(d, "written-by-vmdaemon"), []byte("written in the guest\n"), 0o644)
		fmt.Printf("wrote %s=%s\n", d, errText(err))
	}
	for _, f := range reads {
		b, err := os.ReadFile(f)
		if err != nil {
			fmt.Printf("read %s=%s\n", f, errText(err))
			continue
		}
		fmt.Printf("read %s=%s\n", f, strings.TrimSpace(string(b)))
	}
	probes()
	if every, err := time.ParseDuration(os.Getenv("VMDAEMON_CLOCK_EVERY")); err == nil && every > 0 {
		go func() {
			for range time.Tick(every) {
				fmt.Printf("clock_ms=%d\n", time.Now().UnixMilli())
			}
		}()
	}
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

// probes runs the programs VMDAEMON_PROBES names (a JSON list of
// [label, argv...]), one after the other, and prints "label: OUTPUT" for
// each (stdout and stderr, newlines as '|'), then "probes done": the
// shell-less image's way to run a client such as curl for a test.
func probes() {
	var list [][]string
	if err := json.Unmarshal([]byte(os.Getenv("VMDAEMON_PROBES")), &list); err != nil {
		return
	}
	for _, p := range list {
		if len(p) < 2 {
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		out, _ := exec.CommandContext(ctx, p[1], p[2:]...).CombinedOutput()
		cancel()
		fmt.Printf("%s: %s\n", p[0], strings.ReplaceAll(strings.TrimRight(string(out), "\n"), "\n", "|"))
	}
	fmt.Println("probes done")
}

func errText(err error) string {
	if err == nil {
		return "ok"
	}
	return err.Error()
}

// rootMount describes / as mounted ("FSTYPE ro|rw") from mountinfo.
func rootMount() string {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return "?"
	}
	defer f.Close()
	found := "?"
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// id parent major:minor root mountpoint options ... - fstype source superoptions
		fields := strings.Fields(sc.Text())
		if len(fields) < 7 || fields[4] != "/" {
			continue
		}
		sep := 6
		for sep < len(fields) && fields[sep] != "-" {
			sep++
		}
		if sep+1 >= len(fields) {
			continue
		}
		mode := "rw"
		for _, o := range strings.Split(fields[5], ",") {
			if o == "ro" {
				mode = "ro"
			}
		}
		found = fields[sep+1] + " " + mode // the last one mounted on / is what the process sees
	}
	return found
}

package bwrap

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/oac/sandbox-agent/host/provider/kit"
)

// Kept sandboxes without root (ModeSubIDs): guest ids 1.. are the user's
// subordinate ids, which the user cannot chown to or remove from the
// host. What the kept state needs done as them runs as guest root of a
// user namespace mapped as the sandbox's is: bwrap over the host's own
// root, mapped by newuidmap and newgidmap, running one sh command.

// mappedSh runs script (with "$1" = arg) as root of a user namespace
// mapped as a ModeSubIDs sandbox's.
func (p *Provider) mappedSh(ctx context.Context, script, arg string) error {
	bw, err := p.bwrap()
	if err != nil {
		return err
	}
	f := p.facts()
	in := &Instance{mode: ModeSubIDs, newuidmap: f.NewUIDMap, newgidmap: f.NewGIDMap}
	in.subUID, _ = pickRange(f.SubUIDs)
	in.subGID, _ = pickRange(f.SubGIDs)
	infoR, infoW, err := os.Pipe()
	if err != nil {
		return err
	}
	defer infoR.Close()
	defer infoW.Close()
	blockR, blockW, err := os.Pipe()
	if err != nil {
		return err
	}
	defer blockR.Close()
	defer blockW.Close()
	ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bw, "--unshare-user", "--userns-block-fd", "3", "--info-fd", "4",
		"--uid", "0", "--gid", "0", "--cap-add", "ALL", "--bind", "/", "/", "--die-with-parent",
		"/bin/sh", "-c", script, "sh", arg)
	cmd.ExtraFiles = []*os.File{blockR, infoW}
	cmd.Env = []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin"}
	cmd.Dir = "/"
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("bwrap: %w", err)
	}
	infoW.Close()
	blockR.Close()
	if err := in.mapSubIDs(infoR, blockW); err != nil {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		return err
	}
	if err := cmd.Wait(); err != nil {
		return fmt.Errorf("bwrap: %v: %s", err, strings.TrimSpace(out.String()))
	}
	return nil
}

// ownKeptLocal hands the kept /usr/local (but bin and sbin) to guest uid
// 1000, as PrepareKept does as root, when it is not already.
func (in *Instance) ownKeptLocal(p *Provider) error {
	uid, _ := in.HostID(1000)
	st, err := os.Stat(in.kept.UsrLocal)
	if err != nil {
		return fmt.Errorf("kept state: %w", err)
	}
	if owner, _ := ownerIDs(st); owner == uid {
		return nil
	}
	var dirs []string
	for _, d := range []string{"", "lib", "share", "include", "etc", "src"} {
		dirs = append(dirs, `"$1"/`+d)
	}
	if err := p.mappedSh(context.Background(), "chown 1000:1000 "+strings.Join(dirs, " "), in.kept.UsrLocal); err != nil {
		return fmt.Errorf("kept state: hand /usr/local to uid 1000: %w", err)
	}
	return nil
}

// discard removes what is under dir; without root, what the guest's ids
// own is removed from inside a mapped user namespace first.
func (p *Provider) discard(ctx context.Context, dir string) error {
	if os.Geteuid() != 0 {
		if m, err := p.mode(); err == nil && m == ModeSubIDs {
			if _, err := os.Stat(dir); err == nil {
				if err := p.mappedSh(ctx, `find "$1" -mindepth 1 -delete`, filepath.Clean(dir)); err != nil {
					return fmt.Errorf("discard %s: %w", dir, err)
				}
			}
		}
	}
	return kit.DiscardKept(dir)
}

func ownerIDs(st os.FileInfo) (int, int) {
	if s, ok := st.Sys().(*syscall.Stat_t); ok {
		return int(s.Uid), int(s.Gid)
	}
	return -1, -1
}

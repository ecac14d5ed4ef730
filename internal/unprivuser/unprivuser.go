//go:build linux

package unprivuser

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"strconv"
	"strings"
)

// Ensure creates the system user name when it does not exist (no home,
// no subordinate ids of useradd's choosing) and, with subIDs, grants it a
// range of 65,536 subordinate uids and gids above every range already
// granted, unless it has one.
func Ensure(name string, subIDs bool) error {
	if _, err := user.Lookup(name); err != nil {
		if out, err := exec.Command("useradd", "--system", "--no-create-home", "-K", "SUB_UID_COUNT=0", "-K", "SUB_GID_COUNT=0", name).CombinedOutput(); err != nil {
			return fmt.Errorf("useradd %s: %v: %s (apt-get install passwd uidmap)", name, err, out)
		}
	}
	if !subIDs {
		return nil
	}
	if start, _ := SubIDStart(name); start > 0 {
		return nil
	}
	next := 100000
	for _, file := range []string{"/etc/subuid", "/etc/subgid"} {
		f, err := os.Open(file)
		if err != nil {
			continue
		}
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			p := strings.Split(sc.Text(), ":")
			if len(p) == 3 {
				s, _ := strconv.Atoi(p[1])
				c, _ := strconv.Atoi(p[2])
				next = max(next, s+c)
			}
		}
		f.Close()
	}
	r := fmt.Sprintf("%d-%d", next, next+65535)
	if out, err := exec.Command("usermod", "--add-subuids", r, "--add-subgids", r, name).CombinedOutput(); err != nil {
		return fmt.Errorf("usermod --add-subuids %s %s: %v: %s", r, name, err, out)
	}
	return nil
}

// SubIDStart returns the first subordinate uid of name (/etc/subuid).
func SubIDStart(name string) (int, error) {
	b, err := os.ReadFile("/etc/subuid")
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		p := strings.Split(line, ":")
		if len(p) == 3 && p[0] == name {
			return strconv.Atoi(p[1])
		}
	}
	return 0, fmt.Errorf("%s has no subordinate uids", name)
}

// Argv runs argv as name with a fresh login environment (setpriv execs
// it, so signals reach it directly).
func Argv(name string, argv ...string) []string {
	return append([]string{"setpriv", "--reuid", name, "--regid", name, "--init-groups", "--reset-env"}, argv...)
}

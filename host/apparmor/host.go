package apparmor

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

// ErrProfileMissing: the container engine confines containers with
// AppArmor, the guest's profile is not loaded, and oac-shim could not
// load it (not root, no parser, the parser or the kernel refused it).
// Nothing was created. Its failure code is apparmor_profile_missing.
var ErrProfileMissing = errors.New("AppArmor profile missing")

// Mode is how a provider gets the profile onto the host.
type Mode string

const (
	// Load: oac-shim loads its own profile before each container when it
	// may (root, and apparmor_parser installed); otherwise it uses the
	// profile the host has loaded, or refuses.
	Load Mode = "load"
	// Require: only a profile the host has loaded (an operator installed
	// it); otherwise refuse.
	Require Mode = "require"
)

// ParseMode reads a mode flag's value; "" is Load.
func ParseMode(flag, s string) (Mode, error) {
	switch Mode(s) {
	case "", Load:
		return Load, nil
	case Require:
		return Require, nil
	}
	return "", fmt.Errorf("%s %q: want load or require", flag, s)
}

// Host is this machine's AppArmor; the zero value is the real one.
type Host struct {
	// Parser is apparmor_parser; "" finds it in PATH, /sbin or /usr/sbin.
	Parser string
	// FS is AppArmor's securityfs directory (default
	// /sys/kernel/security/apparmor).
	FS string
	// Root reports whether oac-shim may load profiles (default: euid 0).
	Root func() bool
}

const securityFS = "/sys/kernel/security/apparmor"

func (h Host) fs() string {
	if h.FS != "" {
		return h.FS
	}
	return securityFS
}

// parser returns apparmor_parser's path.
func (h Host) parser() (string, error) {
	if h.Parser != "" {
		return h.Parser, nil
	}
	if p, err := exec.LookPath("apparmor_parser"); err == nil {
		return p, nil
	}
	// sudo's and cron's PATH may lack the sbin directories.
	for _, p := range []string{"/usr/sbin/apparmor_parser", "/sbin/apparmor_parser"} {
		if st, err := os.Stat(p); err == nil && st.Mode().IsRegular() && st.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", errors.New("apparmor_parser is not installed (apt-get install apparmor)")
}

func (h Host) root() bool {
	if h.Root != nil {
		return h.Root()
	}
	return os.Geteuid() == 0
}

// Loaded reports whether the kernel holds a profile called name. The
// kernel's list of profiles is root's to read; anyone may list the policy
// directory, which names each profile too.
func (h Host) Loaded(name string) (bool, error) {
	f, err := os.Open(filepath.Join(h.fs(), "profiles"))
	if errors.Is(err, fs.ErrPermission) {
		return h.inPolicyDir(name)
	}
	if err != nil {
		return false, fmt.Errorf("read the kernel's AppArmor profiles: %w (is securityfs mounted, AppArmor enabled in this kernel?)", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// "NAME (MODE)": a profile's name has no " (" in it.
		if n, _, ok := strings.Cut(sc.Text(), " ("); ok && n == name {
			return true, nil
		}
	}
	if err := sc.Err(); err != nil {
		return false, fmt.Errorf("read the kernel's AppArmor profiles: %w", err)
	}
	return false, nil
}

// inPolicyDir looks for name in the policy directory: one directory per
// profile, NAME.N, whose file "name" holds the name.
func (h Host) inPolicyDir(name string) (bool, error) {
	dir := filepath.Join(h.fs(), "policy", "profiles")
	ents, err := os.ReadDir(dir)
	if err != nil {
		return false, fmt.Errorf("read the kernel's AppArmor profiles: %w", err)
	}
	for _, e := range ents {
		if !strings.HasPrefix(e.Name(), name+".") {
			continue
		}
		b, err := os.ReadFile(filepath.Join(dir, e.Name(), "name"))
		if err == nil && strings.TrimSpace(string(b)) == name {
			return true, nil
		}
	}
	return false, nil
}

// parserTimeout bounds one run of apparmor_parser.
const parserTimeout = 60 * time.Second

// runParser runs apparmor_parser with args and text on its stdin.
func (h Host) runParser(ctx context.Context, text []byte, args ...string) error {
	p, err := h.parser()
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, parserTimeout)
	defer cancel()
	var out bytes.Buffer
	cmd := exec.CommandContext(ctx, p, args...)
	cmd.Stdin = bytes.NewReader(text)
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.Dir = "/"
	if err := cmd.Run(); err != nil {
		msg := strings.Join(strings.Fields(out.String()), " ")
		if len(msg) > 1024 {
			msg = msg[:1024] + "..."
		}
		if msg == "" {
			msg = err.Error()
		}
		return fmt.Errorf("%s %s: %s", p, strings.Join(args, " "), msg)
	}
	return nil
}

// Validate has the parser compile text without loading it: a profile it
// refuses (an older parser, a missing include) is found before a run.
func (h Host) Validate(ctx context.Context, text []byte) error {
	// -Q: skip the kernel; -K: no cache.
	return h.runParser(ctx, text, "-QK")
}

// Load loads text into the kernel, replacing a profile of its name, and
// checks the kernel lists it.
func (h Host) Load(ctx context.Context, text []byte) error {
	// -r: add or replace; -K: write no cache (a read-only /etc is fine).
	if err := h.runParser(ctx, text, "-Kr"); err != nil {
		return err
	}
	ok, err := h.Loaded(Name)
	if err != nil {
		return err
	}
	if !ok {
		return fmt.Errorf("apparmor_parser loaded %s but the kernel does not list it", Name)
	}
	return nil
}

// Plan is how an engine's containers get the guest's profile.
type Plan struct {
	// Profile is the profile to run the container under; "" when the
	// engine does not confine with AppArmor (nothing to ask for).
	Profile string
	// Load: oac-shim loads the profile (Profile) before each container.
	Load bool
	// How says which, for oac-shim check.
	How string
}

// Install says how to install the profile by hand, where the parser can
// load it (as root, not confined).
const Install = "install examples/apparmor/" + Name + " as root: install -m 0644 " + Name + " /etc/apparmor.d/" + Name +
	" && apparmor_parser -r /etc/apparmor.d/" + Name + " (docs/providers.md#apparmor)"

// Decide says how containers of an engine that confines them with
// AppArmor (confines) get the guest's profile in mode; flag names the
// mode's flag, engine the engine, in messages. The error wraps
// ErrProfileMissing and says what to install, and how.
func (h Host) Decide(mode Mode, confines bool, flag, engine string) (Plan, error) {
	if !confines {
		return Plan{How: engine + " does not confine containers with AppArmor"}, nil
	}
	why := engine + " confines containers with AppArmor, whose default profile refuses the mounts the guest makes for the workload's namespaces, and"
	if mode == Load {
		if !h.root() {
			return h.useLoaded(engine, why, "oac-shim is not root", flag)
		}
		if _, err := h.parser(); err != nil {
			return h.useLoaded(engine, why, err.Error(), flag)
		}
		return Plan{Profile: Name, Load: true,
			How: fmt.Sprintf("%s confines containers with AppArmor: they run under %s (version %d), which oac-shim loads with apparmor_parser before each", engine, Name, Version)}, nil
	}
	ok, err := h.Loaded(Name)
	if err != nil {
		return Plan{}, fmt.Errorf("%w: %s oac-shim cannot tell whether the profile %s is loaded (%v): %s", ErrProfileMissing, why, Name, err, Install)
	}
	if !ok {
		return Plan{}, fmt.Errorf("%w: %s the profile %s is not loaded (%s require): %s; or run oac-shim as root with %s load, which loads its own",
			ErrProfileMissing, why, Name, flag, Install, flag)
	}
	return Plan{Profile: Name, How: fmt.Sprintf("%s confines containers with AppArmor: they run under the loaded profile %s (%s require)", engine, Name, flag)}, nil
}

// useLoaded is Load's plan when oac-shim cannot load the profile
// (cannot says why): the one the host has, or a refusal.
func (h Host) useLoaded(engine, why, cannot, flag string) (Plan, error) {
	ok, err := h.Loaded(Name)
	switch {
	case err != nil:
		return Plan{}, fmt.Errorf("%w: %s oac-shim cannot load the profile %s (%s) nor tell whether it is loaded (%v): %s, and run with %s require",
			ErrProfileMissing, why, Name, cannot, err, Install, flag)
	case !ok:
		return Plan{}, fmt.Errorf("%w: %s the profile %s is not loaded, and oac-shim cannot load it (%s): %s; or run oac-shim as root with apparmor_parser installed",
			ErrProfileMissing, why, Name, cannot, Install)
	}
	return Plan{Profile: Name, How: fmt.Sprintf("%s confines containers with AppArmor: they run under the loaded profile %s (oac-shim cannot load its own: %s)", engine, Name, cannot)}, nil
}

package doors

import (
	"io/fs"
	"os"
	"strings"
	"testing"

	"github.com/moby/sys/mountinfo"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// wslInterop is the binfmt_misc entry WSL registers (flags PF: the
// kernel opens /init once, at registration).
const wslInterop = "enabled\ninterpreter /init\nflags: PF\noffset 0\nmagic 4d5a\n"

func mounts(t *testing.T, file string) []*mountinfo.Info {
	t.Helper()
	f, err := os.Open("testdata/" + file)
	require.NoError(t, err)
	defer f.Close()
	m, err := mountinfo.GetMountsFromReader(f, nil)
	require.NoError(t, err)
	return m
}

// files is a fake filesystem for Lstat.
func files(types map[string]fs.FileMode) func(string) (fs.FileMode, error) {
	return func(p string) (fs.FileMode, error) {
		if m, ok := types[p]; ok {
			return m, nil
		}
		return 0, fs.ErrNotExist
	}
}

func paths(doors []Door) map[string]Kind {
	out := map[string]Kind{}
	for _, d := range doors {
		out[d.Path] = d.Kind
	}
	return out
}

func TestFindsEveryDoorOfAWSL2DistributionAsWSLMakesIt(t *testing.T) {
	doors, plan := Find(Sources{
		Mounts: mounts(t, "wsl2-default.mountinfo"),
		Binfmt: map[string]string{"WSLInterop": wslInterop, "python3.11": "enabled\ninterpreter /usr/bin/python3.11\nflags: \noffset 0\nmagic 6f0d0d0a\n"},
		Env: []string{"WSL_INTEROP=/run/WSL/8_interop", "DISPLAY=:0", "WSL_DISTRO_NAME=oac-x",
			"PATH=/usr/local/bin:/usr/bin:/bin:/mnt/c/Windows/System32:/mnt/c/Users/me/AppData/Local/Microsoft/WindowsApps"},
		Lstat: files(map[string]fs.FileMode{"/run/WSL": fs.ModeDir, "/init": 0}),
	})
	assert.Equal(t, map[string]Kind{
		"/mnt/c": WindowsDrive, "/mnt/d": WindowsDrive, "/mnt/wsl": SharedMount,
		"/mnt/wslg": Display, "/mnt/wslg/distro": Display, "/tmp/.X11-unix": Display,
		"/usr/lib/wsl/drivers": HostShare, "/usr/lib/wsl/lib": HostShare,
		"binfmt_misc/WSLInterop": Interop, "/run/WSL": Interop, "$WSL_INTEROP": Interop, "$DISPLAY": Display,
		"$PATH /mnt/c/Windows/System32": WindowsPath, "$PATH /mnt/c/Users/me/AppData/Local/Microsoft/WindowsApps": WindowsPath,
	}, paths(doors))
	assert.Equal(t, []string{"/mnt/c", "/mnt/d", "/mnt/wsl", "/mnt/wslg", "/tmp/.X11-unix", "/usr/lib/wsl/drivers", "/usr/lib/wsl/lib"}, plan.Detach,
		"each door's mount once, none below another")
	assert.Equal(t, []string{"/run/WSL"}, plan.Cover)
	assert.Equal(t, []string{"/init"}, plan.Mask, "WSL's /init is an interop client itself")
	assert.Contains(t, paths(doors), "binfmt_misc/WSLInterop")
	for _, d := range doors {
		if d.Path == "/mnt/c" {
			assert.Equal(t, `Windows drive C:\ (9p)`, d.What)
		}
	}
	assert.Equal(t, []string{"WSL_DISTRO_NAME=oac-x", "PATH=/usr/local/bin:/usr/bin:/bin", "HOME=/home/runtime"},
		plan.CleanEnv([]string{"WSL_INTEROP=/run/WSL/8_interop", "WSL_DISTRO_NAME=oac-x", "DISPLAY=:0",
			"PATH=/usr/local/bin:/usr/bin:/mnt/c/Windows/System32:/bin:/mnt/wslg/runtime-dir", "HOME=/home/runtime"}))
}

func TestEveryHandlerOfWindowsProgramsHasItsInterpreterMasked(t *testing.T) {
	doors, plan := Find(Sources{
		Binfmt: map[string]string{"WSLInterop": "enabled\ninterpreter /init\nflags: P\noffset 0\nmagic 4d5a\n",
			"wine": "enabled\ninterpreter /usr/bin/wine\nflags: \noffset 0\nmagic 4D5A\n"},
		Lstat: files(map[string]fs.FileMode{"/init": 0, "/usr/bin/wine": 0}),
	})
	assert.Equal(t, []string{"/init", "/usr/bin/wine"}, plan.Mask, "any handler of MZ programs: without flag F the kernel resolves its interpreter in the workload's namespace")
	assert.Len(t, doors, 2)
	_, plan = Find(Sources{Binfmt: map[string]string{"WSLInterop": "disabled\ninterpreter /init\nflags: P\noffset 0\nmagic 4d5a\n"}, Lstat: files(map[string]fs.FileMode{"/init": 0})})
	assert.True(t, plan.Empty(), "a disabled entry (wsl.conf [interop] enabled=false) is no door")
}

func TestAContainerHasNoDoor(t *testing.T) {
	doors, plan := Find(Sources{
		Mounts: mounts(t, "docker.mountinfo"),
		Binfmt: map[string]string{},
		Env:    []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOSTNAME=abc"},
		Lstat:  files(map[string]fs.FileMode{"/etc/hostname": 0, "/etc/hosts": 0, "/etc/resolv.conf": 0}),
	})
	assert.Empty(t, doors, "the engine's own files and the named volume are the contract's")
	assert.True(t, plan.Empty())
	assert.Equal(t, []string{"WSL_INTEROP"}, plan.DropEnv)
}

func TestAVMsSharesAreTheContractsAndAnythingElseOfTheHostIsADoor(t *testing.T) {
	doors, plan := Find(Sources{
		Mounts: mounts(t, "vm-share.mountinfo"),
		Shares: []string{"/home/runtime/workspace"},
		Lstat:  files(map[string]fs.FileMode{"/var/run/docker.sock": fs.ModeSocket}),
	})
	assert.Equal(t, map[string]Kind{"/srv/data": HostShare, "/opt/tool": HostShare, "/var/run/docker.sock": HostSocket}, paths(doors))
	assert.Equal(t, []string{"/opt/tool", "/srv/data", "/var/run/docker.sock"}, plan.Detach)
}

func TestDriveNames(t *testing.T) {
	for s, want := range map[string]bool{`C:\`: true, "c:": true, "D:/": true, `C:\Users`: false, "1:": false, "drvfs": false, "": false, "C": false} {
		assert.Equal(t, want, driveSource(s), s)
	}
	for mp, want := range map[string]bool{"/mnt/c": true, "/mnt/Z": true, "/mnt/cd": false, "/mnt/1": false, "/media/c": false} {
		assert.Equal(t, want, driveLetter(mp), mp)
	}
}

// FuzzParseBinfmt: any entry text parses without panicking, and an entry
// Find reports is enabled: its first line, spaces aside, says so (the
// kernel writes it bare; read leniently, a door errs on the side of
// being closed).
func FuzzParseBinfmt(f *testing.F) {
	f.Add(wslInterop)
	f.Add("disabled\ninterpreter /init\nflags: P\n")
	f.Add("enabled\nmagic 4D5A\ninterpreter")
	f.Fuzz(func(t *testing.T, s string) {
		e := parseBinfmt(s)
		doors, _ := Find(Sources{Binfmt: map[string]string{"WSLInterop": s}})
		first, _, _ := strings.Cut(s, "\n")
		if len(doors) > 0 && (!e.enabled || strings.TrimSpace(first) != "enabled") {
			t.Fatalf("door for a disabled entry %q", s)
		}
	})
}

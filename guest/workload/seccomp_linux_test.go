package workload

import (
	"bufio"
	"encoding/binary"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"
)

// eval runs the filter in x/net/bpf's interpreter. Its loads are big-endian
// while the kernel's seccomp_data is native (little-endian here), so every
// 32-bit word is written big-endian: a 4-byte load then reads the value the
// kernel's would.
func eval(t testing.TB, prog []bpf.Instruction, arch, nr uint32, args ...uint64) uint32 {
	t.Helper()
	vm, err := bpf.NewVM(prog)
	require.NoError(t, err)
	data := make([]byte, 64)
	binary.BigEndian.PutUint32(data[offNR:], nr)
	binary.BigEndian.PutUint32(data[offArch:], arch)
	for i, a := range args {
		binary.BigEndian.PutUint32(data[offArg0+8*i:], uint32(a))
		binary.BigEndian.PutUint32(data[offArg0+8*i+4:], uint32(a>>32))
	}
	ret, err := vm.Run(data)
	require.NoError(t, err)
	return uint32(ret)
}

// want is the policy written out plainly, the reference the program is
// checked against.
func want(c abi, nr uint32, arg0 uint64) uint32 {
	if c.x32 && nr >= x32Bit {
		return retKill
	}
	for name, n := range c.nr {
		if n != nr {
			continue
		}
		switch {
		case slices.Contains(Denied, name):
			return retErrno(unix.EPERM)
		case slices.Contains(ENOSYSCalls, name):
			return retErrno(unix.ENOSYS)
		case slices.Contains(NewUserNSCalls, name) && arg0&unix.CLONE_NEWUSER != 0:
			return retErrno(unix.EPERM)
		case slices.Contains(SocketCalls, name) && uint32(arg0) == unix.AF_VSOCK:
			return retErrno(unix.EAFNOSUPPORT)
		case slices.Contains(SocketcallCalls, name) && uint32(arg0) == sysSocket:
			return retErrno(unix.ENOSYS)
		}
	}
	return retAllow
}

func TestFilterDeniesTheListOnEveryConventionOfTheArch(t *testing.T) {
	for _, goarch := range []string{"amd64", "arm64"} {
		prog, err := Filter(goarch)
		require.NoError(t, err)
		_, err = bpf.Assemble(prog)
		require.NoError(t, err, "the kernel's classic BPF encoding")
		for _, c := range abis(goarch) {
			for _, name := range Denied {
				nr, ok := c.nr[name]
				if !ok {
					assert.Contains(t, c.absent, name, "%s: %s has no number", c.name, name)
					continue
				}
				assert.Equal(t, retErrno(unix.EPERM), eval(t, prog, c.audit, nr), "%s %s", c.name, name)
			}
			for _, name := range NewUserNSCalls {
				nr := c.nr[name]
				assert.Equal(t, retErrno(unix.EPERM), eval(t, prog, c.audit, nr, unix.CLONE_NEWUSER), "%s %s(CLONE_NEWUSER)", c.name, name)
				assert.Equal(t, retErrno(unix.EPERM), eval(t, prog, c.audit, nr, unix.CLONE_NEWUSER|unix.CLONE_NEWNS|unix.CLONE_NEWPID), "%s %s with more flags", c.name, name)
				assert.Equal(t, retAllow, eval(t, prog, c.audit, nr, unix.CLONE_NEWNS|unix.CLONE_VM|uint64(unix.SIGCHLD)), "%s %s without CLONE_NEWUSER", c.name, name)
				assert.Equal(t, retAllow, eval(t, prog, c.audit, nr, 0), "%s %s(0)", c.name, name)
			}
			assert.Equal(t, retErrno(unix.ENOSYS), eval(t, prog, c.audit, c.nr["clone3"]), "%s clone3", c.name)
			// The workload gets no vsock: the host's services are behind it.
			assert.Equal(t, retErrno(unix.EAFNOSUPPORT), eval(t, prog, c.audit, c.nr["socket"], unix.AF_VSOCK), "%s socket(AF_VSOCK)", c.name)
			for _, family := range []uint64{unix.AF_UNIX, unix.AF_INET, unix.AF_INET6, unix.AF_NETLINK} {
				assert.Equal(t, retAllow, eval(t, prog, c.audit, c.nr["socket"], family), "%s socket(%d)", c.name, family)
			}
			if nr, ok := c.nr["socketcall"]; ok {
				assert.Equal(t, retErrno(unix.ENOSYS), eval(t, prog, c.audit, nr, sysSocket), "%s socketcall(SYS_SOCKET)", c.name)
				assert.Equal(t, retAllow, eval(t, prog, c.audit, nr, 3), "%s socketcall(SYS_CONNECT)", c.name)
			}
			// Everyday calls pass: read, write, openat, getpid and friends
			// are never in the list, whatever their number.
			for nr := uint32(0); nr < 64; nr++ {
				assert.Equal(t, want(c, nr, 0), eval(t, prog, c.audit, nr), "%s nr %d", c.name, nr)
			}
		}
	}
}

func TestFilterKillsForeignArchesAndX32(t *testing.T) {
	prog, err := Filter("amd64")
	require.NoError(t, err)
	for _, arch := range []uint32{unix.AUDIT_ARCH_AARCH64, unix.AUDIT_ARCH_ARM, 0, 0xffffffff, unix.AUDIT_ARCH_X86_64 &^ 0x80000000} {
		assert.Equal(t, retKill, eval(t, prog, arch, 0), "arch %#x", arch)
	}
	// x32: the same arch value, the number with bit 30 set; its own numbers
	// would otherwise dodge the list (x32 ptrace is 521).
	for _, nr := range []uint32{x32Bit, x32Bit | 521, x32Bit | 39, 0xffffffff} {
		assert.Equal(t, retKill, eval(t, prog, unix.AUDIT_ARCH_X86_64, nr), "x32 nr %#x", nr)
	}
	arm, err := Filter("arm64")
	require.NoError(t, err)
	for _, arch := range []uint32{unix.AUDIT_ARCH_X86_64, unix.AUDIT_ARCH_I386} {
		assert.Equal(t, retKill, eval(t, arm, arch, 0), "arch %#x on arm64", arch)
	}
	// arm64 has no x32: a high number is just an unknown call the kernel
	// answers ENOSYS.
	assert.Equal(t, retAllow, eval(t, arm, unix.AUDIT_ARCH_AARCH64, x32Bit|117))
	_, err = Filter("riscv64")
	assert.ErrorContains(t, err, "no system call table for riscv64")
}

// FuzzFilter checks the program against the plain policy for any
// seccomp_data: it never allows a listed call under any numbering, and
// never refuses one that is not listed.
func FuzzFilter(f *testing.F) {
	f.Add(uint32(unix.AUDIT_ARCH_X86_64), uint32(101), uint64(0))
	f.Add(uint32(unix.AUDIT_ARCH_I386), uint32(120), uint64(unix.CLONE_NEWUSER))
	f.Add(uint32(unix.AUDIT_ARCH_AARCH64), uint32(97), uint64(unix.CLONE_NEWUSER|unix.CLONE_NEWNS))
	f.Add(uint32(unix.AUDIT_ARCH_ARM), uint32(26), uint64(1)<<40)
	f.Add(uint32(unix.AUDIT_ARCH_X86_64), uint32(x32Bit|101), uint64(0))
	progs := map[string][]bpf.Instruction{}
	for _, goarch := range []string{"amd64", "arm64"} {
		p, err := Filter(goarch)
		require.NoError(f, err)
		progs[goarch] = p
	}
	f.Fuzz(func(t *testing.T, arch, nr uint32, arg0 uint64) {
		for goarch, prog := range progs {
			expect := retKill
			for _, c := range abis(goarch) {
				if c.audit == arch {
					expect = want(c, nr, arg0)
				}
			}
			if got := eval(t, prog, arch, nr, arg0); got != expect {
				t.Fatalf("%s: arch %#x nr %d arg0 %#x: got %#x, want %#x", goarch, arch, nr, arg0, got, expect)
			}
		}
	})
}

// TestSyscallTablesMatchTheKernelHeaders compares every number in the
// tables with golang.org/x/sys's, generated from the kernel's headers for
// each architecture.
func TestSyscallTablesMatchTheKernelHeaders(t *testing.T) {
	out, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", "golang.org/x/sys").Output()
	require.NoError(t, err, "go list golang.org/x/sys")
	dir := filepath.Join(strings.TrimSpace(string(out)), "unix")
	for file, c := range map[string]abi{
		"zsysnum_linux_amd64.go": abiX86_64, "zsysnum_linux_386.go": abiI386,
		"zsysnum_linux_arm64.go": abiAArch64, "zsysnum_linux_arm.go": abiARM,
	} {
		headers := readSysnum(t, filepath.Join(dir, file))
		for _, name := range filterNames() {
			n, ok := headers[name]
			if slices.Contains(c.absent, name) {
				assert.False(t, ok, "%s: %s is listed absent but the headers have it", c.name, name)
				continue
			}
			require.True(t, ok, "%s: no %s in %s", c.name, name, file)
			assert.Equal(t, n, c.nr[name], "%s %s", c.name, name)
		}
		assert.Len(t, c.nr, len(filterNames())-len(c.absent), "%s: no number beyond the policy's", c.name)
	}
}

var sysnumLine = regexp.MustCompile(`^\s*SYS_([A-Z0-9_]+)\s*=\s*(\d+)`)

func readSysnum(t *testing.T, path string) map[string]uint32 {
	t.Helper()
	f, err := os.Open(path)
	require.NoError(t, err)
	defer f.Close()
	m := map[string]uint32{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if s := sysnumLine.FindStringSubmatch(sc.Text()); s != nil {
			n, _ := strconv.ParseUint(s[2], 10, 32)
			m[strings.ToLower(s[1])] = uint32(n)
		}
	}
	require.NoError(t, sc.Err())
	return m
}

package netns

import (
	"context"
	"net"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func needRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() == 0 {
		return
	}
	if os.Getenv("CI") == "true" {
		t.Fatal("making a network namespace needs root (CAP_SYS_ADMIN): run the tests as root")
	}
	t.Skip("making a network namespace needs root (CAP_SYS_ADMIN): run the tests as root")
}

func TestANewNamespaceHasOnlyLoopbackUpAndKeepsItsSocketsToItself(t *testing.T) {
	needRoot(t)
	ns, err := New()
	require.NoError(t, err)
	defer ns.Close()

	var ifs []net.Interface
	require.NoError(t, ns.Do(func() (err error) { ifs, err = net.Interfaces(); return err }))
	require.Len(t, ifs, 1)
	assert.Equal(t, "lo", ifs[0].Name)
	assert.NotZero(t, ifs[0].Flags&net.FlagUp, "lo is up")

	ln, err := ns.Listen("tcp4", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	go func() {
		if c, err := ln.Accept(); err == nil {
			_, _ = c.Write([]byte("inside"))
			c.Close()
		}
	}()
	c, err := ns.DialContext(context.Background(), "tcp4", ln.Addr().String())
	require.NoError(t, err)
	b := make([]byte, 6)
	_, err = c.Read(b)
	require.NoError(t, err)
	assert.Equal(t, "inside", string(b))
	c.Close()

	_, err = net.Dial("tcp4", ln.Addr().String())
	assert.Error(t, err, "the agent's own loopback is another one")
}

func TestTheAgentsThreadsStayInItsOwnNamespace(t *testing.T) {
	needRoot(t)
	own, err := os.Readlink("/proc/self/ns/net")
	require.NoError(t, err)
	ns, err := New()
	require.NoError(t, err)
	defer ns.Close()
	for range 50 {
		require.NoError(t, ns.Do(func() error { return nil }))
	}
	// Every thread of the process is back in (or never left) the agent's
	// namespace.
	tasks, err := os.ReadDir("/proc/self/task")
	require.NoError(t, err)
	for _, task := range tasks {
		l, err := os.Readlink("/proc/self/task/" + task.Name() + "/ns/net")
		if err == nil {
			assert.Equal(t, own, l, "thread %s", task.Name())
		}
	}
}

func TestAChildStartedFromTheNamespaceSeesOnlyLoopback(t *testing.T) {
	needRoot(t)
	ns, err := New()
	require.NoError(t, err)
	defer ns.Close()
	var out []byte
	require.NoError(t, ns.Do(func() (err error) {
		out, err = exec.Command("cat", "/proc/net/dev").Output()
		return err
	}))
	var names []string
	for _, line := range strings.Split(string(out), "\n")[2:] {
		if n, _, ok := strings.Cut(line, ":"); ok {
			names = append(names, strings.TrimSpace(n))
		}
	}
	assert.Equal(t, []string{"lo"}, names)
}

func TestTheAgentsOwnNamespaceIsANilNS(t *testing.T) {
	var ns *NS
	assert.Nil(t, ns.File())
	ran := false
	require.NoError(t, ns.Do(func() error { ran = true; return nil }))
	assert.True(t, ran)
	assert.NoError(t, ns.Close())
}

package forward

import (
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/oac/sandbox-agent/api"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// echoOpener plays the guest: each forward stream is an in-memory pipe
// whose far end echoes, and records the guest ports asked for.
type echoOpener struct {
	mu    sync.Mutex
	ports []int
	wg    sync.WaitGroup
	hold  chan struct{} // when set, streams wait for it before echoing
}

func (o *echoOpener) OpenForward(port int, name string) (net.Conn, error) {
	o.mu.Lock()
	o.ports = append(o.ports, port)
	o.mu.Unlock()
	a, b := net.Pipe()
	o.wg.Add(1)
	go func() {
		defer o.wg.Done()
		defer b.Close()
		if o.hold != nil {
			<-o.hold
		}
		_, _ = io.Copy(b, b)
	}()
	return a, nil
}

type recorder struct {
	mu sync.Mutex
	ev []api.Event
}

func (r *recorder) emit(e api.Event) { r.mu.Lock(); r.ev = append(r.ev, e); r.mu.Unlock() }
func (r *recorder) messages() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for _, e := range r.ev {
		out = append(out, e.Message)
	}
	return out
}

func roundTrip(t *testing.T, network, addr, msg string) (string, error) {
	t.Helper()
	c, err := net.DialTimeout(network, addr, 5*time.Second)
	require.NoError(t, err)
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Write([]byte(msg)); err != nil {
		return "", err
	}
	buf := make([]byte, len(msg))
	_, err = io.ReadFull(c, buf)
	return string(buf), err
}

func TestTCPForwardCarriesConnectionsToTheGuestPort(t *testing.T) {
	rec := &recorder{}
	m := New(Config{Emit: rec.emit})
	o := &echoOpener{}
	m.SetOpener(o)
	info, err := m.Add(Spec{Listen: "127.0.0.1:0", GuestPort: 4096})
	require.NoError(t, err)
	assert.NotEqual(t, "127.0.0.1:0", info.Listen, "the bound port is reported")

	got, err := roundTrip(t, "tcp", info.Listen, "hello")
	require.NoError(t, err)
	assert.Equal(t, "hello", got)
	assert.Equal(t, []int{4096}, o.ports)
	assert.Equal(t, "http://"+info.Listen+"/global/health", m.URLFor("http://127.0.0.1:4096/global/health"))
	assert.Equal(t, "", m.URLFor("http://127.0.0.1:9999"), "no forward to that port")
	assert.Equal(t, "", m.URLFor("http://10.0.0.1:4096"), "not a guest loopback URL")
	require.Eventually(t, func() bool {
		return assert.ObjectsAreEqual([]api.ForwardInfo{{Listen: info.Listen, GuestPort: 4096}}, m.List())
	},
		5*time.Second, 5*time.Millisecond, "the closed connection is no longer counted")

	require.NoError(t, m.Remove(info.Listen))
	_, err = net.DialTimeout("tcp", info.Listen, time.Second)
	assert.Error(t, err, "no longer listening")
	assert.ErrorIs(t, m.Remove(info.Listen), ErrNotFound)
	m.Close()
	o.wg.Wait()
	assert.Equal(t, []string{"listening", "removed"}, rec.messages())
}

func TestUnixForwardIsOwnerOnlyAndHasNoURL(t *testing.T) {
	m := New(Config{})
	o := &echoOpener{}
	m.SetOpener(o)
	p := filepath.Join(t.TempDir(), "daemon.sock")
	info, err := m.Add(Spec{Listen: p, GuestPort: 4096})
	require.NoError(t, err)
	assert.Equal(t, p, info.Listen)
	st, err := os.Stat(p)
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o600), st.Mode().Perm())
	got, err := roundTrip(t, "unix", p, "over unix")
	require.NoError(t, err)
	assert.Equal(t, "over unix", got)
	assert.Equal(t, "", m.URLFor("http://127.0.0.1:4096"))
	m.Close()
	o.wg.Wait()
	_, err = os.Stat(p)
	assert.True(t, os.IsNotExist(err), "the socket is removed")
}

func TestWithoutAGuestConnectionsAreClosedAndReported(t *testing.T) {
	rec := &recorder{}
	m := New(Config{Emit: rec.emit})
	info, err := m.Add(Spec{Listen: "127.0.0.1:0", GuestPort: 4096})
	require.NoError(t, err)
	_, err = roundTrip(t, "tcp", info.Listen, "x")
	assert.Error(t, err, "closed: nothing to carry it to")
	m.Close()
	assert.Contains(t, rec.messages(), "connection refused: no guest is connected")
}

type failingOpener struct{}

func (failingOpener) OpenForward(int, string) (net.Conn, error) {
	return nil, errors.New("session shutdown")
}

func TestAFailedStreamOpenClosesTheConnection(t *testing.T) {
	rec := &recorder{}
	m := New(Config{Emit: rec.emit})
	m.SetOpener(failingOpener{})
	info, err := m.Add(Spec{Listen: "127.0.0.1:0", GuestPort: 4096})
	require.NoError(t, err)
	_, err = roundTrip(t, "tcp", info.Listen, "x")
	assert.Error(t, err)
	m.Close()
	assert.Contains(t, rec.messages(), "connection refused: session shutdown")
}

func TestConnectionsOverTheLimitAreClosedAtOnce(t *testing.T) {
	rec := &recorder{}
	m := New(Config{Emit: rec.emit, MaxStreams: 1})
	o := &echoOpener{hold: make(chan struct{})}
	m.SetOpener(o)
	info, err := m.Add(Spec{Listen: "127.0.0.1:0", GuestPort: 4096})
	require.NoError(t, err)
	held, err := net.Dial("tcp", info.Listen)
	require.NoError(t, err)
	require.Eventually(t, func() bool { return m.List()[0].Active == 1 }, 5*time.Second, 5*time.Millisecond)
	require.Eventually(t, func() bool { o.mu.Lock(); defer o.mu.Unlock(); return len(o.ports) == 1 }, 5*time.Second, 5*time.Millisecond)

	_, err = roundTrip(t, "tcp", info.Listen, "x")
	assert.Error(t, err, "over the limit: closed")
	assert.Contains(t, rec.messages(), "connection refused: 1 forwarded connections are open, the limit")
	close(o.hold)
	held.Close()
	m.Close()
	o.wg.Wait()
}

func TestAddRefusesDuplicatesAndNonLoopback(t *testing.T) {
	m := New(Config{})
	defer m.Close()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	addr := "127.0.0.1:" + strconv.Itoa(port)
	_, err = m.Add(Spec{Listen: addr, GuestPort: 1})
	require.NoError(t, err)
	_, err = m.Add(Spec{Listen: addr, GuestPort: 2})
	assert.ErrorIs(t, err, ErrExists)
	_, err = m.Add(Spec{Listen: "0.0.0.0:0", GuestPort: 2})
	assert.ErrorContains(t, err, "only host loopback")
	m.Close()
	_, err = m.Add(Spec{Listen: "127.0.0.1:0", GuestPort: 2})
	assert.ErrorIs(t, err, ErrClosed)
}

func TestParseSpec(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want Spec
		err  string
	}{
		{"127.0.0.1:8080=4096", Spec{"127.0.0.1:8080", 4096}, ""},
		{"127.0.0.1:0=4096", Spec{"127.0.0.1:0", 4096}, ""},
		{"[::1]:8080=22", Spec{"[::1]:8080", 22}, ""},
		{"127.1.2.3:80=80", Spec{"127.1.2.3:80", 80}, ""},
		{"/run/oac/x=y.sock=4096", Spec{"/run/oac/x=y.sock", 4096}, ""},
		{"127.0.0.1:8080", Spec{}, "want LISTEN=GUESTPORT"},
		{"127.0.0.1:8080=0", Spec{}, "guest port"},
		{"127.0.0.1:8080=65536", Spec{}, "guest port"},
		{"127.0.0.1:8080=04096", Spec{}, "guest port"},
		{"127.0.0.1:8080=+1", Spec{}, "guest port"},
		{"127.0.0.1:8080= 1", Spec{}, "guest port"},
		{"0.0.0.0:8080=4096", Spec{}, "only host loopback"},
		{"10.0.0.1:8080=4096", Spec{}, "only host loopback"},
		{"[fe80::1%lo]:8080=4096", Spec{}, "only host loopback"},
		{"localhost:8080=4096", Spec{}, "listen on 127.0.0.1:PORT"},
		{":8080=4096", Spec{}, "listen on 127.0.0.1:PORT"},
		{"127.0.0.1=4096", Spec{}, "listen on 127.0.0.1:PORT"},
		{"relative.sock=4096", Spec{}, "listen on 127.0.0.1:PORT"},
		{"/run/../etc/x=4096", Spec{}, "must be clean"},
		{"/run/a b=4096", Spec{}, "spaces"},
		{"=4096", Spec{}, "empty listen"},
	} {
		got, err := ParseSpec(tc.in)
		if tc.err != "" {
			assert.ErrorContains(t, err, tc.err, tc.in)
			continue
		}
		require.NoError(t, err, tc.in)
		assert.Equal(t, tc.want, got, tc.in)
		assert.Equal(t, tc.in, got.String())
	}
}

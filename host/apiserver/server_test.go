package apiserver

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/oac/sandbox-agent/api"
	"github.com/oac/sandbox-agent/internal/sockfile"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func echoHandler() Handler {
	return HandlerFunc(func(_ context.Context, c api.Command) (any, error) {
		if c.Cmd == api.CmdPushTime {
			return nil, errors.New("the guest does not support this")
		}
		return map[string]string{"did": c.Cmd}, nil
	})
}

func serve(t *testing.T, input string) []map[string]any {
	t.Helper()
	s := &Server{Sandbox: "sb", Handler: echoHandler()}
	var out []map[string]any
	err := s.ServeLines(context.Background(), strings.NewReader(input), func(a api.Answer) error {
		b, err := json.Marshal(a)
		require.NoError(t, err)
		var m map[string]any
		require.NoError(t, json.Unmarshal(b, &m))
		out = append(out, m)
		return nil
	})
	require.NoError(t, err)
	return out
}

func TestServeLinesAnswersEachCommandInOrder(t *testing.T) {
	out := serve(t, "{\"id\":\"1\",\"cmd\":\"status\"}\n\n  \r\n{\"id\":\"2\",\"cmd\":\"push_time\"}\r\n{\"cmd\":\"bogus\",\"id\":\"3\"}\n{\"id\":\"4\",\"cmd\":\"stop\"}")
	require.Len(t, out, 4, "blank lines are skipped; the last line needs no newline")
	assert.Equal(t, "answer", out[0]["event"])
	assert.Equal(t, "sb", out[0]["sandbox"])
	assert.Equal(t, "1", out[0]["id"])
	assert.Equal(t, "status", out[0]["command"])
	assert.Equal(t, true, out[0]["ok"])
	assert.Equal(t, map[string]any{"did": "status"}, out[0]["result"])
	assert.NotEmpty(t, out[0]["time"])

	assert.Equal(t, false, out[1]["ok"])
	assert.Equal(t, "the guest does not support this", out[1]["error"])
	assert.Equal(t, api.AnswerFailed, out[1]["code"], "a handler's error without a code of its own")
	assert.Nil(t, out[1]["result"])
	assert.Nil(t, out[0]["code"], "an answer that is ok has no code")

	assert.Equal(t, false, out[2]["ok"])
	assert.Equal(t, "3", out[2]["id"], "the id of a refused command is echoed when it decoded")
	assert.Nil(t, out[2]["command"])
	assert.Contains(t, out[2]["error"], "bad command: unknown command")
	assert.Equal(t, api.AnswerUnknownCommand, out[2]["code"])

	assert.Equal(t, "4", out[3]["id"])
}

func TestOverlongLinesAreAnsweredAndSkipped(t *testing.T) {
	long := `{"cmd":"status","id":"` + strings.Repeat("x", api.MaxLine) + `"}`
	out := serve(t, long+"\n"+`{"cmd":"status","id":"after"}`+"\n"+long)
	require.Len(t, out, 3)
	assert.Contains(t, out[0]["error"], "line longer than 65536 bytes")
	assert.Equal(t, api.AnswerInvalidCommand, out[0]["code"])
	assert.Equal(t, "after", out[1]["id"], "the next line is read normally")
	assert.Contains(t, out[2]["error"], "line longer than")
}

func TestAWriteErrorEndsServing(t *testing.T) {
	s := &Server{Handler: echoHandler()}
	err := s.ServeLines(context.Background(), strings.NewReader("{\"cmd\":\"status\"}\n{\"cmd\":\"status\"}\n"),
		func(api.Answer) error { return io.ErrClosedPipe })
	assert.ErrorIs(t, err, io.ErrClosedPipe)
}

func TestSocketServesConnectionsAndCapsThem(t *testing.T) {
	ln, err := sockfile.Listen(filepath.Join(t.TempDir(), "ctl.sock"))
	require.NoError(t, err)
	block := make(chan struct{})
	var once sync.Once
	s := &Server{Sandbox: "sb", Handler: HandlerFunc(func(ctx context.Context, c api.Command) (any, error) {
		if c.ID == "block" {
			<-block
		}
		return c.Cmd, nil
	})}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { s.ServeSocket(ctx, ln); close(done) }()
	defer func() { once.Do(func() { close(block) }); cancel(); <-done }()

	c, err := net.Dial("unix", ln.Addr().String())
	require.NoError(t, err)
	defer c.Close()
	_, err = c.Write([]byte(`{"id":"a","cmd":"status"}` + "\n"))
	require.NoError(t, err)
	var a api.Answer
	require.NoError(t, json.NewDecoder(c).Decode(&a))
	assert.True(t, a.OK)
	assert.Equal(t, "status", a.Result)

	// Fill every slot with a connection whose command blocks.
	var held []net.Conn
	for i := 0; i < MaxConns-1; i++ {
		hc, err := net.Dial("unix", ln.Addr().String())
		require.NoError(t, err)
		held = append(held, hc)
		_, err = hc.Write([]byte(`{"id":"block","cmd":"status"}` + "\n"))
		require.NoError(t, err)
	}
	require.Eventually(t, func() bool {
		extra, err := net.Dial("unix", ln.Addr().String())
		if err != nil {
			return false
		}
		defer extra.Close()
		_ = extra.SetReadDeadline(time.Now().Add(2 * time.Second))
		line, err := bufio.NewReader(extra).ReadString('\n')
		return err == nil && strings.Contains(line, "too many control connections") && strings.Contains(line, `"code":"limit_reached"`)
	}, 5*time.Second, 10*time.Millisecond)
	once.Do(func() { close(block) })
	for _, hc := range held {
		hc.Close()
	}
}

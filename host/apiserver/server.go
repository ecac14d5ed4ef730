package apiserver

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net"
	"sync"
	"time"

	"github.com/oac/sandbox-agent/api"
)

// MaxConns bounds the control socket's concurrent connections; the next
// one gets an error answer and is closed.
const MaxConns = 8

// Handler carries out decoded commands. Handle must be safe for
// concurrent use and return promptly (a stop is answered when it has been
// requested, not when it has finished).
type Handler interface {
	Handle(ctx context.Context, c api.Command) (result any, err error)
}

// HandlerFunc adapts a function to Handler.
type HandlerFunc func(ctx context.Context, c api.Command) (any, error)

// Handle calls f.
func (f HandlerFunc) Handle(ctx context.Context, c api.Command) (any, error) { return f(ctx, c) }

// Server serves commands for one sandbox.
type Server struct {
	Sandbox string
	Handler Handler
	Log     *slog.Logger
}

func (s *Server) log() *slog.Logger {
	if s.Log == nil {
		return slog.New(slog.DiscardHandler)
	}
	return s.Log
}

// answer runs one line and returns its answer.
func (s *Server) answer(ctx context.Context, line []byte, lineErr error) api.Answer {
	a := api.Answer{Time: time.Now().UTC(), Sandbox: s.Sandbox, Event: api.KindAnswer, SchemaVersion: api.SchemaVersion}
	if lineErr != nil {
		a.Error, a.Code = lineErr.Error(), api.AnswerInvalidCommand
		return a
	}
	c, err := api.Decode(line)
	a.ID, a.Command = c.ID, c.Cmd
	if err != nil {
		if !errors.Is(err, api.ErrBadCommand) {
			err = errors.Join(api.ErrBadCommand, err)
		}
		if ce := (*api.CommandError)(nil); !errors.As(err, &ce) {
			err = api.Refuse(api.AnswerInvalidCommand, err)
		}
		a.Command = ""
		if api.IsCommand(c.Cmd) {
			a.Command = c.Cmd
		}
		a.Error, a.Code = err.Error(), api.AnswerCode(err)
		return a
	}
	res, err := s.Handler.Handle(ctx, c)
	a.Time = time.Now().UTC()
	if err != nil {
		a.Error, a.Code = err.Error(), api.AnswerCode(err)
		return a
	}
	a.OK, a.Result = true, res
	return a
}

// ServeLines reads command lines from r and writes each answer with
// write, until r ends (it returns nil), ctx ends, or write fails. Blank
// lines are skipped; a line over api.MaxLine is answered with an error and
// skipped.
func (s *Server) ServeLines(ctx context.Context, r io.Reader, write func(api.Answer) error) error {
	br := bufio.NewReaderSize(r, 4096)
	for {
		line, lerr, err := readLine(br, api.MaxLine)
		if err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if lerr == nil && len(trimSpace(line)) == 0 {
			continue
		}
		if werr := write(s.answer(ctx, line, lerr)); werr != nil {
			return werr
		}
	}
}

// readLine reads one line of at most max bytes (without "\n" or "\r\n").
// A longer line is consumed and reported as lineErr; err is the reader's
// error (io.EOF only at the end of input, a last line without newline is
// returned first).
func readLine(br *bufio.Reader, max int) (line []byte, lineErr, err error) {
	var buf []byte
	tooLong := false
	for {
		frag, rerr := br.ReadSlice('\n')
		if !tooLong {
			if len(buf)+len(frag) > max+2 { // room for "\r\n"
				tooLong, buf = true, nil
			} else {
				buf = append(buf, frag...)
			}
		}
		if rerr == bufio.ErrBufferFull {
			continue
		}
		if rerr != nil && (rerr != io.EOF || (len(buf) == 0 && !tooLong)) {
			return nil, nil, rerr
		}
		break
	}
	if tooLong {
		return nil, errors.Join(api.ErrBadCommand, errors.New("line longer than 65536 bytes")), nil
	}
	if n := len(buf); n > 0 && buf[n-1] == '\n' {
		buf = buf[:n-1]
		if n := len(buf); n > 0 && buf[n-1] == '\r' {
			buf = buf[:n-1]
		}
	}
	if len(buf) > max {
		return nil, errors.Join(api.ErrBadCommand, errors.New("line longer than 65536 bytes")), nil
	}
	return buf, nil, nil
}

func trimSpace(b []byte) []byte {
	for len(b) > 0 && (b[0] == ' ' || b[0] == '\t' || b[0] == '\r') {
		b = b[1:]
	}
	for len(b) > 0 && (b[len(b)-1] == ' ' || b[len(b)-1] == '\t' || b[len(b)-1] == '\r') {
		b = b[:len(b)-1]
	}
	return b
}

// ServeSocket accepts connections on ln until ctx ends or ln is closed,
// serving each with ServeLines; answers go back on the connection. At
// most MaxConns connections are served at once. It returns when every
// connection it served has ended.
func (s *Server) ServeSocket(ctx context.Context, ln net.Listener) {
	var wg sync.WaitGroup
	defer wg.Wait()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var mu sync.Mutex
	conns := map[net.Conn]struct{}{}
	wg.Add(1)
	go func() {
		defer wg.Done()
		<-ctx.Done()
		ln.Close()
		mu.Lock()
		for c := range conns {
			c.Close()
		}
		mu.Unlock()
	}()
	sem := make(chan struct{}, MaxConns)
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		select {
		case sem <- struct{}{}:
		default:
			_ = c.SetWriteDeadline(time.Now().Add(time.Second))
			_ = json.NewEncoder(c).Encode(api.Answer{Time: time.Now().UTC(), Sandbox: s.Sandbox, Event: api.KindAnswer, SchemaVersion: api.SchemaVersion,
				Error: "too many control connections", Code: api.AnswerLimitReached})
			c.Close()
			continue
		}
		mu.Lock()
		conns[c] = struct{}{}
		mu.Unlock()
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			defer func() {
				mu.Lock()
				delete(conns, c)
				mu.Unlock()
				c.Close()
			}()
			enc := json.NewEncoder(c)
			enc.SetEscapeHTML(false)
			err := s.ServeLines(ctx, c, func(a api.Answer) error {
				_ = c.SetWriteDeadline(time.Now().Add(10 * time.Second))
				return enc.Encode(a)
			})
			if err != nil && ctx.Err() == nil && !errors.Is(err, net.ErrClosed) {
				s.log().Debug("control connection ended", "err", err)
			}
		}()
	}
}

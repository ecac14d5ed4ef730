//go:build unix || windows

package wsl

import (
	"context"
	"errors"
	"io"
	"strings"
	"sync"
)

// fakeRunner answers wsl.exe commands from a table and records them.
type fakeRunner struct {
	mu      sync.Mutex
	calls   [][]string
	distros map[string]bool
	version string // "" fails --version
	fail    map[string]string
	started *fakeProc
}

func newFakeRunner() *fakeRunner {
	return &fakeRunner{distros: map[string]bool{}, version: "WSL version: 2.1.5.0\r\n", fail: map[string]string{}}
}

func (r *fakeRunner) Output(ctx context.Context, args ...string) ([]byte, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.calls = append(r.calls, args)
	if msg, ok := r.fail[args[0]]; ok {
		return utf16LE(msg, false), errors.New("exit status 1")
	}
	switch args[0] {
	case "--version":
		if r.version == "" {
			return []byte("Invalid command line option: --version"), errors.New("exit status 1")
		}
		return utf16LE(r.version, false), nil
	case "--list":
		var names []string
		for n := range r.distros {
			names = append(names, n)
		}
		if len(names) == 0 {
			return utf16LE("Error code: Wsl/WSL_E_DEFAULT_DISTRO_NOT_FOUND\r\n", false), errors.New("exit status 4294967295")
		}
		return utf16LE(strings.Join(names, "\r\n")+"\r\n", false), nil
	case "--import":
		if r.distros[args[1]] {
			return utf16LE("Error code: Wsl/Service/RegisterDistro/ERROR_ALREADY_EXISTS", false), errors.New("exit status 1")
		}
		r.distros[args[1]] = true
	case "--unregister", "--terminate":
		if !r.distros[args[1]] {
			return utf16LE("Error code: Wsl/Service/WSL_E_DISTRO_NOT_FOUND", false), errors.New("exit status 1")
		}
		if args[0] == "--unregister" {
			delete(r.distros, args[1])
		}
		if r.started != nil {
			r.started.Kill()
		}
	}
	return nil, nil
}

func (r *fakeRunner) Start(args []string, stderr io.Writer) (Process, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.calls = append(r.calls, args)
	inR, inW := io.Pipe()
	outR, outW := io.Pipe()
	p := &fakeProc{in: inW, out: outR, inR: inR, outW: outW, exit: make(chan struct{})}
	r.started = p
	return p, nil
}

func (r *fakeRunner) commands() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for _, c := range r.calls {
		out = append(out, strings.Join(c, " "))
	}
	return out
}

type fakeProc struct {
	in   *io.PipeWriter
	out  *io.PipeReader
	inR  *io.PipeReader
	outW *io.PipeWriter
	once sync.Once
	exit chan struct{}
}

func (p *fakeProc) Stdin() io.WriteCloser { return p.in }
func (p *fakeProc) Stdout() io.ReadCloser { return p.out }
func (p *fakeProc) Wait() error           { <-p.exit; return errors.New("signal: killed") }
func (p *fakeProc) Kill() error {
	p.once.Do(func() { p.outW.Close(); p.inR.Close(); close(p.exit) })
	return nil
}
func (p *fakeProc) Pid() int { return 4242 }

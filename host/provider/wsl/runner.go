package wsl

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
)

// Runner runs wsl.exe. The provider never executes anything else, so tests
// replace it (or point ExecRunner at a fake wsl.exe).
type Runner interface {
	// Output runs wsl.exe with args to completion and returns what it
	// printed (stdout and stderr, raw: see decode).
	Output(ctx context.Context, args ...string) ([]byte, error)
	// Start starts wsl.exe with args, its stdin and stdout connected to
	// the returned Process, its stderr copied to stderr.
	Start(args []string, stderr io.Writer) (Process, error)
}

// Process is a started wsl.exe.
type Process interface {
	// Stdin writes to the process; Stdout reads from it.
	Stdin() io.WriteCloser
	Stdout() io.ReadCloser
	// Wait waits for the exit (once).
	Wait() error
	Kill() error
	Pid() int
}

// ExecRunner runs the wsl.exe binary at Path.
type ExecRunner struct{ Path string }

func (r ExecRunner) command(ctx context.Context, args []string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, r.Path, args...)
	// WSL_UTF8=1 asks wsl.exe for UTF-8 instead of UTF-16LE output.
	cmd.Env = append(os.Environ(), "WSL_UTF8=1")
	cmd.SysProcAttr = sysProcAttr()
	return cmd
}

// Output implements Runner.
func (r ExecRunner) Output(ctx context.Context, args ...string) ([]byte, error) {
	var out bytes.Buffer
	cmd := r.command(ctx, args)
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	return out.Bytes(), err
}

// Start implements Runner. The pipes are the process's own files, so Wait
// returns when wsl.exe exits even if something it started holds them.
func (r ExecRunner) Start(args []string, stderr io.Writer) (Process, error) {
	cmd := r.command(context.Background(), args)
	inR, inW, err := os.Pipe()
	if err != nil {
		return nil, fmt.Errorf("wsl: stdin pipe: %w", err)
	}
	outR, outW, err := os.Pipe()
	if err != nil {
		inR.Close()
		inW.Close()
		return nil, fmt.Errorf("wsl: stdout pipe: %w", err)
	}
	errR, errW, err := os.Pipe()
	if err != nil {
		inR.Close()
		inW.Close()
		outR.Close()
		outW.Close()
		return nil, fmt.Errorf("wsl: stderr pipe: %w", err)
	}
	cmd.Stdin, cmd.Stdout, cmd.Stderr = inR, outW, errW
	err = cmd.Start()
	inR.Close()
	outW.Close()
	errW.Close()
	if err != nil {
		inW.Close()
		outR.Close()
		errR.Close()
		return nil, fmt.Errorf("start %s: %w", r.Path, err)
	}
	if stderr == nil {
		stderr = io.Discard
	}
	go func() {
		defer errR.Close()
		_, _ = io.Copy(stderr, errR)
	}()
	return &execProcess{cmd: cmd, stdin: inW, stdout: outR}, nil
}

type execProcess struct {
	cmd    *exec.Cmd
	stdin  *os.File
	stdout *os.File
}

func (p *execProcess) Stdin() io.WriteCloser { return p.stdin }
func (p *execProcess) Stdout() io.ReadCloser { return p.stdout }
func (p *execProcess) Wait() error           { return p.cmd.Wait() }
func (p *execProcess) Kill() error           { return p.cmd.Process.Kill() }
func (p *execProcess) Pid() int              { return p.cmd.Process.Pid }

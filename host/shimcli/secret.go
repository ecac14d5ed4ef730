package shimcli

import (
	"errors"
	"fmt"
	"io"
	"runtime"

	"github.com/oac/sandbox-agent/host/failure"
	"github.com/oac/sandbox-agent/protocol/bootstrap"
)

// passwordRule is what a caller is told when the password line breaks it.
var passwordRule = fmt.Sprintf("the first line of stdin is the daemon's password: %d to %d printable ASCII characters without spaces, then a newline",
	bootstrap.MinPassword, bootstrap.MaxPassword)

// readPasswordLine reads the daemon's password from the first line of r
// (--password-stdin) and returns it and r, positioned just after the
// line, for the bootstrap and the control commands that follow. It reads
// a byte at a time so that nothing after the line is taken from r, and at
// most bootstrap.MaxPassword+2 bytes (the password, a '\r' since "\r\n"
// ends a line too, and the '\n'). The line ends at a newline or at the
// end of r.
// Errors never carry the line's bytes.
func readPasswordLine(r io.Reader) (string, io.Reader, error) {
	if r == nil {
		return "", r, passwordError(errors.New("stdin ended before the password line"))
	}
	buf := make([]byte, 0, bootstrap.MaxPassword+1)
	one := make([]byte, 1)
	for {
		n, err := r.Read(one)
		if n == 1 {
			if one[0] == '\n' {
				break
			}
			if len(buf) == cap(buf) {
				return "", r, passwordError(fmt.Errorf("the first line of stdin is longer than %d characters", bootstrap.MaxPassword))
			}
			buf = append(buf, one[0])
			continue
		}
		if errors.Is(err, io.EOF) {
			if len(buf) == 0 {
				return "", r, passwordError(errors.New("stdin ended before the password line"))
			}
			break
		}
		if err != nil {
			return "", r, passwordError(fmt.Errorf("read stdin: %w", err))
		}
	}
	if l := len(buf); l > 0 && buf[l-1] == '\r' {
		buf = buf[:l-1]
	}
	if err := checkPassword(buf); err != nil {
		return "", r, passwordError(err)
	}
	return string(buf), r, nil
}

// checkPassword says which password rule p breaks, naming a position and
// a kind of character but never a character.
func checkPassword(p []byte) error {
	for i, c := range p {
		switch {
		case c == ' ':
			return fmt.Errorf("character %d of the password line is a space", i+1)
		case c >= 0x80:
			return fmt.Errorf("character %d of the password line is not ASCII", i+1)
		case c < 0x20 || c == 0x7f:
			return fmt.Errorf("character %d of the password line is a control character", i+1)
		}
	}
	if len(p) < bootstrap.MinPassword || len(p) > bootstrap.MaxPassword {
		return fmt.Errorf("the password line has %d characters", len(p))
	}
	if !bootstrap.ValidPassword(string(p)) {
		// The rules above are the bootstrap's; this is a guard against
		// the two drifting apart.
		return errors.New("the password line breaks the bootstrap's password rules")
	}
	return nil
}

func passwordError(err error) error {
	return failure.With(failure.ErrInvalidConfig, fmt.Errorf("--password-stdin: %w (%s)", err, passwordRule))
}

// withPassword puts the password handed in on stdin into the bootstrap's
// credentials. It is the password of every attempt (a reset or a restart
// included): the caller made it and knows it, where a password the shim
// generates is new each attempt.
func withPassword(boot *bootstrap.Bootstrap, password string) (*bootstrap.Bootstrap, error) {
	if boot == nil || boot.Credentials == nil {
		return nil, failure.With(failure.ErrInvalidConfig, errors.New("--password-stdin: the bootstrap has no credentials to give the password to (add credentials with username_env and password_env, or drop --password-stdin)"))
	}
	if boot.Credentials.Password != "" {
		return nil, failure.With(failure.ErrInvalidConfig, errors.New("--password-stdin: the bootstrap carries credentials.password too (drop one: the password on stdin, or the bootstrap's)"))
	}
	// Never the decoded struct's credentials themselves: a copy with the
	// password, as sandbox.Run does for a generated one.
	cc := *boot.Credentials
	cc.Password = password
	bb := *boot
	bb.Credentials = &cc
	return &bb, nil
}

// hostOS is the OS the shim runs on; a variable so that the Windows rules
// for inherited descriptors are tested on any host.
var hostOS = runtime.GOOS

// descriptorRefusal refuses a flag that reads or writes an inherited
// descriptor (--password-fd, --bootstrap fd:N) on Windows, where a Go
// program inherits none beyond stdin, stdout and stderr; instead says
// what to use in its place. It returns nil on other OSes.
func descriptorRefusal(goos, flag, instead string) error {
	if goos != "windows" {
		return nil
	}
	return fmt.Errorf("%s: a program on Windows inherits no descriptor but stdin, stdout and stderr; %s", flag, instead)
}

package shimcli

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"

	"github.com/oac/sandbox-agent/host/failure"
	"github.com/oac/sandbox-agent/protocol/bootstrap"
)

// Bootstrap formats (--bootstrap-format).
const (
	formatOAC  = "oac"  // the Bootstrap (bootstrap.Decode)
	formatCore = "core" // Core's sandbox.Bootstrap (bootstrap.DecodeCore)
)

// parseFD reads a descriptor number given as N: 3 and up (0, 1 and 2 are
// stdin, the events and the diagnostics).
func parseFD(s string) (int, error) {
	n, err := strconv.Atoi(s)
	if err != nil || n < 3 {
		return 0, fmt.Errorf("%q is not a descriptor of 3 or more (0, 1 and 2 are stdin, the events and the diagnostics)", s)
	}
	return n, nil
}

// openFD returns the inherited descriptor fd, or an error when it is not
// open.
func openFD(fd int, what string) (*os.File, error) {
	f := os.NewFile(uintptr(fd), what)
	if f == nil {
		return nil, fmt.Errorf("%s: descriptor %d is not open", what, fd)
	}
	if _, err := f.Stat(); err != nil {
		return nil, fmt.Errorf("%s: descriptor %d is not open: %w", what, fd, err)
	}
	return f, nil
}

// bootstrapSource says where --bootstrap reads from: a file, "-" (stdin)
// or "fd:N" (an inherited descriptor). Only the file is a path on disk.
func bootstrapSource(v string) (fd int, stdin bool, err error) {
	switch {
	case v == "-":
		return 0, true, nil
	case strings.HasPrefix(v, "fd:"):
		fd, err := parseFD(strings.TrimPrefix(v, "fd:"))
		return fd, false, err
	}
	return 0, false, nil
}

// readBootstrap reads the bootstrap document from --bootstrap. From stdin
// with --control stdin, the document is the first JSON value and the
// command lines follow it: rest is what remains for the control API.
func readBootstrap(f *runFlags, stdin io.Reader) (data []byte, rest io.Reader, err error) {
	rest = stdin
	fd, fromStdin, _ := bootstrapSource(f.bootFile)
	var r io.Reader
	switch {
	case fromStdin && f.control == "stdin":
		return firstValue(stdin)
	case fromStdin:
		r = stdin
	case fd != 0:
		file, err := openFD(fd, "--bootstrap")
		if err != nil {
			return nil, rest, failure.With(failure.ErrInvalidConfig, err)
		}
		defer file.Close()
		r = file
	default:
		file, err := os.Open(f.bootFile)
		if err != nil {
			return nil, rest, failure.With(bootstrap.ErrInvalid, fmt.Errorf("read %s: %w", f.bootFile, err))
		}
		defer file.Close()
		r = file
	}
	data, err = io.ReadAll(io.LimitReader(r, bootstrap.MaxSize+1))
	if err != nil {
		return nil, rest, fmt.Errorf("%w: %v", bootstrap.ErrDecode, err)
	}
	return data, rest, nil
}

// firstValue reads one JSON value of at most bootstrap.MaxSize bytes from
// r and returns it and the rest of r.
func firstValue(r io.Reader) ([]byte, io.Reader, error) {
	lr := &io.LimitedReader{R: r, N: bootstrap.MaxSize + 1}
	dec := json.NewDecoder(lr)
	var raw json.RawMessage
	if err := dec.Decode(&raw); err != nil {
		if lr.N <= 0 {
			return nil, r, bootstrap.ErrTooLarge
		}
		var se *json.SyntaxError
		if errors.As(err, &se) {
			return nil, r, fmt.Errorf("%w: syntax error at byte %d", bootstrap.ErrDecode, se.Offset)
		}
		return nil, r, fmt.Errorf("%w: no bootstrap on stdin before the commands", bootstrap.ErrDecode)
	}
	return raw, io.MultiReader(dec.Buffered(), r), nil
}

// decodeBootstrap decodes data in the --bootstrap-format.
func decodeBootstrap(format string, data []byte) (*bootstrap.Bootstrap, error) {
	if format == formatCore {
		return bootstrap.DecodeCore(strings.NewReader(string(data)))
	}
	return bootstrap.Decode(strings.NewReader(string(data)))
}

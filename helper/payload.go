package helper

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"

	"github.com/oac/sandbox-agent/protocol/bootstrap"
)

// ErrTrailingInput is the stop cause when stdin carries anything but
// whitespace after the payload.
var ErrTrailingInput = errors.New("stdin: unexpected input after the payload (stdin carries one payload, then nothing until it closes)")

// ReadPayload reads the helper's payload from r: one JSON object in Core's
// shape ({runtime, sandbox_io}, bootstrap.DecodeCore's strict rules and
// named errors), at most bootstrap.MaxSize bytes, without waiting for r to
// end. It returns the mapped Bootstrap (not validated) and the rest of r:
// what follows the payload, which must be only whitespace until r ends.
func ReadPayload(r io.Reader) (*bootstrap.Bootstrap, io.Reader, error) {
	lim := &io.LimitedReader{R: r, N: bootstrap.MaxSize + 1}
	dec := json.NewDecoder(lim)
	var raw json.RawMessage
	if err := dec.Decode(&raw); err != nil {
		if lim.N == 0 {
			return nil, nil, bootstrap.ErrTooLarge
		}
		if errors.Is(err, io.EOF) {
			return nil, nil, fmt.Errorf("%w: stdin ended before a payload", bootstrap.ErrDecode)
		}
		// The decoder's own message may quote input: never a credential
		// in an event.
		return nil, nil, fmt.Errorf("%w: the payload is not one well-formed JSON object", bootstrap.ErrDecode)
	}
	if len(raw) > bootstrap.MaxSize {
		return nil, nil, bootstrap.ErrTooLarge
	}
	if len(raw) == 0 || raw[0] != '{' {
		return nil, nil, fmt.Errorf("%w: the payload must be a JSON object", bootstrap.ErrDecode)
	}
	b, err := bootstrap.DecodeCore(bytes.NewReader(raw))
	if err != nil {
		return nil, nil, err
	}
	return b, io.MultiReader(dec.Buffered(), r), nil
}

// WatchRest reads what follows the payload until it ends and returns nil
// at its end, ErrTrailingInput at the first byte that is not whitespace,
// or the read error.
func WatchRest(rest io.Reader) error {
	buf := make([]byte, 4096)
	for {
		n, err := rest.Read(buf)
		for _, c := range buf[:n] {
			if c != ' ' && c != '\t' && c != '\r' && c != '\n' {
				return ErrTrailingInput
			}
		}
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("stdin: %w", err)
		}
	}
}

package errmark

// With returns err marked as kind: errors.Is(result, kind) holds, as does
// every errors.Is and errors.As that held for err, and the message is
// err's alone. A nil err stays nil.
func With(kind, err error) error {
	if err == nil {
		return nil
	}
	return &marked{err: err, kind: kind}
}

type marked struct{ err, kind error }

func (m *marked) Error() string { return m.err.Error() }

func (m *marked) Unwrap() []error { return []error{m.err, m.kind} }

package client

import (
	"iter"

	"github.com/oac/sandbox-agent/api"
)

func iterPull(seq iter.Seq2[api.Event, error]) (func() (api.Event, error, bool), func()) {
	return iter.Pull2(seq)
}

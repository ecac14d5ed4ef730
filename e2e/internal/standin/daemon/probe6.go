package main

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"strings"
)

// probe6List is --probe6 NAME=URL (repeatable): a GET of URL with no
// proxy over IPv6 only (the dialer's network is tcp6, so a name is
// resolved with AAAA questions alone and the connection is an IPv6 one:
// only the resolver's IPv6 answers and the IPv6 capture can carry it).
// It prints "daemon: probe NAME=ok STATUS BODY" or "=error ERROR", as
// --probe does.
type probe6List []probe

func (l *probe6List) String() string { return "" }

func (l *probe6List) Set(v string) error {
	name, url, ok := strings.Cut(v, "=")
	if !ok || name == "" || url == "" {
		return fmt.Errorf("--probe6 %q: want NAME=URL", v)
	}
	*l = append(*l, probe{name, "direct6", url})
	return nil
}

func (p probe) run6() {
	result := func(format string, args ...any) { say("probe %s="+format, append([]any{p.name}, args...)...) }
	var d net.Dialer
	tr := &http.Transport{Proxy: nil, DisableKeepAlives: true,
		DialContext: func(ctx context.Context, _, addr string) (net.Conn, error) { return d.DialContext(ctx, "tcp6", addr) }}
	getProbe(tr, p.target, result)
}

// Command demo-upstream is the loopback HTTP server `make demo` starts on
// the host, so the demo shows an allowed egress request without the
// internet. It listens on 127.0.0.1 only, prints its address on the first
// line of stdout, and answers every request with one line of text.
package main

import (
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"strings"
)

func main() {
	listen := flag.String("listen", "127.0.0.1:0", "address to listen on (loopback only)")
	flag.Parse()
	host, _, err := net.SplitHostPort(*listen)
	if err != nil || !net.ParseIP(host).IsLoopback() {
		fmt.Fprintln(os.Stderr, "demo-upstream: --listen must be a loopback HOST:PORT, e.g. 127.0.0.1:0")
		os.Exit(2)
	}
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		fmt.Fprintln(os.Stderr, "demo-upstream:", err)
		os.Exit(1)
	}
	fmt.Println(ln.Addr().String())
	err = http.Serve(ln, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		fmt.Fprintf(w, "hello from the demo upstream on the host's loopback: %s %s%s (%s)\n",
			r.Method, r.Host, r.URL.Path, strings.TrimSpace(r.UserAgent()))
	}))
	fmt.Fprintln(os.Stderr, "demo-upstream:", err)
	os.Exit(1)
}

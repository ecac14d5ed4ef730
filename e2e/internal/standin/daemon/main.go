// Command daemon is a TEST FIXTURE standing in for the product's daemon
// (the real one is not part of this repository). It serves GET
// /global/health behind HTTP Basic auth with the credentials from
// OAC_SERVER_USERNAME and OAC_SERVER_PASSWORD, and prints what the boot
// contract promises it as "daemon: key=value" lines (never the password,
// only its SHA-256).
//
//	daemon serve --hostname 127.0.0.1 --port 4096 [--healthy-after-requests N] [--never-healthy] [--marker X]
//
// Until N authenticated health requests arrived it answers 503 (so a test
// can see that ready waits for health); with --never-healthy always 503.
// SIGTERM or SIGINT: it exits 0.
package main

import (
	"crypto/sha256"
	"encoding/hex"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"sort"
	"strings"
	"sync/atomic"
	"syscall"
)

func say(format string, args ...any) { fmt.Printf("daemon: "+format+"\n", args...) }

func main() {
	if len(os.Args) < 2 || os.Args[1] != "serve" {
		fmt.Fprintln(os.Stderr, "usage: daemon serve --hostname H --port P [--healthy-after-requests N] [--never-healthy]")
		os.Exit(2)
	}
	fs := flag.NewFlagSet("serve", flag.ExitOnError)
	host := fs.String("hostname", "127.0.0.1", "listen host")
	port := fs.String("port", "4096", "listen port")
	after := fs.Int64("healthy-after-requests", 1, "answer 200 from this authenticated request on")
	never := fs.Bool("never-healthy", false, "always answer 503")
	_ = fs.String("marker", "", "ignored: lets tests find this process on the host")
	_ = fs.Parse(os.Args[2:])

	user, pass := os.Getenv("OAC_SERVER_USERNAME"), os.Getenv("OAC_SERVER_PASSWORD")
	if user == "" || pass == "" {
		fmt.Fprintln(os.Stderr, "daemon: OAC_SERVER_USERNAME and OAC_SERVER_PASSWORD must be set")
		os.Exit(1)
	}
	groups, _ := os.Getgroups()
	say("ids=uid=%d gid=%d groups=%v", os.Getuid(), os.Getgid(), groups)
	sum := sha256.Sum256([]byte(pass))
	say("password-sha256=%s", hex.EncodeToString(sum[:]))
	say("password-in-argv=%v", strings.Contains(strings.Join(os.Args, " "), pass))
	var keys []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		keys = append(keys, k)
	}
	sort.Strings(keys)
	say("env-names=%s", strings.Join(keys, ","))

	var n atomic.Int64
	var denied atomic.Bool
	mux := http.NewServeMux()
	mux.HandleFunc("GET /global/health", func(w http.ResponseWriter, r *http.Request) {
		u, p, ok := r.BasicAuth()
		if !ok || u != user || p != pass {
			if !denied.Swap(true) {
				say("health=401 (wrong or missing credentials)")
			}
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		c := n.Add(1)
		if *never || c < *after {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		if c == *after {
			say("health=200 after %d authenticated request(s)", c)
		}
		_, _ = w.Write([]byte(`{"healthy":true}`))
	})
	ln, err := net.Listen("tcp", net.JoinHostPort(*host, *port))
	if err != nil {
		fmt.Fprintln(os.Stderr, "daemon:", err)
		os.Exit(1)
	}
	say("listening=%s", ln.Addr())
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
	go func() { _ = http.Serve(ln, mux) }()
	sig := <-sigs
	say("got %s, exiting", sig)
	os.Exit(0)
}

// Command shim-client is the runnable example of package client: a
// parent written in Go that drives one sandbox from start to ready, reaches
// its daemon through a forward with Basic auth, and stops it.
//
//	shim-client -shim bin/oac-shim -name demo -bootstrap examples/demo-bootstrap.json -- --provider bwrap ...
//
// Everything after "--" goes to `oac-shim run`. The bootstrap is handed
// to the shim on its stdin and the daemon's password is made here and
// handed over the same way (--password-stdin): it is in no file, argv,
// environment or event.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"time"

	"github.com/oac/sandbox-agent/api"
	"github.com/oac/sandbox-agent/client"
)

func main() {
	shim := flag.String("shim", "oac-shim", "the oac-shim binary")
	name := flag.String("name", "example", "sandbox name")
	boot := flag.String("bootstrap", "", "the bootstrap JSON file (required)")
	guestPort := flag.Int("guest-port", 4096, "the daemon's port inside the guest")
	healthPath := flag.String("path", "/global/health", "the daemon path to GET")
	timeout := flag.Duration("timeout", time.Minute, "give up after this long")
	flag.Parse()
	if err := run(*shim, *name, *boot, *guestPort, *healthPath, *timeout, flag.Args()); err != nil {
		fmt.Fprintln(os.Stderr, "shim-client:", err)
		if code := client.Code(err); code != "" {
			fmt.Fprintf(os.Stderr, "shim-client: code %s, a retry may help: %v\n", code, client.Retryable(err))
		}
		os.Exit(1)
	}
}

func run(shim, name, boot string, guestPort int, path string, timeout time.Duration, runArgs []string) error {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	if boot == "" {
		return fmt.Errorf("give the bootstrap file with -bootstrap")
	}
	bf, err := os.Open(boot)
	if err != nil {
		return err
	}
	defer bf.Close()

	// 1. start: oac-shim run --control stdin --password-stdin --bootstrap -.
	s, err := client.Start(ctx, client.Options{Shim: shim, Name: name, Bootstrap: bf, Stderr: os.Stderr, Args: runArgs})
	if err != nil {
		return err
	}
	defer s.Close(10 * time.Second)

	// 2. forward: a free port on the host's loopback to the daemon's port.
	fw, err := s.AddForward(ctx, "127.0.0.1:0", guestPort)
	if err != nil {
		return err
	}
	fmt.Printf("forward: %s -> guest 127.0.0.1:%d\n", fw.Listen, fw.GuestPort)

	// 3. ready: the event carries the host URL of the daemon (the forward's).
	ready, err := s.WaitState(ctx, api.StateReady)
	if err != nil {
		return err
	}
	fmt.Printf("ready: attempt %d, url %s (in the guest %s), user %s\n", ready.Attempt, ready.URL, ready.GuestURL, ready.Username)

	url := ready.URL
	if ready.GuestURL == "" { // ready came before the forward existed
		url = fw.URL
	}

	// 4. use it: Basic auth with the password the client made.
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url+path, nil)
	if err != nil {
		return err
	}
	req.SetBasicAuth(ready.Username, s.Password())
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	resp.Body.Close()
	fmt.Printf("GET %s: %d %s\n", path, resp.StatusCode, body)

	st, err := s.Status(ctx)
	if err != nil {
		return err
	}
	fmt.Printf("status: %s %s, %d forward(s)\n", st.ServerID, st.State, len(st.Forwards))

	// 5. stop: in order; the shim exits 0.
	if err := s.Stop(ctx); err != nil {
		return err
	}
	evs := s.History()
	last := evs[len(evs)-1]
	fmt.Printf("%s: %s\n", last.State, last.Message)
	return nil
}

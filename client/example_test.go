package client_test

import (
	"context"
	"fmt"
	"time"

	"github.com/oac/sandbox-agent/api"
	"github.com/oac/sandbox-agent/client"
)

// A parent drives one sandbox: start, wait for ready, reach the daemon
// through a forward, stop. examples/shim-client is the same as a program
// (the e2e tests run it against a real guest).
func Example() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s, err := client.Start(ctx, client.Options{
		Shim: "oac-shim", Name: "demo",
		Args: []string{"--provider", "bwrap", "--bootstrap", "examples/demo-bootstrap.json",
			"--password-file", "/run/user/1000/demo.password", "--forward", "127.0.0.1:0=4096"},
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	ready, err := s.WaitState(ctx, api.StateReady)
	if err != nil {
		fmt.Println(err)
		return
	}
	// ready.URL is the forward's address: http://127.0.0.1:PORT
	fmt.Println("daemon at", ready.URL, "as", ready.Username)
	if err := s.Stop(ctx); err != nil {
		fmt.Println(err)
	}
}

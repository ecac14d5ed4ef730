package client_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/oac/sandbox-agent/api"
	"github.com/oac/sandbox-agent/client"
)

// From Go: create a sandbox until it is ready, call its daemon with the
// password the client made, stop it. (The README's "from Go".)
func Example() {
	ctx := context.Background()
	boot, _ := os.Open("examples/demo-bootstrap.json")
	s, ready, err := client.StartReady(ctx, client.Options{Name: "demo", Bootstrap: boot, Forwards: []string{"127.0.0.1:0=4096"}})
	if err != nil {
		log.Fatal(err) // a *client.FailedError has the code; client.Retryable(err) says whether to retry
	}
	defer s.Stop(ctx) // in order; the shim exits 0
	req, _ := http.NewRequestWithContext(ctx, "GET", ready.URL+"/global/health", nil)
	req.SetBasicAuth(ready.Username, s.Password())
	resp, err := http.DefaultClient.Do(req)
	fmt.Println(resp.Status, err)
}

// Every event, from the oldest the client keeps, until the shim's output
// ends or ctx does.
func ExampleShim_Events() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s, err := client.Start(ctx, client.Options{Name: "demo", Provider: "bwrap", Bootstrap: strings.NewReader(`{"version": 1}`)})
	if err != nil {
		log.Fatal(err)
	}
	defer s.Kill()
	for e, err := range s.Events(ctx, client.From{}) {
		var missed *client.MissedError
		switch {
		case errors.As(err, &missed):
			fmt.Println("fell behind by", missed.Missed, "events")
		case err != nil:
			log.Fatal(err) // ctx ended
		case e.Event == api.KindState:
			fmt.Println(e.State, e.Message)
		}
	}
}

// A kept sandbox: made once, started as often as needed; what it writes
// in /home, /environment and /usr/local stays until reset or destroy.
func ExampleCreateKept() {
	ctx := context.Background()
	where := client.Sandboxes{} // oac-shim from PATH, the default keep root
	if err := client.CreateKept(ctx, where, client.KeptSpec{Name: "work", Provider: "bwrap"}); err != nil {
		log.Fatal(err)
	}
	boot, _ := os.Open("bootstrap.json")
	s, _, err := client.StartReady(ctx, client.Options{Name: "work", Kept: true, Bootstrap: boot})
	if err != nil {
		log.Fatal(err)
	}
	_ = s.Stop(ctx)
	list, _ := client.ListKept(ctx, where)
	fmt.Println(list.Sandboxes[0].State) // stopped
	_ = client.DestroyKept(ctx, where, "work")
}

// The events of oac-guest helper, which an E2B or microsandbox sandbox
// runs with no shim: read from the process's stdout stream (E2B's process
// API, `msb exec --stream`).
func ExampleHelperOutput() {
	var stdout = strings.NewReader("") // the exec stream's stdout
	out := client.NewHelperOutput(stdout)
	ready, err := out.WaitReady(nil)
	var fe *client.FailedError
	switch {
	case errors.As(err, &fe):
		fmt.Println("failed:", fe.Code, fe.Retryable())
	case err != nil:
		fmt.Println(err) // the stream broke the helper's contract, or was cut
	default:
		fmt.Println("daemon at", ready.URL, "as", ready.Username) // the password is the payload's
	}
}

// Four warm sandboxes kept for a web tier: each claim takes the oldest
// (or boots one, a miss) with the tenant's bootstrap, and the pool
// refills behind it.
func ExamplePool() {
	ctx := context.Background()
	pool, err := client.NewPool(ctx, client.PoolOptions{
		Options: client.Options{Name: "web", Provider: "bwrap"},
		Size:    4, MaxAge: 10 * time.Minute,
		OnEvent: func(e client.PoolEvent) { log.Printf("pool: %s %s (age %s)", e.Kind, e.Sandbox, e.Age) },
	})
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close(ctx) // stops the warm ones, not the claimed
	doc, _ := os.ReadFile("examples/demo-bootstrap.json")
	s, info, err := pool.Claim(ctx, client.ClaimRequest{Bootstrap: doc, Forwards: []api.ForwardSpec{{Listen: "127.0.0.1:0", GuestPort: 4096}}})
	if err != nil {
		log.Fatal(err)
	}
	defer s.Stop(ctx) // the caller's now
	fmt.Println(info.Hit, info.Result.Forwards[0].URL, len(s.Password()))
}

// Command readme-go is the README's "From Go", whole: a sandbox until
// ready, its daemon's health asked with the password the client made,
// stopped in order. The lines between the markers are the README's, word
// for word (scripts/readme_test.go holds them together); e2e runs it.
package main

import (
	"context"
	"fmt"
	"log"
	"net/http"
	"os"

	"github.com/oac/sandbox-agent/client"
)

func main() {
	// README: begin
	ctx := context.Background()
	boot, _ := os.Open("bootstrap.json") // the daemon, its health check, the Link
	s, ready, err := client.StartReady(ctx, client.Options{Name: "hello", Bootstrap: boot, Forwards: []string{"127.0.0.1:0=4096"}})
	if err != nil {
		log.Fatal(err) // client.Code(err), client.Retryable(err): what failed, and whether to retry
	}
	defer s.Stop(ctx) // in order; nothing is left
	req, _ := http.NewRequestWithContext(ctx, "GET", ready.URL+"/global/health", nil)
	req.SetBasicAuth(ready.Username, s.Password()) // made by the client, handed over on stdin
	resp, err := http.DefaultClient.Do(req)
	// README: end
	if err != nil {
		log.Print(err)
		return
	}
	resp.Body.Close()
	fmt.Println(resp.StatusCode)
}

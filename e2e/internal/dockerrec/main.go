//go:build linux

// Command dockerrec stands between the docker provider and the real docker
// client in the end-to-end tests: it appends its argv, as one JSON array a
// line, to $OAC_DOCKER_REC_LOG and execs the client at $OAC_DOCKER_REC_REAL
// with the same arguments, so a real engine runs every command and the
// tests can still assert the exact command lines.
package main

import (
	"encoding/json"
	"fmt"
	"os"
	"syscall"
)

func main() {
	log, real := os.Getenv("OAC_DOCKER_REC_LOG"), os.Getenv("OAC_DOCKER_REC_REAL")
	if log == "" || real == "" {
		fmt.Fprintln(os.Stderr, "dockerrec: OAC_DOCKER_REC_LOG and OAC_DOCKER_REC_REAL must be set")
		os.Exit(2)
	}
	f, err := os.OpenFile(log, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		fmt.Fprintln(os.Stderr, "dockerrec:", err)
		os.Exit(2)
	}
	b, _ := json.Marshal(os.Args[1:])
	_, _ = f.Write(append(b, '\n'))
	f.Close()
	err = syscall.Exec(real, append([]string{real}, os.Args[1:]...), os.Environ())
	fmt.Fprintln(os.Stderr, "dockerrec: exec", real+":", err)
	os.Exit(2)
}

package client

import (
	"bytes"
	"errors"
	"io"
	"strings"
	"testing"

	"github.com/oac/sandbox-agent/api"
)

// helperMarker stands for a secret the workload printed: its output
// passes through the helper's in the values of log lines and messages,
// and no error may quote a value. (Keys, kinds and states are the
// helper's own words: errors name them, cleaned and bounded.)
const helperMarker = "SECRET-fuzz-marker-0a1b2"

// FuzzHelperOutput feeds HelperOutput arbitrary bytes: the exec stream of
// a platform's sandbox is read by the host, and it trusts nothing in it.
// Seeds: the ones below and testdata/fuzz/FuzzHelperOutput.
func FuzzHelperOutput(f *testing.F) {
	log := `{"time":"2026-12-02T00:33:50.743348812Z","sandbox":"smoke","event":"log","schema_version":3,"mode":"helper","stream":"daemon/stdout","line":"` + helperMarker + `","attempt":1}` + "\n"
	for _, s := range []string{
		helperSession,
		helperFailed,
		log + helperSession,
		helperSession + log,
		strings.Replace(log, `"attempt":1`, `"attempt":1,"passwd":1`, 1),
		strings.Replace(log, `"event":"log"`, `"event":"answer"`, 1),
		strings.Replace(log, `"log"`, `"state","state":"paused"`, 1),
		strings.Replace(log, `"attempt":1`, `"attempt":1,"message":"`+helperMarker+`"`, 1),
		strings.Replace(log, `"attempt":1`, `"attempt":"`+helperMarker+`"`, 1),
		strings.Replace(helperFailed, `bootstrap: sandbox_io.link_url must be wss`, helperMarker, 1),
		helperMarker + "\n",
		"",
		"\n\n",
		"{}\n",
		strings.Repeat("[", 100) + "\n",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		h := NewHelperOutput(bytes.NewReader(data))
		sandbox := ""
		last := false
		for n := 0; ; n++ {
			e, err := h.Next()
			if errors.Is(err, io.EOF) {
				if !last {
					t.Fatal("io.EOF before the last state")
				}
				return
			}
			if err != nil {
				if strings.Contains(err.Error(), helperMarker) {
					t.Fatalf("an error quotes the output: %v", err)
				}
				var he *HelperError
				if !errors.As(err, &he) {
					t.Fatalf("not a *HelperError: %v", err)
				}
				if _, again := h.Next(); again != err {
					t.Fatalf("the error changed: %v, then %v", err, again)
				}
				return
			}
			if last {
				t.Fatal("an event after the last state")
			}
			if e.Mode != api.ModeHelper || e.SchemaVersion < 1 || e.SchemaVersion > api.SchemaVersion || e.Attempt > 1 || e.Time.IsZero() {
				t.Fatalf("an event that breaks the rules: %+v", e)
			}
			if sandbox != "" && e.Sandbox != sandbox {
				t.Fatal("two sandboxes")
			}
			sandbox = e.Sandbox
			last = e.Event == api.KindState && (e.State == api.StateStopped || e.State == api.StateFailed)
			if n > len(data) {
				t.Fatal("more events than bytes")
			}
		}
	})
}

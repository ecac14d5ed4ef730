package stage

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"time"
)

// JSONProgress writes each event as one JSON object per line (for the
// desktop app and logs).
func JSONProgress(w io.Writer) func(Event) {
	var mu sync.Mutex
	enc := json.NewEncoder(w)
	return func(e Event) {
		mu.Lock()
		defer mu.Unlock()
		_ = enc.Encode(e)
	}
}

// BarProgress draws one progress bar per download on a terminal,
// redrawing the current line, and ends it with a newline when the download
// ends.
func BarProgress(w io.Writer) func(Event) {
	var mu sync.Mutex
	var began time.Time
	var from int64
	return func(e Event) {
		mu.Lock()
		defer mu.Unlock()
		switch e.Event {
		case EventStart:
			began, from = e.Time, e.Bytes
			fmt.Fprintf(w, "\r%s", bar(e, 0))
		case EventProgress:
			rate := 0.0
			if d := e.Time.Sub(began).Seconds(); d > 0 {
				rate = float64(e.Bytes-from) / d
			}
			fmt.Fprintf(w, "\r%s", bar(e, rate))
		case EventWait:
			fmt.Fprintf(w, "%s: another oac-image is downloading it; waiting\n", e.Name)
		case EventRepair:
			fmt.Fprintf(w, "%s: %s\n", e.Name, e.Error)
		case EventRetry:
			fmt.Fprintf(w, "\n%s: the resumed file did not verify; downloading it again from the start from %s\n", e.Name, e.Mirror)
		case EventMirror:
			resume := ""
			if e.Bytes > 0 {
				resume = fmt.Sprintf(", resuming at byte %d", e.Bytes)
			}
			fmt.Fprintf(w, "\n%s: %s failed (%s: %s); trying %s%s\n", e.Name, e.Mirror, e.Code, e.Error, e.Next, resume)
		case EventDone:
			switch {
			case e.Cached:
				fmt.Fprintf(w, "%s: already staged (verified)\n", e.Name)
			case e.Shared:
				fmt.Fprintf(w, "%s: staged by another oac-image (verified)\n", e.Name)
			default:
				fmt.Fprintf(w, "\n%s: staged and verified\n", e.Name)
			}
		case EventError:
			fmt.Fprintf(w, "\n")
		}
	}
}

func bar(e Event, rate float64) string {
	const width = 30
	frac := 0.0
	if e.Total > 0 {
		frac = float64(e.Bytes) / float64(e.Total)
	}
	n := int(frac * width)
	s := fmt.Sprintf("%-24s [%s%s] %3.0f%% %s/%s", truncName(e.Name), strings.Repeat("#", n), strings.Repeat(".", width-n),
		frac*100, human(float64(e.Bytes)), human(float64(e.Total)))
	if rate > 0 {
		s += " " + human(rate) + "/s"
	}
	return s + "   "
}

func truncName(s string) string {
	if len(s) > 24 {
		return s[:21] + "..."
	}
	return s
}

func human(v float64) string {
	units := []string{"B", "KiB", "MiB", "GiB", "TiB"}
	i := 0
	for v >= 1024 && i < len(units)-1 {
		v /= 1024
		i++
	}
	if i == 0 {
		return fmt.Sprintf("%.0f %s", v, units[i])
	}
	return fmt.Sprintf("%.1f %s", v, units[i])
}

// IsTerminal reports whether f is a character device (a terminal, for the
// purpose of choosing a progress bar over JSON events).
func IsTerminal(f *os.File) bool {
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

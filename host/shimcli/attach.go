package shimcli

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/oac/sandbox-agent/internal/cli"
	"io"
	"net"
	"os"
	"strconv"
	"sync"
	"time"

	"github.com/oac/sandbox-agent/api"
	"github.com/oac/sandbox-agent/host/journal"
	"github.com/oac/sandbox-agent/host/kept"
	"github.com/oac/sandbox-agent/host/persist"
	"github.com/oac/sandbox-agent/host/provider/statedir"
)

// oac-shim attach NAME: the events of a sandbox whose shim outlives its
// parent (--outlive-parent), replayed from its journal and followed, and
// its control API through stdin and stdout, so a parent that restarted
// takes the sandbox up again with nothing but stdio (the same on every
// OS). It exits after the shim's final state: 0 after stopped, the
// failure's exit status after failed (as oac-shim run would), and
// api.ExitNotRunning or api.ExitShimDied when there is nothing to attach
// to or the shim died (said on stderr).

// Follow's poll of the journal: from attachPollMin, doubling to
// attachPollMax while nothing comes.
const (
	attachPollMin = 10 * time.Millisecond
	attachPollMax = 200 * time.Millisecond
)

func attachCmd(args []string, env cli.Env) int {
	stdin, stdout, stderr := env.Stdin, env.Stdout, env.Stderr
	fs := cli.FlagSet("oac-shim attach")
	keepRoot := fs.String("keep-root", "", "the keep root the sandbox runs under (default "+persist.DefaultRoot()+")")
	from := fs.String("from", "", `the seq to replay from, or "now" for the events after this moment only (default: the oldest the journal keeps)`)
	fs.String("name", "", "the sandbox's name, as a NAME argument (as the other commands take it)")
	args, code, ok := cli.Parse(fs, args, env)
	if !ok {
		return code
	}
	name, code := sandboxName("attach", fs, args, stderr)
	if name == "" {
		return code
	}
	opts := AttachOptions{Name: name}
	switch *from {
	case "":
	case "now":
		opts.Now = true
	default:
		n, err := strconv.ParseUint(*from, 10, 64)
		if err != nil || n == 0 {
			fmt.Fprintf(stderr, "oac-shim attach: --from takes a seq (1 or more) or \"now\", not %q\n", *from)
			return api.ExitUsage
		}
		opts.From = n
	}
	return Attach(kept.OpenRegistry(*keepRoot), opts, stdin, stdout, stderr)
}

// AttachOptions say what Attach replays.
type AttachOptions struct {
	Name string
	// From is the first seq to give (0: the oldest kept); Now: only the
	// events after the attach.
	From uint64
	Now  bool
	// following, when set, is called once the journal is open where the
	// replay starts (tests: what is written after it is given).
	following func()
}

// lineOut writes whole lines to the caller, events and answers in turn.
type lineOut struct {
	mu sync.Mutex
	w  io.Writer
}

func (o *lineOut) line(b []byte) {
	o.mu.Lock()
	defer o.mu.Unlock()
	_, _ = o.w.Write(b)
}

func (o *lineOut) json(v any) {
	b, err := json.Marshal(v)
	if err == nil {
		o.line(append(b, '\n'))
	}
}

// Attach replays and follows the journal of the sandbox opts names in
// reg, forwarding stdin's commands to its control socket, and returns
// the exit status (see attachCmd).
func Attach(reg *kept.Registry, opts AttachOptions, stdin io.Reader, stdout, stderr io.Writer) int {
	out := &lineOut{w: stdout}
	name := opts.Name
	// Pinned first: whatever the entry holds now (a live shim's journal,
	// or the one an ended shim left) stays until this attach is done with
	// it, whoever else attaches, lists or stops meanwhile.
	pin, err := reg.Pin(name)
	if err != nil {
		fmt.Fprintf(stderr, "oac-shim attach: no sandbox %s runs under %s (oac-shim list --running lists those that do)\n", name, reg.Root)
		return api.ExitNotRunning
	}
	defer pin.Close()
	dir := reg.EntryDir(name)
	var live *kept.Watched
	var left kept.Left
	w, err := openPublished(reg, name)
	switch {
	case err == nil:
		live = w
		defer live.Close()
	case errors.Is(err, os.ErrNotExist):
		left, err = reg.Leftover(name)
		if err != nil || !journal.Exists(left.Dir) {
			fmt.Fprintf(stderr, "oac-shim attach: no sandbox %s runs under %s (oac-shim list --running lists those that do)\n", name, reg.Root)
			return api.ExitNotRunning
		}
		dir = left.Dir
	default:
		fmt.Fprintf(stderr, "oac-shim attach: %s: %v\n", name, err)
		return api.ExitNotRunning
	}
	if live != nil && !journal.Exists(dir) {
		fmt.Fprintf(stderr, "oac-shim attach: the sandbox %s runs without --outlive-parent: it keeps no events to attach to (oac-shim stop %s stops it)\n", name, name)
		return api.ExitNotRunning
	}
	var r *journal.Reader
	if opts.Now {
		if r, err = journal.OpenAtEnd(dir); err != nil {
			fmt.Fprintf(stderr, "oac-shim attach: %s: %v\n", name, err)
			return 1
		}
	} else {
		r = journal.Open(dir, opts.From)
	}
	defer r.Close()
	if opts.following != nil {
		opts.following()
	}

	socket := ""
	if live != nil {
		socket = live.Record.ControlSocket
	}
	go forwardControl(name, socket, stdin, out, stderr)

	gone := func() bool { return live == nil || live.Gone() }
	wait := attachPollMin
	drained := false
	for {
		it, err := r.Next()
		if err == nil {
			wait = attachPollMin
			if it.Gap.To != 0 {
				out.json(lostEvent(name, it.Gap, opts.From))
				continue
			}
			out.line(it.Line)
			continue
		}
		if !errors.Is(err, io.EOF) {
			fmt.Fprintf(stderr, "oac-shim attach: %s: %v\n", name, err)
			return 1
		}
		if gone() {
			// What the shim wrote before it went: read to the end once
			// more, then it is all there is.
			if !drained {
				drained = true
				continue
			}
			break
		}
		time.Sleep(wait)
		wait = min(2*wait, attachPollMax)
	}
	return attachEnd(reg, name, r, live, left, pin, stderr)
}

// recordWait bounds the wait for the record of an entry whose shim has
// claimed it and not yet written it (an outliving shim claims its entry
// first, and publishes its record once it serves its control socket).
const recordWait = 2 * time.Second

// openPublished opens the live shim of name, waiting up to recordWait
// for a record it is about to write.
func openPublished(reg *kept.Registry, name string) (*kept.Watched, error) {
	deadline := time.Now().Add(recordWait)
	for {
		w, err := reg.Open(name)
		if !errors.Is(err, kept.ErrNoRecord) || time.Now().After(deadline) {
			return w, err
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// attachEnd says how the shim ended and gives the exit status.
func attachEnd(reg *kept.Registry, name string, r *journal.Reader, live *kept.Watched, left kept.Left, pin *statedir.Pinned, stderr io.Writer) int {
	if n := r.Torn(); n > 0 {
		fmt.Fprintf(stderr, "oac-shim attach: %s: the journal's last line is torn (%d bytes): its shim died while writing it\n", name, n)
	}
	if n := r.Damaged(); n > 0 {
		fmt.Fprintf(stderr, "oac-shim attach: %s: %d damaged journal lines were left out\n", name, n)
	}
	// After the shim went: its record is there when it was killed.
	if live != nil {
		if l, err := reg.Leftover(name); err == nil {
			left = l
		}
	}
	state, code := r.LastState()
	switch api.State(state) {
	case api.StateStopped, api.StateFailed:
		if left.Record == nil {
			// The shim ended in order and left its journal for the
			// attaches: read, it goes, unless another attach still
			// reads it (then that one removes it when done).
			pin.Close()
			reg.RemoveLeftover(name)
		}
		if api.State(state) == api.StateStopped {
			return api.ExitOK
		}
		return api.FailureOf(code).Exit
	}
	who := "its shim"
	if left.Record != nil {
		who = fmt.Sprintf("its shim (pid %d, started %s)", left.Record.PID, left.Record.Started.Format(time.RFC3339))
	}
	fmt.Fprintf(stderr, "oac-shim attach: the sandbox %s is gone: %s died without a final state (killed or crashed); the events above (to seq %d) are all it wrote. oac-shim list --running removes what it left\n",
		name, who, r.Last())
	return api.ExitShimDied
}

// lostEvent is the events_lost line of gap g.
func lostEvent(name string, g journal.Gap, from uint64) api.Event {
	msg := fmt.Sprintf("events %d to %d are not in the journal: its shim never wrote them whole", g.From, g.To)
	if from != 0 && g.From == from {
		msg = fmt.Sprintf("events %d to %d are older than the journal keeps (the newest %d MiB)", g.From, g.To, journal.Segments*journal.SegmentBytes>>20)
	}
	return api.Event{Time: time.Now().UTC(), Sandbox: name, Event: api.KindEventsLost, SchemaVersion: api.SchemaVersion,
		Seq: g.To, Message: msg, LostFrom: g.From, LostTo: g.To}
}

// forwardControl sends stdin's lines to the shim's control socket and
// its answers to the caller; with no shim to send them to, each command
// is answered with the error the shim would give a stopping one.
func forwardControl(name, socket string, stdin io.Reader, out *lineOut, stderr io.Writer) {
	why := "the shim has stopped"
	if socket != "" {
		c, err := net.DialTimeout("unix", socket, controlTimeout)
		if err == nil {
			defer c.Close()
			done := make(chan struct{})
			go func() {
				defer close(done)
				br := bufio.NewReaderSize(c, 64<<10)
				for {
					line, err := readBoundedLine(br, maxAnswer)
					if len(line) > 0 {
						out.line(line)
					}
					if err != nil {
						return
					}
				}
			}()
			_, err = io.Copy(c, stdin)
			if uc, ok := c.(*net.UnixConn); ok && err == nil {
				_ = uc.CloseWrite()
			}
			<-done
			return
		}
		why = fmt.Sprintf("its control socket does not answer: %v", err)
	}
	sc := bufio.NewScanner(stdin)
	sc.Buffer(make([]byte, 64<<10), api.MaxLine+1)
	for sc.Scan() {
		var c struct {
			ID  string `json:"id"`
			Cmd string `json:"cmd"`
		}
		_ = json.Unmarshal(sc.Bytes(), &c)
		out.json(api.Answer{Time: time.Now().UTC(), Sandbox: name, Event: api.KindAnswer, SchemaVersion: api.SchemaVersion,
			ID: c.ID, Command: c.Cmd, Error: "oac-shim attach: no command reaches the sandbox " + name + ": " + why, Code: api.AnswerStopping})
	}
}

// readBoundedLine reads one line of at most max bytes (a longer one is
// cut there and ends the reading).
func readBoundedLine(br *bufio.Reader, max int) ([]byte, error) {
	var line []byte
	for {
		frag, err := br.ReadSlice('\n')
		line = append(line, frag...)
		if len(line) > max {
			return nil, fmt.Errorf("an answer longer than %d bytes", max)
		}
		if !errors.Is(err, bufio.ErrBufferFull) {
			return line, err
		}
	}
}

package shimcli

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"os"
	"slices"
	"time"

	"github.com/oac/sandbox-agent/api"
	"github.com/oac/sandbox-agent/host/forward"
	"github.com/oac/sandbox-agent/host/kept"
	"github.com/oac/sandbox-agent/host/persist"
	"github.com/oac/sandbox-agent/host/provider"
	"github.com/oac/sandbox-agent/internal/cli"
	"github.com/oac/sandbox-agent/protocol/bootstrap"
)

// oac-shim claim NAME: the claim command (docs/warm.md) sent to the warm
// sandbox's control socket, found in the keep root's running sandboxes
// as oac-shim stop finds it; the answer's result is printed.

const claimHelp = `Claims the warm sandbox NAME (oac-shim run --warm with a control socket:
--control-socket PATH or --outlive-parent): its bootstrap, egress policy,
forwards and volumes, checked by the shim exactly as at run; a refused claim
leaves it warm. A provider that cannot mount a volume into a running guest
refuses a claim with --volume (unsupported).
Prints the answer's result (attempt, forwards, egress) as JSON (docs/warm.md).
`

// claimTimeout bounds the claim's answer: the shim checks it and binds
// its forwards, and hands it over within claimHandOver.
const claimTimeout = 10 * time.Second

func claimCmd(args []string, env cli.Env) int {
	stdin, stdout, stderr := env.Stdin, env.Stdout, env.Stderr
	fs := cli.FlagSet("oac-shim claim")
	keepRoot := fs.String("keep-root", "", "the keep root whose running sandbox to claim (default "+persist.DefaultRoot()+")")
	bootFile := fs.String("bootstrap", "", `the tenant's bootstrap JSON: a file, or "-" for stdin (required)`)
	var allow, upstreams, forwards stringList
	fs.Var(&allow, "allow", "egress rule HOST:PORT, *.SUFFIX:PORT or CIDR:PORT; repeatable")
	fs.Var(&upstreams, "upstream", "named egress upstream NAME:PORT=ADDR; repeatable")
	fs.Var(&forwards, "forward", "LISTEN=GUESTPORT, as run's --forward; repeatable")
	volumes := installFlag{}
	fs.Var(volumes, "volume", "GUESTDIR=HOSTDIR, as run's --volume: mount a host directory at the guest's /home or /environment before the bootstrap reaches it; repeatable")
	fs.String("name", "", "the sandbox's name, as the NAME argument (as the other commands take it)")
	args, code, ok := cli.Parse(fs, args, env)
	if !ok {
		return code
	}
	name, code := sandboxName("claim", fs, args, stderr)
	if name == "" {
		return code
	}
	if *bootFile == "" {
		return cli.Usagef(fs, stderr, "--bootstrap is required: the tenant's bootstrap document")
	}
	line, err := claimLine(*bootFile, stdin, allow, upstreams, forwards, volumes)
	if err != nil {
		fmt.Fprintf(stderr, "oac-shim claim: %v\n", err)
		return 2
	}
	w, err := kept.OpenRegistry(*keepRoot).Open(name)
	if errors.Is(err, os.ErrNotExist) {
		fmt.Fprintf(stderr, "oac-shim claim: no shim runs a sandbox called %s (oac-shim list --running)\n", name)
		return 1
	}
	if err != nil {
		fmt.Fprintf(stderr, "oac-shim claim: %v\n", err)
		return 1
	}
	sock := w.Record.ControlSocket
	w.Close()
	if sock == "" {
		fmt.Fprintf(stderr, "oac-shim claim: %s serves no control socket: run it with --control-socket PATH or --outlive-parent, or send the claim command on its stdin (--control stdin)\n", name)
		return 1
	}
	a, err := askControl(context.Background(), sock, line, claimTimeout)
	if err != nil {
		fmt.Fprintf(stderr, "oac-shim claim: %s: %v\n", name, err)
		return 1
	}
	if !a.OK {
		fmt.Fprintf(stderr, "oac-shim claim: %s refused the claim (%s): %s\n", name, a.Code, a.Error)
		return 1
	}
	printJSON(stdout, a.Result)
	return 0
}

// claimLine is the claim command's line: the bootstrap as read (it must
// decode as --bootstrap does; the shim checks it again), the policy, the
// forwards and the volumes.
func claimLine(bootFile string, stdin io.Reader, allow, upstreams, forwards []string, volumes installFlag) ([]byte, error) {
	var r io.Reader = stdin
	if bootFile != "-" {
		f, err := os.Open(bootFile)
		if err != nil {
			return nil, fmt.Errorf("--bootstrap: %w", err)
		}
		defer f.Close()
		r = f
	}
	data, err := io.ReadAll(io.LimitReader(r, api.MaxLine+1))
	if err != nil {
		return nil, fmt.Errorf("--bootstrap: %w", err)
	}
	if _, err := bootstrap.Decode(bytes.NewReader(data)); err != nil {
		return nil, fmt.Errorf("--bootstrap: %w", err)
	}
	var compact bytes.Buffer
	if err := json.Compact(&compact, data); err != nil {
		return nil, fmt.Errorf("--bootstrap: %w", err)
	}
	cmd := struct {
		ID        string            `json:"id"`
		Cmd       string            `json:"cmd"`
		Bootstrap json.RawMessage   `json:"bootstrap"`
		Allow     []string          `json:"allow,omitempty"`
		Upstreams []string          `json:"upstreams,omitempty"`
		Forwards  []api.ForwardSpec `json:"forwards,omitempty"`
		Volumes   []api.VolumeSpec  `json:"volumes,omitempty"`
	}{ID: "claim", Cmd: api.CmdClaim, Bootstrap: compact.Bytes(), Allow: allow, Upstreams: upstreams}
	for _, v := range forwards {
		sp, err := forward.ParseSpec(v)
		if err != nil {
			return nil, fmt.Errorf("--forward: %w", err)
		}
		cmd.Forwards = append(cmd.Forwards, api.ForwardSpec{Listen: sp.Listen, GuestPort: sp.GuestPort})
	}
	vs, err := volumeSpecs(volumes)
	if err != nil {
		return nil, err
	}
	cmd.Volumes = vs
	line, err := json.Marshal(cmd)
	if err != nil {
		return nil, err
	}
	if len(line) > api.MaxLine {
		return nil, fmt.Errorf("the claim is %d bytes, over a control line's %d: a smaller bootstrap", len(line), api.MaxLine)
	}
	return line, nil
}

// volumeSpecs are --volume's GUESTDIR=HOSTDIR (parsed by installFlag, as
// run's) as a claim sends them, in guest directory order: each guest
// directory one of provider.VolumeDirs, as run's spec is checked, and each
// host directory absolute against this working directory, as run makes it
// (the shim runs elsewhere).
func volumeSpecs(volumes installFlag) ([]api.VolumeSpec, error) {
	var vs []api.VolumeSpec
	for _, guest := range slices.Sorted(maps.Keys(volumes)) {
		if !slices.Contains(provider.VolumeDirs, guest) {
			return nil, fmt.Errorf("--volume %s=%s: a volume can replace only /home or /environment", guest, volumes[guest])
		}
		vs = append(vs, api.VolumeSpec{Guest: guest, Host: provider.AbsPath(volumes[guest])})
	}
	return vs, nil
}

// askControl sends one command line to a control socket and returns its
// answer, within timeout.
func askControl(ctx context.Context, path string, line []byte, timeout time.Duration) (api.Answer, error) {
	var a api.Answer
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var d net.Dialer
	c, err := d.DialContext(ctx, "unix", path)
	if err != nil {
		return a, err
	}
	defer c.Close()
	dl, _ := ctx.Deadline()
	_ = c.SetDeadline(dl)
	if _, err := c.Write(append(line, '\n')); err != nil {
		return a, err
	}
	br := bufio.NewReaderSize(io.LimitReader(c, maxAnswer), 64<<10)
	ans, err := br.ReadBytes('\n')
	if err != nil {
		return a, fmt.Errorf("no answer: %w", err)
	}
	if err := json.Unmarshal(ans, &a); err != nil {
		return a, errors.New("the answer is not JSON")
	}
	return a, nil
}

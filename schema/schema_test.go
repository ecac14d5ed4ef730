package schema_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"go/ast"
	"go/constant"
	"go/parser"
	"go/token"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/oac/sandbox-agent/api"
	"github.com/oac/sandbox-agent/egress"
	"github.com/oac/sandbox-agent/host/apiserver"
	"github.com/oac/sandbox-agent/host/kept"
	"github.com/oac/sandbox-agent/host/persist"
	"github.com/oac/sandbox-agent/host/shimcli"
	"github.com/oac/sandbox-agent/internal/cli"
	"github.com/oac/sandbox-agent/protocol"
	"github.com/oac/sandbox-agent/protocol/bootstrap"
	"github.com/oac/sandbox-agent/schema"
	"github.com/oac/sandbox-agent/stage"
)

func TestEverySchemaCompiles(t *testing.T) {
	for _, n := range schema.Names {
		_, err := schema.Compiled(n)
		assert.NoError(t, err, n)
	}
}

// goConsts returns the string constants of a Go package directory whose
// names start with prefix, read from the source: a kind added in Go is seen
// here without anyone listing it.
func goConsts(t *testing.T, dir, prefix string) map[string]string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, "*.go"))
	require.NoError(t, err)
	out := map[string]string{}
	fset := token.NewFileSet()
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, 0)
		require.NoError(t, err)
		for _, d := range f.Decls {
			g, ok := d.(*ast.GenDecl)
			if !ok || g.Tok != token.CONST {
				continue
			}
			for _, sp := range g.Specs {
				vs := sp.(*ast.ValueSpec)
				for i, id := range vs.Names {
					if !strings.HasPrefix(id.Name, prefix) || i >= len(vs.Values) {
						continue
					}
					lit, ok := vs.Values[i].(*ast.BasicLit)
					if !ok || lit.Kind != token.STRING {
						continue
					}
					out[id.Name] = constant.StringVal(constant.MakeFromLiteral(lit.Value, lit.Kind, 0))
				}
			}
		}
	}
	require.NotEmpty(t, out, "no %s constants in %s", prefix, dir)
	return out
}

func values(m map[string]string) []string {
	var out []string
	for _, v := range m {
		out = append(out, v)
	}
	sort.Strings(out)
	return out
}

func enum(t *testing.T, a at) []string {
	t.Helper()
	var out []string
	e, ok := a.n["enum"].([]any)
	require.True(t, ok, "not an enum")
	for _, v := range e {
		out = append(out, v.(string))
	}
	sort.Strings(out)
	return out
}

// eventConsts collects, per alternative of the event schema, the const of
// "event" (and of "state" for state events).
func eventConsts(d docs) (kinds, states []string) {
	seen := map[string]bool{}
	for _, alt := range d.alternatives(at{schema.Event, d[schema.Event]}) {
		props := alt.n["properties"].(node)
		k := props["event"].(node)["const"].(string)
		if !seen[k] {
			seen[k] = true
			kinds = append(kinds, k)
		}
		if s, ok := props["state"].(node); ok {
			states = append(states, s["const"].(string))
		}
	}
	sort.Strings(kinds)
	sort.Strings(states)
	return kinds, states
}

// Every event kind the Go side declares (a Kind* constant of package
// events) has a schema, and the schema has no kind Go does not declare.
func TestEveryEventKindHasASchema(t *testing.T) {
	d := loadDocs(t)
	kinds, states := eventConsts(d)
	assert.Equal(t, values(goConsts(t, "../api", "Kind")), kinds)
	assert.Equal(t, lifecycleStates(t), states, "the one lifecycle State type's values")
}

// lifecycleStates are the values of api.State: the guest's (protocol's
// State constants) and the shim's own (api's State constants written as
// literals: warm).
func lifecycleStates(t *testing.T) []string {
	t.Helper()
	all := goConsts(t, "../protocol", "State")
	for k, v := range goConsts(t, "../api", "State") {
		all["api."+k] = v
	}
	return values(all)
}

func TestEnumsAgreeWithGo(t *testing.T) {
	d := loadDocs(t)
	var codes []string
	for _, f := range api.Failures {
		codes = append(codes, f.Code)
	}
	sort.Strings(codes)
	assert.Equal(t, codes, enum(t, d.def(schema.Event, "FailureCode")), "failure codes")
	assert.Equal(t, values(goConsts(t, "../api", "Code")), codes, "every Code* constant is a listed failure")

	var answerCodes []string
	for _, c := range api.AnswerCodes {
		answerCodes = append(answerCodes, c.Code)
	}
	sort.Strings(answerCodes)
	assert.Equal(t, answerCodes, enum(t, d.def(schema.Answer, "AnswerCode")), "answer codes")
	assert.Equal(t, values(goConsts(t, "../api", "Answer")), answerCodes, "every Answer* constant is a listed answer code")

	var egressCodes []string
	for c := protocol.EgressInvalidArgument; c.Valid(); c++ {
		egressCodes = append(egressCodes, c.String())
	}
	sort.Strings(egressCodes)
	assert.Equal(t, egressCodes, enum(t, d.def(schema.Event, "EgressCode")))
	assert.Equal(t, values(goConsts(t, "../protocol", "Via")), enum(t, d.def(schema.Event, "Via")))
	assert.Equal(t, []string{protocol.EffectNone, protocol.EffectPossible}, enum(t, d.def(schema.Event, "Effect")))
	decision := d.def(schema.Event, "EgressEvent").n["properties"].(node)["decision"].(node)
	assert.Equal(t, values(goConsts(t, "../egress", "Decision")), enum(t, at{schema.Event, decision}))
	trigger := d.def(schema.Event, "ClockEvent").n["properties"].(node)["trigger"].(node)
	assert.Equal(t, values(goConsts(t, "../api", "ClockTrigger")), enum(t, at{schema.Event, trigger}))

	names := append([]string(nil), api.Commands()...)
	sort.Strings(names)
	assert.Equal(t, names, enum(t, d.def(schema.Command, "CommandName")))
	state := d.def(schema.Answer, "StatusResult").n["properties"].(node)["state"].(node)
	assert.Equal(t, lifecycleStates(t), enum(t, at{schema.Answer, state}))
}

// The Go types and the schema describe the same JSON.
func TestGoTypesAgreeWithTheSchema(t *testing.T) {
	d := loadDocs(t)
	// Events: the event schema without its answer alternative.
	evs := node{"oneOf": []any{}}
	for _, x := range d[schema.Event]["oneOf"].([]any) {
		if x.(node)["$ref"] != schema.Answer {
			evs["oneOf"] = append(evs["oneOf"].([]any), x)
		}
	}
	d.agree(t, "Event", reflect.TypeFor[api.Event](), at{schema.Event, evs}, true)
	d.agree(t, "Answer", reflect.TypeFor[api.Answer](), at{schema.Answer, d[schema.Answer]}, true)
	for def, typ := range map[string]reflect.Type{
		"StatusResult":  reflect.TypeFor[api.StatusResult](),
		"ForwardResult": reflect.TypeFor[api.ForwardResult](),
		"ForwardInfo":   reflect.TypeFor[api.ForwardInfo](),
		"StartResult":   reflect.TypeFor[api.StartResult](),
		"PolicyResult":  reflect.TypeFor[api.PolicyResult](),
		"TimeResult":    reflect.TypeFor[api.TimeResult](),
		"ClaimResult":   reflect.TypeFor[api.ClaimResult](),
	} {
		d.agree(t, def, typ, d.def(schema.Answer, def), true)
	}
	d.agree(t, "Command", reflect.TypeFor[api.Command](), at{schema.Command, d[schema.Command]}, false)
	d.agree(t, "Bootstrap", reflect.TypeFor[bootstrap.Bootstrap](), at{schema.Bootstrap, d[schema.Bootstrap]}, false)
	d.agree(t, "SandboxIO", reflect.TypeFor[bootstrap.SandboxIO](), at{schema.SandboxIO, d[schema.SandboxIO]}, false)
	d.agree(t, "Core", reflect.TypeFor[bootstrap.Core](), at{schema.CoreBootstrap, d[schema.CoreBootstrap]}, false)
	d.agree(t, "PolicyFile", reflect.TypeFor[egress.File](), at{schema.Policy, d[schema.Policy]}, false)
	d.agree(t, "ListReport", reflect.TypeFor[api.ListReport](), at{schema.List, d[schema.List]}, true)
	d.agree(t, "Record", reflect.TypeFor[persist.Record](), at{schema.Record, d[schema.Record]}, true)
	d.agree(t, "RunningReport", reflect.TypeFor[api.RunningReport](), at{schema.Running, d[schema.Running]}, true)
	d.agree(t, "StopReport", reflect.TypeFor[api.StopReport](), at{schema.Stop, d[schema.Stop]}, true)
	d.agree(t, "VersionReport", reflect.TypeFor[api.VersionReport](), at{schema.Version, d[schema.Version]}, true)
	d.agree(t, "StageReport", reflect.TypeFor[api.ImageStageReport](), at{schema.ImageStage, d[schema.ImageStage]}, true)
	d.agree(t, "VerifyReport", reflect.TypeFor[api.ImageVerifyReport](), at{schema.ImageVerify, d[schema.ImageVerify]}, true)
	d.agree(t, "BuildReport", reflect.TypeFor[api.ImageBuildReport](), at{schema.ImageBuild, d[schema.ImageBuild]}, true)
	d.agree(t, "ListReport", reflect.TypeFor[api.ImageListReport](), at{schema.ImageList, d[schema.ImageList]}, true)
	d.agree(t, "CheckReport", reflect.TypeFor[shimcli.CheckReport](), at{schema.Check, d[schema.Check]}, true)
	d.agree(t, "StageEvent", reflect.TypeFor[stage.Event](), at{schema.StageProgress, d[schema.StageProgress]}, true)
}

// What version --json prints validates for every binary, and a report of
// another schema version does not.
func TestVersionReportsValidate(t *testing.T) {
	for _, program := range []string{"oac-shim", "oac-image", "oac-guest", "oac-bench"} {
		out, err := json.Marshal(cli.Version(program))
		require.NoError(t, err)
		assert.NoError(t, schema.Validate(schema.Version, out), "%s", out)
	}
	v := cli.Version("oac-shim")
	v.SchemaVersion++
	out, err := json.Marshal(v)
	require.NoError(t, err)
	assert.Error(t, schema.Validate(schema.Version, out))
	assert.Error(t, schema.Validate(schema.Version, []byte(`{"program":"oac-shim","version":"dev"}`)))
}

// The running sandboxes a registry lists and a stop report validate, and
// the outcomes are the Go ones.
func TestRunningAndStopReportsValidate(t *testing.T) {
	d := loadDocs(t)
	var outcomes []string
	for _, o := range api.StopOutcomes {
		outcomes = append(outcomes, string(o))
	}
	sort.Strings(outcomes)
	assert.Equal(t, outcomes, enum(t, d.def(schema.Stop, "Outcome")))

	g := kept.OpenRegistry(t.TempDir())
	a, err := g.Announce(kept.ShimRecord{Name: "r1", Kind: api.RunThrowaway, Provider: "bwrap", PID: 42, ProcStart: 7,
		ControlSocket: "/run/r1.ctl", Started: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC), Version: "dev"})
	require.NoError(t, err)
	defer a.Close()
	live, cleaned, err := g.List()
	require.NoError(t, err)
	require.Len(t, live, 1)
	rep := api.RunningReport{SchemaVersion: api.SchemaVersion, Sandboxes: []api.RunningEntry{live[0].Entry()}, Cleaned: cleaned}
	out, err := json.Marshal(rep)
	require.NoError(t, err)
	assert.NoError(t, schema.Validate(schema.Running, out), "%s", out)

	stop := api.StopReport{SchemaVersion: api.SchemaVersion, GraceMS: 30000, AllStopped: false,
		Sandboxes: []api.StopEntry{{Name: "r1", Outcome: api.StopStopped, Via: api.StopViaControl, PID: 42, ElapsedMS: 812},
			{Name: "r2", Outcome: api.StopNotRunning}},
		Cleaned: []api.CleanedEntry{{Name: "r3", Message: "its shim died"}}}
	out, err = json.Marshal(stop)
	require.NoError(t, err)
	assert.NoError(t, schema.Validate(schema.Stop, out), "%s", out)
	assert.Error(t, schema.Validate(schema.Stop, []byte(`{"schema_version":4,"grace_ms":1,"sandboxes":[{"name":"r1","outcome":"maybe","elapsed_ms":1}],"cleaned":[],"all_stopped":true}`)))
}

// The kept sandbox's states, the list and the record the shim writes.
func TestKeptRecordAndListValidate(t *testing.T) {
	d := loadDocs(t)
	var states []string
	for _, s := range persist.States {
		states = append(states, string(s))
	}
	sort.Strings(states)
	assert.Equal(t, states, enum(t, d.def(schema.Record, "State")))
	started := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	rec := persist.Record{Schema: persist.SchemaVersion, Name: "k1", Provider: "oci",
		Image:   persist.Image{Ref: "/images/root", Digest: "sha256:" + strings.Repeat("ab", 32)},
		Flags:   persist.Flags{Rootfs: "/images/root", Install: map[string]string{"d": "/bin/d"}, Provider: []string{"--runtime=crun"}},
		Created: started, LastStarted: &started, State: persist.StateStopped}
	data, err := persist.Encode(rec)
	require.NoError(t, err)
	assert.NoError(t, schema.Validate(schema.Record, data))
	store := persist.NewMem(t.TempDir())
	l, err := store.Lock("k1")
	require.NoError(t, err)
	require.NoError(t, store.Save(rec))
	l.Unlock()
	rep, err := kept.New(store, nil).List(context.Background())
	require.NoError(t, err)
	out, err := json.Marshal(rep)
	require.NoError(t, err)
	assert.NoError(t, schema.Validate(schema.List, out), "%s", out)
	assert.Error(t, schema.Validate(schema.List, []byte(`{"schema_version":1,"sandboxes":[{"name":"k1"}]}`)))
}

// sample is a valid value for a command key, from its schema.
func sample(key string) any {
	switch key {
	case "id":
		return "c1"
	case "guest_port":
		return 4096
	case "listen":
		return "127.0.0.1:0"
	case "allow", "upstreams":
		return []string{}
	case "bootstrap":
		return map[string]any{"version": 1}
	case "forwards":
		return []map[string]any{{"listen": "127.0.0.1:0", "guest_port": 4096}}
	case "volumes":
		return []map[string]any{{"guest": "/environment", "host": "/srv/workspace"}}
	}
	panic("no sample for " + key)
}

// Each command's schema takes exactly the keys api.Decode takes: a
// command with all its keys decodes, and any other key of the Command type
// is refused by both.
func TestCommandSchemasTakeTheKeysTheDecoderTakes(t *testing.T) {
	d := loadDocs(t)
	all := fieldsOf(reflect.TypeFor[api.Command]())
	for _, alt := range d.alternatives(at{schema.Command, d[schema.Command]}) {
		props := alt.n["properties"].(node)
		cmd := props["cmd"].(node)["const"].(string)
		doc := map[string]any{"cmd": cmd}
		for k := range props {
			if k != "cmd" {
				doc[k] = sample(k)
			}
		}
		line, _ := json.Marshal(doc)
		_, err := api.Decode(line)
		assert.NoError(t, err, "%s", line)
		assert.NoError(t, schema.Validate(schema.Command, line), "%s", line)
		for _, f := range all {
			if _, ok := props[f.name]; ok {
				continue
			}
			extra := map[string]any{"cmd": cmd, f.name: sample(f.name)}
			for _, r := range required(alt) {
				if r != "cmd" {
					extra[r] = sample(r)
				}
			}
			line, _ := json.Marshal(extra)
			_, err := api.Decode(line)
			assert.Error(t, err, "the decoder refuses %s", line)
			assert.Error(t, schema.Validate(schema.Command, line), "the schema refuses %s", line)
		}
	}
}

// Claim lines on which the command schema and api.Decode agree; a
// bootstrap that is an object but not a valid bootstrap passes Decode and
// is refused by the shim when it decodes the document (invalid_argument),
// so the schema, which holds the bootstrap to its own, refuses it.
func TestClaimLinesTheSchemaAndTheDecoderAgreeOn(t *testing.T) {
	forwards := func(n int) string {
		f := make([]string, n)
		for i := range f {
			f[i] = fmt.Sprintf(`{"listen":"127.0.0.1:0","guest_port":%d}`, 4000+i)
		}
		return `[` + strings.Join(f, ",") + `]`
	}
	for _, tc := range []struct {
		line string
		ok   bool
	}{
		{`{"id":"c1","cmd":"claim","bootstrap":{"version":1},"allow":["a.example.com:443"],"upstreams":[],"forwards":[{"listen":"127.0.0.1:0","guest_port":4096}]}`, true},
		{`{"cmd":"claim","bootstrap":{"version":1}}`, true},
		{`{"cmd":"claim","bootstrap":{"version":1},"forwards":` + forwards(64) + `}`, true},
		{`{"cmd":"claim","bootstrap":{"version":1},"forwards":` + forwards(65) + `}`, false},
		{`{"cmd":"claim"}`, false},
		{`{"cmd":"claim","bootstrap":"{\"version\":1}"}`, false},
		{`{"cmd":"claim","bootstrap":[]}`, false},
		{`{"cmd":"claim","bootstrap":null}`, false},
		{`{"cmd":"claim","bootstrap":{"version":1},"forwards":[{"listen":"127.0.0.1:0","guest_port":0}]}`, false},
		{`{"cmd":"claim","bootstrap":{"version":1},"forwards":[{"listen":"","guest_port":4096}]}`, false},
		{`{"cmd":"claim","bootstrap":{"version":1},"forwards":[{"listen":"127.0.0.1:0"}]}`, false},
		{`{"cmd":"claim","bootstrap":{"version":1},"forwards":[{"listen":"127.0.0.1:0","guest_port":4096,"url":"x"}]}`, false},
		{`{"cmd":"claim","bootstrap":{"version":1},"forwards":{"listen":"127.0.0.1:0","guest_port":4096}}`, false},
		{`{"cmd":"claim","bootstrap":{"version":1},"listen":"127.0.0.1:0"}`, false},
	} {
		_, err := api.Decode([]byte(tc.line))
		assert.Equal(t, tc.ok, err == nil, "the decoder on %s: %v", tc.line, err)
		err = schema.Validate(schema.Command, []byte(tc.line))
		assert.Equal(t, tc.ok, err == nil, "the schema on %s: %v", tc.line, err)
	}
	_, err := api.Decode([]byte(`{"cmd":"claim","bootstrap":{"hostname":"demo"}}`))
	assert.NoError(t, err, "the decoder takes any object: the shim decodes the document")
	assert.Error(t, schema.Validate(schema.Command, []byte(`{"cmd":"claim","bootstrap":{"hostname":"demo"}}`)), "the schema holds it to bootstrap.schema.json")
}

// Documents on which the schema and the Go decoders must agree.
func TestSchemaAndDecodersAgreeOnDocuments(t *testing.T) {
	const link = `{"version":1,"link_url":"wss://link.example.com/api/v1/sandbox-link","credential":"c-1",` +
		`"resource":{"tenant_id":"0b5e7f5a-3c1d-4e2f-9a8b-7c6d5e4f3a21","environment_id":"1c6f8a6b-4d2e-4f30-8b9c-8d7e6f5a4b32",` +
		`"kind":"allocation","id":"2d7a9b7c-5e3f-4a41-9cad-9e8f7a6b5c43","generation":1}}`
	const ident = `{"tenant_id":"0b5e7f5a-3c1d-4e2f-9a8b-7c6d5e4f3a21","environment_id":"1c6f8a6b-4d2e-4f30-8b9c-8d7e6f5a4b32","allocation_id":"2d7a9b7c-5e3f-4a41-9cad-9e8f7a6b5c43"}`
	full := `{"version":1,"hostname":"demo","stop_grace":"6s","sandbox":` + ident + `,"sandbox_io":{"bootstrap":` + link + `},` +
		`"daemon":{"argv":["/usr/bin/server","serve"],"env":["XDG_STATE_HOME=/home/runtime/.state"],"dir":"/environment/workspace"},` +
		`"credentials":{"username":"runtime","password":"","username_env":"U","password_env":"P"},` +
		`"health":{"port":4096,"path":"/global/health","interval":"100ms","timeout":"3s","deadline":"30s"}}`
	bootstrapOK := func(doc string) bool {
		b, err := bootstrap.Decode(strings.NewReader(doc))
		return err == nil && b.Validate() == nil
	}
	for _, tc := range []struct {
		name, doc string
	}{
		{"full", full},
		{"minimal", `{"version":1}`},
		{"provided file", `{"version":1,"sandbox":` + ident + `,"sandbox_io":{"provided":true}}`},
		{"no version", `{"hostname":"demo"}`},
		{"version 2", `{"version":2}`},
		{"unknown key", `{"version":1,"Version":1}`},
		{"relative argv", `{"version":1,"daemon":{"argv":["server"]}}`},
		{"empty argv", `{"version":1,"daemon":{"argv":[]}}`},
		{"bad env", `{"version":1,"daemon":{"argv":["/x"],"env":["1A=b"]}}`},
		{"credentials without daemon", `{"version":1,"credentials":{"username_env":"U","password_env":"P"}}`},
		{"health without credentials", `{"version":1,"daemon":{"argv":["/x"]},"health":{"port":1}}`},
		{"port 0", `{"version":1,"daemon":{"argv":["/x"]},"credentials":{"username_env":"U","password_env":"P"},"health":{"port":0}}`},
		{"short password", `{"version":1,"daemon":{"argv":["/x"]},"credentials":{"password":"short","username_env":"U","password_env":"P"}}`},
		{"bad hostname", `{"version":1,"hostname":"-x"}`},
		{"bad duration", `{"version":1,"stop_grace":"six seconds"}`},
		{"identity without sandbox_io", `{"version":1,"sandbox":` + ident + `}`},
		{"both bootstrap and provided", `{"version":1,"sandbox":` + ident + `,"sandbox_io":{"bootstrap":` + link + `,"provided":true}}`},
		{"neither", `{"version":1,"sandbox":` + ident + `,"sandbox_io":{}}`},
		{"uppercase uuid", strings.Replace(full, "0b5e7f5a", "0B5E7F5A", 2)},
		// (ws:// is a rule beyond the schema: --allow-loopback-link
		// accepts it on a loopback host.)
		{"https link", strings.Replace(full, "wss://", "https://", 1)},
		{"link with a query", strings.Replace(full, "sandbox-link", "sandbox-link?x=1", 1)},
		{"other kind", strings.Replace(full, `"allocation"`, `"enrollment"`, 1)},
		{"generation 0", strings.Replace(full, `"generation":1`, `"generation":0`, 1)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := schema.Validate(schema.Bootstrap, []byte(tc.doc))
			assert.Equal(t, bootstrapOK(tc.doc), err == nil, "Go says %v, the schema says %v", bootstrapOK(tc.doc), err)
		})
	}
	policyOK := func(doc string) bool {
		f, err := egress.DecodeFile(strings.NewReader(doc))
		if err != nil {
			return false
		}
		_, err = egress.ParsePolicy(f.Allow, f.Upstreams)
		return err == nil
	}
	for _, doc := range []string{
		`{"version":1,"allow":["api.example.com:443","*.example.org:8000-8100"],"upstreams":["llm-gateway:443=127.0.0.1:8443"]}`,
		`{"version":1}`,
		`{"version":2}`,
		`{"allow":[]}`,
		`{"version":1,"rules":[]}`,
		`{"version":1,"upstreams":["no-address"]}`,
	} {
		err := schema.Validate(schema.Policy, []byte(doc))
		assert.Equal(t, policyOK(doc), err == nil, "%s: the schema says %v", doc, err)
	}
}

// Events built the way the shim builds them validate, and a line that
// breaks a kind's shape does not.
func TestEventsOfEveryKindValidate(t *testing.T) {
	yes, zero := true, 0
	n := int64(5)
	for _, e := range []api.Event{
		{Event: api.KindState, State: api.StateStarting, Message: "creating sandbox", Attempt: 1},
		{Event: api.KindState, State: api.StateWarm, Message: "warm: waiting for a claim", Attempt: 1},
		{Event: api.KindState, State: api.StateReady, Message: "guest ready", URL: "http://127.0.0.1:41123", GuestURL: "http://127.0.0.1:4096", Username: "runtime", Attempt: 1},
		{Event: api.KindState, State: api.StateFailed, Message: "invalid bootstrap", Code: api.CodeInvalidBootstrap},
		{Event: api.KindState, State: api.StateStopped, Message: "stopped: stop command", Attempt: 2},
		{Event: api.KindAgent, PID: 1, Protocol: 1, AgentVersion: "e6a45d4", Message: "guest agent connected", Attempt: 1},
		{Event: api.KindProcess, Process: "daemon", PID: 10, Running: &yes, Message: "started", Attempt: 1},
		{Event: api.KindProcess, Process: "daemon", PID: 10, Running: new(bool), ExitCode: &zero, Message: "exited", Attempt: 1},
		{Event: api.KindLog, Stream: "daemon/stdout", Line: "hello", Attempt: 1},
		{Event: api.KindDropped, Dropped: 1 << 20, Message: "dropped", Attempt: 1},
		{Event: api.KindEgressPolicy, Rules: []string{"a.example.com:443"}, Message: "egress policy in force"},
		{Event: api.KindEgress, Conn: 2, Via: protocol.ViaHTTP, Target: "blocked.example.com:80", Decision: egress.DecisionDenied,
			Rule: "*.example.com:443", Reason: "port 80 is not allowed", Code: protocol.EgressDenied.String(), Effect: protocol.EffectNone, Message: "egress denied", Attempt: 1},
		{Event: api.KindEgressClosed, Conn: 1, Via: protocol.ViaConnect, Target: "a.example.com:443", Address: "203.0.113.5:443",
			BytesOut: &n, BytesIn: &n, DurationMS: &n, Message: "egress closed", Attempt: 1},
		{Event: api.KindForward, Listen: "127.0.0.1:41123", GuestPort: 4096, Message: "listening"},
		{Event: api.KindKept, Message: "reset: the kept state was discarded; the sandbox starts afresh from its image", Attempt: 2},
		{Event: api.KindWarmExpired, Message: "warm for its maximum age (10m0s) and never claimed", Attempt: 1},
		{Event: api.KindEventsLost, LostFrom: 5, LostTo: 70, Message: "events 5 to 70 are older than the journal keeps"},
	} {
		line := encodeEvent(t, e)
		assert.NoError(t, schema.Validate(schema.Event, line), "%s", line)
	}
	for name, e := range map[string]api.Event{
		"failed without a code":        {Event: api.KindState, State: api.StateFailed, Message: "x"},
		"an unknown failure code":      {Event: api.KindState, State: api.StateFailed, Code: "oops"},
		"a state with an egress field": {Event: api.KindState, State: api.StateStopped, Attempt: 1, Conn: 3},
		"an unknown kind":              {Event: "mystery"},
		"a code on a ready state":      {Event: api.KindState, State: api.StateReady, Attempt: 1, Code: api.CodeInternal},
		"a url on a warm state":        {Event: api.KindState, State: api.StateWarm, Attempt: 1, URL: "http://127.0.0.1:4096"},
		"a warm state without attempt": {Event: api.KindState, State: api.StateWarm, Message: "x"},
		"events lost without a range":  {Event: api.KindEventsLost, Message: "x"},
		"a lost range on a log":        {Event: api.KindLog, Stream: "daemon/stdout", Line: "x", LostFrom: 1, LostTo: 2},
	} {
		line := encodeEvent(t, e)
		assert.Error(t, schema.Validate(schema.Event, line), "%s: %s", name, line)
	}
}

func encodeEvent(t *testing.T, e api.Event) []byte {
	t.Helper()
	var b strings.Builder
	e.Sandbox = "demo"
	api.NewJSONLines(&b).Emit(e)
	return []byte(strings.TrimSpace(b.String()))
}

// Answers as the control server writes them validate against the answer
// schema, inside the event schema.
func TestAnswersValidate(t *testing.T) {
	st := api.StatusResult{Status: api.Status{ServerID: "sandbox:demo", State: "ready", Attempt: 1},
		Forwards: []api.ForwardInfo{{Listen: "127.0.0.1:1", GuestPort: 4096}}, Egress: []string{}}
	for cmd, result := range map[string]any{
		api.CmdStatus:        st,
		api.CmdStop:          st,
		api.CmdStart:         api.StartResult{Attempt: 2},
		api.CmdReset:         api.StartResult{Attempt: 3},
		api.CmdSetPolicy:     api.PolicyResult{Egress: []string{"a.example.com:443"}},
		api.CmdAddForward:    api.ForwardResult{ForwardInfo: api.ForwardInfo{Listen: "127.0.0.1:2", GuestPort: 4096}, URL: "http://127.0.0.1:2"},
		api.CmdRemoveForward: struct{}{},
		api.CmdPushTime:      api.TimeResult{TimeUnixNano: 1},
		api.CmdClaim: api.ClaimResult{Attempt: 2, Egress: []string{"a.example.com:443"},
			Forwards: []api.ForwardResult{{ForwardInfo: api.ForwardInfo{Listen: "127.0.0.1:3", GuestPort: 4096}, URL: "http://127.0.0.1:3"}}},
	} {
		command := `{"id":"7","cmd":"` + cmd + `"}`
		switch cmd {
		case api.CmdAddForward:
			command = `{"id":"7","cmd":"add_forward","listen":"127.0.0.1:0","guest_port":4096}`
		case api.CmdRemoveForward:
			command = `{"id":"7","cmd":"remove_forward","listen":"127.0.0.1:2"}`
		case api.CmdClaim:
			command = `{"id":"7","cmd":"claim","bootstrap":{"version":1},"allow":["a.example.com:443"],"forwards":[{"listen":"127.0.0.1:0","guest_port":4096}]}`
		}
		line := answerLine(t, apiserver.HandlerFunc(func(ctx context.Context, c api.Command) (any, error) { return result, nil }), command)
		assert.Contains(t, string(line), `"ok":true`, "%s", line)
		assert.NoError(t, schema.Validate(schema.Event, line), "%s", line)
		assert.NoError(t, schema.Validate(schema.Answer, line), "%s", line)
	}
	bad := answerLine(t, apiserver.HandlerFunc(func(ctx context.Context, c api.Command) (any, error) { return nil, nil }), `{"cmd":"status","Cmd":"stop"}`)
	assert.NoError(t, schema.Validate(schema.Answer, bad), "%s", bad)
	assert.Contains(t, string(bad), `"code":"invalid_argument"`)
	failed := answerLine(t, apiserver.HandlerFunc(func(ctx context.Context, c api.Command) (any, error) { return nil, errors.New("no") }), `{"cmd":"push_time"}`)
	assert.NoError(t, schema.Validate(schema.Answer, failed), "%s", failed)
	assert.Contains(t, string(failed), `"code":"failed"`, "a handler's error without a code")
	noCode := []byte(strings.Replace(string(failed), `,"code":"failed"`, "", 1))
	assert.Error(t, schema.Validate(schema.Answer, noCode), "an error answer without a code: %s", noCode)
	oddCode := []byte(strings.Replace(string(failed), `"code":"failed"`, `"code":"oops"`, 1))
	assert.Error(t, schema.Validate(schema.Answer, oddCode), "an unknown code: %s", oddCode)
	wrong := answerLine(t, apiserver.HandlerFunc(func(ctx context.Context, c api.Command) (any, error) { return api.StartResult{Attempt: 1}, nil }), `{"cmd":"status"}`)
	assert.Error(t, schema.Validate(schema.Answer, wrong), "a status answer with a start's result: %s", wrong)
	noForwards := answerLine(t, apiserver.HandlerFunc(func(ctx context.Context, c api.Command) (any, error) {
		return api.ClaimResult{Attempt: 2, Egress: []string{}}, nil
	}),
		`{"cmd":"claim","bootstrap":{"version":1}}`)
	assert.Contains(t, string(noForwards), `"ok":true`, "%s", noForwards)
	assert.Error(t, schema.Validate(schema.Answer, noForwards), "a claim answer's forwards are a list, empty when none was asked: %s", noForwards)
}

func answerLine(t *testing.T, h apiserver.Handler, command string) []byte {
	t.Helper()
	srv := &apiserver.Server{Sandbox: "demo", Handler: h}
	var out []byte
	err := srv.ServeLines(context.Background(), strings.NewReader(command+"\n"), func(a api.Answer) error {
		b, err := json.Marshal(a)
		out = b
		return err
	})
	require.NoError(t, err)
	return out
}

package schema_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"sort"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/oac/sandbox-agent/api"
	"github.com/oac/sandbox-agent/host/ospolicy"
	"github.com/oac/sandbox-agent/host/provider"
	"github.com/oac/sandbox-agent/host/shimcli"
	"github.com/oac/sandbox-agent/schema"
	"github.com/oac/sandbox-agent/stage"
)

// The report oac-shim check --json prints on this host validates, and the
// policy's levels are the Go ones.
func TestCheckReportValidates(t *testing.T) {
	d := loadDocs(t)
	assert.Equal(t, []string{string(ospolicy.Block), string(ospolicy.OK), string(ospolicy.Warn)}, enum(t, d.def(schema.Check, "Level")))
	providers := provider.Declare(flag.NewFlagSet("check", flag.ContinueOnError))
	out, err := json.Marshal(shimcli.Check(context.Background(), providers))
	require.NoError(t, err)
	assert.NoError(t, schema.Validate(schema.Check, out), "%s", out)
	assert.Error(t, schema.Validate(schema.Check, []byte(`{"os":{"goos":"linux","version":"6","name":"x"},"policy":{"level":"maybe","message":""},"providers":[]}`)))
}

// The codes of both staging schemas (progress and report) are stage.Codes,
// both ways, every code stage.Code gives is among them, and the events a real
// staging prints validate: a corrupt mirror's error, a good one's done.
func TestStageEventsValidate(t *testing.T) {
	d := loadDocs(t)
	var codes []string
	for _, c := range stage.Codes {
		codes = append(codes, c.Code)
	}
	sort.Strings(codes)
	assert.Equal(t, codes, enum(t, d.def(schema.StageProgress, "Code")), "stage-progress.schema.json's codes are stage.Codes")
	stageErr := d.def(schema.ImageStage, "StageError")
	code := stageErr.n["properties"].(node)["code"].(node)
	assert.Equal(t, codes, enum(t, d.resolve(at{schema.ImageStage, code})), "image-stage.schema.json's codes are stage.Codes")
	for _, err := range []error{stage.ErrCorrupt, stage.ErrTruncated, stage.ErrWrongSize, stage.ErrHTTP, stage.ErrStalled, stage.ErrStore, context.Canceled, errors.New("x")} {
		assert.Contains(t, codes, stage.Code(fmt.Errorf("wrapped: %w", err)))
	}

	var lines bytes.Buffer
	progress := stage.JSONProgress(&lines)
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	sum := "ab" + string(bytes.Repeat([]byte("cd"), 31))
	progress(stage.Event{Time: now, Event: stage.EventStart, Name: "k", SHA256: sum, Bytes: 10, Total: 20, ResumedFrom: 10, Mirror: "m.example"})
	progress(stage.Event{Time: now, Event: stage.EventMirror, Name: "k", SHA256: sum, Total: 20, Mirror: "m.example", Next: "n.example", Code: stage.CodeHTTP, Error: "503"})
	progress(stage.Event{Time: now, Event: stage.EventDone, Name: "k", SHA256: sum, Bytes: 20, Total: 20, Path: "/s/sha256/" + sum, Cached: true})
	progress(stage.Event{Time: now, Event: stage.EventError, Name: "k", SHA256: sum, Total: 20, Code: stage.CodeCorrupt, Error: "corrupt"})
	for _, l := range bytes.Split(bytes.TrimSpace(lines.Bytes()), []byte("\n")) {
		assert.NoError(t, schema.Validate(schema.StageProgress, l), "%s", l)
	}
	assert.Error(t, schema.Validate(schema.StageProgress, []byte(`{"time":"2026-01-02T03:04:05Z","event":"done","name":"k","sha256":"`+sum+`","bytes":1,"total":1,"code":"maybe"}`)))
}

var updateCodes = flag.Bool("update-codes", false, "rewrite codes.json from the Go tables")

// codesFile is schema/codes.json: every code a caller branches on, with
// whether the same call may succeed later, made from the Go tables.
type codesFile struct {
	Comment  string        `json:"$comment"`
	Failures []failureCode `json:"failures"`
	Answers  []plainCode   `json:"answers"`
	Stage    []plainCode   `json:"stage"`
}

type failureCode struct {
	Code      string `json:"code"`
	Exit      int    `json:"exit"`
	Retryable bool   `json:"retryable"`
	Action    string `json:"action"`
}

type plainCode struct {
	Code      string `json:"code"`
	Retryable bool   `json:"retryable"`
	Meaning   string `json:"meaning"`
}

// codes.json is the Go tables, api.Failures, api.AnswerCodes and
// stage.Codes, written out (go test ./schema -run TestCodesFile
// -update-codes rewrites it): the TypeScript client generates its table of
// codes and retryability from it, never by hand.
func TestCodesFileIsTheGoTables(t *testing.T) {
	want := codesFile{Comment: "Generated from api.Failures, api.AnswerCodes and stage.Codes by go test ./schema -run TestCodesFile -update-codes: do not edit."}
	for _, f := range api.Failures {
		want.Failures = append(want.Failures, failureCode{f.Code, f.Exit, f.Retry, f.Action})
	}
	for _, c := range api.AnswerCodes {
		want.Answers = append(want.Answers, plainCode{c.Code, c.Retry, c.Meaning})
	}
	for _, c := range stage.Codes {
		want.Stage = append(want.Stage, plainCode{c.Code, c.Retry, c.Meaning})
	}
	data, err := json.MarshalIndent(want, "", "  ")
	require.NoError(t, err)
	data = append(data, '\n')
	if *updateCodes {
		require.NoError(t, os.WriteFile("codes.json", data, 0o644))
	}
	got, err := os.ReadFile("codes.json")
	require.NoError(t, err, "go test ./schema -run TestCodesFile -update-codes writes it")
	assert.Equal(t, string(data), string(got), "codes.json is out of date: go test ./schema -run TestCodesFile -update-codes")
}

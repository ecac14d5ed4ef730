package schema

import (
	"bytes"
	"embed"
	"fmt"
	"io/fs"
	"sync"

	"github.com/santhosh-tekuri/jsonschema/v6"
)

// Base is the URL every schema's $id starts with.
const Base = "https://github.com/oac/sandbox-agent/schema/v1/"

// The schema files.
const (
	Event         = "event.schema.json"
	Answer        = "answer.schema.json"
	Command       = "command.schema.json"
	Bootstrap     = "bootstrap.schema.json"
	SandboxIO     = "sandbox-io.schema.json"
	CoreBootstrap = "core-bootstrap.schema.json"
	Policy        = "policy.schema.json"
	// List is oac-shim list --json; Record a kept sandbox's record.
	List   = "list.schema.json"
	Record = "record.schema.json"
	// Running is oac-shim list --running --json; Stop oac-shim stop --json.
	Running = "running.schema.json"
	Stop    = "stop.schema.json"
	// Version is version --json of every binary.
	Version = "version.schema.json"
	// ImageStage, ImageVerify, ImageBuild and ImageList are oac-image
	// stage, manifest verify, build and list with --json.
	ImageStage  = "image-stage.schema.json"
	ImageVerify = "image-verify.schema.json"
	ImageBuild  = "image-build.schema.json"
	ImageList   = "image-list.schema.json"
	// Check is oac-shim check --json; StageProgress a line of oac-image
	// stage --progress json.
	Check         = "check.schema.json"
	StageProgress = "stage-progress.schema.json"
)

// Names lists the schema files.
var Names = []string{Event, Answer, Command, Bootstrap, SandboxIO, CoreBootstrap, Policy, List, Record, Running, Stop, Version, ImageStage, ImageVerify, ImageBuild, ImageList, Check, StageProgress}

//go:embed *.schema.json
var files embed.FS

// File returns a schema file's bytes.
func File(name string) ([]byte, error) { return fs.ReadFile(files, name) }

var (
	once     sync.Once
	compiled map[string]*jsonschema.Schema
	errComp  error
)

func compile() {
	c := jsonschema.NewCompiler()
	c.AssertFormat()
	for _, n := range Names {
		data, err := File(n)
		if err != nil {
			errComp = err
			return
		}
		doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(data))
		if err != nil {
			errComp = fmt.Errorf("schema %s: %w", n, err)
			return
		}
		if err := c.AddResource(Base+n, doc); err != nil {
			errComp = fmt.Errorf("schema %s: %w", n, err)
			return
		}
	}
	compiled = map[string]*jsonschema.Schema{}
	for _, n := range Names {
		s, err := c.Compile(Base + n)
		if err != nil {
			errComp = fmt.Errorf("schema %s: %w", n, err)
			return
		}
		compiled[n] = s
	}
}

// Compiled returns the compiled schema of a file (one of Names).
func Compiled(name string) (*jsonschema.Schema, error) {
	once.Do(compile)
	if errComp != nil {
		return nil, errComp
	}
	s, ok := compiled[name]
	if !ok {
		return nil, fmt.Errorf("schema: no file %q", name)
	}
	return s, nil
}

// Validate checks one JSON document against the schema of a file.
func Validate(name string, doc []byte) error {
	s, err := Compiled(name)
	if err != nil {
		return err
	}
	v, err := jsonschema.UnmarshalJSON(bytes.NewReader(doc))
	if err != nil {
		return fmt.Errorf("not JSON: %w", err)
	}
	return s.Validate(v)
}

package scripts_test

import (
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func read(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	return string(b)
}

// The README's "From TypeScript" is clients/typescript/examples/readme.ts
// whole, which the TypeScript tests compile and run.
func TestTheREADMEsTypeScriptIsTheFileTheTestsRun(t *testing.T) {
	ts := read(t, "../clients/typescript/examples/readme.ts")
	assert.Contains(t, read(t, "../README.md"), "```ts\n"+ts+"```\n")
}

// The README's "From Go" is the marked lines of examples/readme-go, which
// e2e runs (TestTheREADMEsGoSnippetStartsUseAndStopsASandbox).
func TestTheREADMEsGoIsTheProgramE2ERuns(t *testing.T) {
	src := read(t, "../examples/readme-go/main.go")
	begin, end := strings.Index(src, "// README: begin\n"), strings.Index(src, "\t// README: end")
	require.True(t, begin > 0 && end > begin, "examples/readme-go marks the README's lines")
	var body strings.Builder
	for _, l := range strings.Split(strings.TrimRight(src[begin+len("// README: begin\n"):end], "\n"), "\n") {
		body.WriteString(strings.TrimPrefix(l, "\t") + "\n")
	}
	assert.Contains(t, read(t, "../README.md"), "```go\n"+body.String()+"```\n")
}

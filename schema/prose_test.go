package schema_test

import (
	"regexp"
	"strconv"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/oac/sandbox-agent/api"
	"github.com/oac/sandbox-agent/schema"
)

// schemaVersionProse finds a schema version named in prose: "Schema
// version N" says which version a file describes, "since schema version N"
// when a field or kind came.
var schemaVersionProse = regexp.MustCompile(`(?i)(since )?schema version (\d+)`)

// The prose of every schema file names the schema version this build
// speaks (api.SchemaVersion) as its own, and none newer as a field's
// "since": a bump of api.SchemaVersion fails here until the files say it.
func TestSchemaProseNamesTheCurrentSchemaVersion(t *testing.T) {
	for _, n := range schema.Names {
		data, err := schema.File(n)
		if !assert.NoError(t, err, n) {
			continue
		}
		for _, m := range schemaVersionProse.FindAllSubmatch(data, -1) {
			v, err := strconv.Atoi(string(m[2]))
			if !assert.NoError(t, err, "%s: %q", n, m[0]) {
				continue
			}
			if len(m[1]) > 0 {
				assert.True(t, v >= 1 && v <= api.SchemaVersion, "%s: %q names a schema version this build (%d) does not know", n, m[0], api.SchemaVersion)
				continue
			}
			assert.Equal(t, api.SchemaVersion, v, "%s: %q is not the schema version this build speaks", n, m[0])
		}
	}
}

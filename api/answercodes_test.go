package api

import (
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// docs/schema.md lists every answer code with the retry and meaning of
// AnswerCodes, in the same order.
func TestTheDocsListEveryAnswerCodeAsTheCodeDoes(t *testing.T) {
	doc, err := os.ReadFile("../docs/schema.md")
	require.NoError(t, err)
	var rows []string
	for _, l := range strings.Split(string(doc), "\n") {
		if strings.HasPrefix(l, "| `") && strings.Count(l, "|") == 4 {
			rows = append(rows, l)
		}
	}
	var want []string
	for _, c := range AnswerCodes {
		retry := "no"
		if c.Retry {
			retry = "yes"
		}
		want = append(want, fmt.Sprintf("| `%s` | %s | %s |", c.Code, retry, c.Meaning))
	}
	require.Len(t, rows, len(want), "one row per code")
	for i, r := range rows {
		assert.Equal(t, want[i], r, "row %d", i)
	}
}

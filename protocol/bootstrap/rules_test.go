package bootstrap

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Every sentinel of this package is a rule error, so errors.Is(err,
// ErrInvalid) holds for whatever rule failed: a caller gets the code
// invalid_bootstrap from the kind, never from the text.
func TestEverySentinelIsAnInvalidBootstrap(t *testing.T) {
	files, err := filepath.Glob("*.go")
	require.NoError(t, err)
	fset := token.NewFileSet()
	n := 0
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, 0)
		require.NoError(t, err)
		for _, d := range f.Decls {
			g, ok := d.(*ast.GenDecl)
			if !ok || g.Tok != token.VAR {
				continue
			}
			for _, sp := range g.Specs {
				vs := sp.(*ast.ValueSpec)
				for i, id := range vs.Names {
					if !strings.HasPrefix(id.Name, "Err") || id.Name == "ErrInvalid" {
						continue
					}
					n++
					call, ok := vs.Values[i].(*ast.CallExpr)
					fn, _ := call.Fun.(*ast.Ident)
					assert.True(t, ok && fn != nil && fn.Name == "rule", "%s must be declared with rule(...)", id.Name)
				}
			}
		}
	}
	assert.Greater(t, n, 40, "the sentinels were found")
	for _, err := range []error{ErrNoLink, ErrPublicURLUnreachable, ErrWrongTenant, ErrDecode, ErrSandboxIOSyntax, ErrHealthPort} {
		assert.ErrorIs(t, err, ErrInvalid, err.Error())
	}
}

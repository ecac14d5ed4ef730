// Command darwincheck type-checks a package as macOS would compile it with
// cgo (GOOS=darwin, CGO_ENABLED=1), with cgo's C package faked
// (go/types FakeImportC): the darwin-only Virtualization.framework code of
// host/provider/vz cannot be built on Linux (it needs the macOS SDK), but
// its use of github.com/Code-Hex/vz/v3's Go API can be checked here. make
// cross runs it; the macOS workflow builds and tests the real thing.
//
// Usage: go run ./internal/darwincheck DIR...
package main

import (
	"fmt"
	"go/ast"
	"go/build"
	"go/parser"
	"go/token"
	"go/types"
	"os"
	"path/filepath"
)

var ctx = build.Default
var fset = token.NewFileSet()
var cache = map[string]*types.Package{}
var srcDir string

type imp struct{}

func (imp) Import(path string) (*types.Package, error) { return imp{}.ImportFrom(path, srcDir, 0) }
func (imp) ImportFrom(path, dir string, _ types.ImportMode) (*types.Package, error) {
	if path == "unsafe" {
		return types.Unsafe, nil
	}
	bp, err := ctx.Import(path, dir, 0)
	if err != nil {
		return nil, err
	}
	if p, ok := cache[bp.ImportPath]; ok {
		return p, nil
	}
	return check(bp, false)
}

func check(bp *build.Package, report bool) (*types.Package, error) {
	var files []*ast.File
	for _, f := range append(append([]string{}, bp.GoFiles...), bp.CgoFiles...) {
		af, err := parser.ParseFile(fset, filepath.Join(bp.Dir, f), nil, 0)
		if err != nil {
			return nil, err
		}
		files = append(files, af)
	}
	var errs []error
	conf := types.Config{Importer: imp{}, FakeImportC: true, Error: func(err error) { errs = append(errs, err) }}
	p, _ := conf.Check(bp.ImportPath, fset, files, nil)
	cache[bp.ImportPath] = p
	if report {
		for _, e := range errs {
			fmt.Fprintln(os.Stderr, e)
		}
		if len(errs) > 0 {
			os.Exit(1)
		}
	}
	return p, nil
}

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: darwincheck DIR...")
		os.Exit(2)
	}
	for _, arch := range []string{"arm64", "amd64"} {
		for _, dir := range os.Args[1:] {
			ctx = build.Default
			ctx.GOOS, ctx.GOARCH, ctx.CgoEnabled = "darwin", arch, true
			cache = map[string]*types.Package{}
			abs, err := filepath.Abs(dir)
			if err != nil {
				fmt.Fprintln(os.Stderr, err)
				os.Exit(1)
			}
			srcDir = abs
			bp, err := ctx.ImportDir(abs, 0)
			if err != nil {
				fmt.Fprintln(os.Stderr, err)
				os.Exit(1)
			}
			check(bp, true)
			fmt.Printf("darwincheck: %s type-checks for darwin/%s with cgo (%d files)\n", dir, arch, len(bp.GoFiles)+len(bp.CgoFiles))
		}
	}
}

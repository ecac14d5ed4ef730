#!/bin/sh
# Runs every fuzz target of the module, each for $1 (a go test -fuzztime
# value: 30s, 2s, 500x). Targets are found by their declarations
# (func FuzzX(f *testing.F)), so no package is compiled just to list them.
set -eu
time=${1:-30s}
go=${GO:-go}
n=0
for file in $(git ls-files '*_test.go' 2>/dev/null || find . -name '*_test.go'); do
	for f in $(sed -n 's/^func \(Fuzz[A-Za-z0-9_]*\)(f \*testing\.F).*/\1/p' "$file"); do
		pkg=./$(dirname "$file")
		echo "== $pkg $f ($time)"
		$go test -run '^$' -fuzz "^$f\$" -fuzztime "$time" "$pkg"
		n=$((n + 1))
	done
done
echo "fuzz: $n targets ran for $time each"

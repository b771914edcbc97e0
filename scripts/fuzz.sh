#!/usr/bin/env bash
# fuzz.sh BUDGET: run every Go fuzz target for BUDGET each (seed corpus first). BUDGET is
# go test's -fuzztime: a duration (10s) or an execution count (30000x). make uses a count: on a
# loaded machine a duration can end while a worker is busy, and go test then fails with a bare
# "context deadline exceeded" that names no input.
set -euo pipefail
cd "$(dirname "$0")/.."
time="${1:-30000x}"
found=0
for pkg in $(go list ./... | grep -v /integration); do
	dir=$(go list -f '{{.Dir}}' "$pkg")
	for target in $(grep -ho '^func Fuzz[A-Za-z0-9_]*' "$dir"/*_test.go 2>/dev/null | sed 's/^func //'); do
		found=1
		echo "fuzz: $pkg $target ($time)"
		go test -tags seccomp -run '^$' -fuzz "^${target}\$" -fuzztime "$time" "$pkg"
	done
done
[ "$found" = 1 ] || echo "fuzz: no fuzz targets yet"

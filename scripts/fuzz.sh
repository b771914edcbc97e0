#!/usr/bin/env bash
# fuzz.sh DURATION: run every Go fuzz target for DURATION each (seed corpus first).
set -euo pipefail
cd "$(dirname "$0")/.."
time="${1:-10s}"
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

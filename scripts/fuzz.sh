#!/usr/bin/env bash
# fuzz.sh BUDGET: run every Go fuzz target for BUDGET each (seed corpus first). BUDGET is
# go test's -fuzztime: a duration (10s) or an execution count (30000x). make uses a count: on a
# loaded machine a duration can end while a worker is busy, and go test then fails with a bare
# "context deadline exceeded" that names no input. A target whose inputs are slow (each one
# decrypts packets, say) sets its own count in a comment line right above it:
# "// fuzz.sh: 3000x" (make's count, not a given duration, is what it replaces).
set -euo pipefail
cd "$(dirname "$0")/.."
time="${1:-30000x}"
found=0
for pkg in $(go list ./... | grep -v /integration); do
	dir=$(go list -f '{{.Dir}}' "$pkg")
	for target in $(grep -ho '^func Fuzz[A-Za-z0-9_]*' "$dir"/*_test.go 2>/dev/null | sed 's/^func //'); do
		found=1
		budget="$time"
		if [[ "$time" == *x ]]; then
			own=$(grep -h -B1 "^func ${target}(" "$dir"/*_test.go | sed -n 's|^// fuzz.sh: \([0-9]*x\)$|\1|p')
			budget="${own:-$time}"
		fi
		echo "fuzz: $pkg $target ($budget)"
		go test -tags seccomp -run '^$' -fuzz "^${target}\$" -fuzztime "$budget" "$pkg"
	done
done
[ "$found" = 1 ] || echo "fuzz: no fuzz targets yet"

#!/usr/bin/env bash
# check-registry-hosts.sh: fail when a tracked file names a package registry host (the Go
# module proxy and checksum database, Debian and Ubuntu mirrors, PyPI, npm, container
# registries, ...). The repository names none: examples use example.org-style names, and
# scripts/ensure-go.sh relies on the go command's built-in defaults. `make vet` runs it.
#
# The names below are split in two ("a""b" is "ab" to the shell) so that this file does
# not contain them and does not match itself.
set -euo pipefail
cd "$(dirname "$0")/.."

hosts=(
	"proxy.go""lang.org" "sum.go""lang.org" "goproxy"".io" "goproxy"".cn"
	"dl.goo""gle.com" "go.dev""/dl" "storage.googlea""pis.com"
	"deb""ian.org" "ubu""ntu.com" "node""source.com"
	"py""pi.org" "pypi.py""thon.org" "python""hosted.org" "ana""conda.org"
	"np""mjs.org" "np""mjs.com" "yarn""pkg.com"
	"dock""er.io" "dock""er.com" "qu""ay.io" "gh""cr.io" "gc""r.io" "registry.k""8s.io"
	"ecr"".aws" "docker.p""kg.dev" "mcr.micro""soft.com"
	"cra""tes.io" "ruby""gems.org" "pack""agist.org" "nu""get.org" "mav""en.org"
	"cp""an.org" "hack""age.haskell.org"
)

if ! git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
	msg="check-registry-hosts: $(pwd) is not a git checkout; cannot list the tracked files"
	if [ "${CI:-}" = true ]; then
		echo "$msg (CI=true: failing)" >&2
		exit 1
	fi
	echo "$msg; skipped" >&2
	exit 0
fi

args=()
for h in "${hosts[@]}"; do args+=(-e "$h"); done
if found=$(git grep -n -I -i -F "${args[@]}"); then
	echo "check-registry-hosts: tracked files name package registry hosts; use example.org-style names:" >&2
	echo "$found" >&2
	exit 1
fi
echo "check-registry-hosts: no package registry host in $(git ls-files | wc -l) tracked files"

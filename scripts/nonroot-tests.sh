#!/usr/bin/env bash
# nonroot-tests.sh PKG...: run the unit tests of each package as uid and gid 65534 (nobody),
# with no supplementary groups: the packages that need no privilege (the lifecycle with its
# fakes, the event log, the metrics, the API) must pass without root. Each test binary is built
# by the caller's go (go test -c) into a directory nobody can read, then run by setpriv in its
# package's directory. Run as root (make unit does, when it is root).
set -euo pipefail
cd "$(dirname "$0")/.."
[ "$(id -u)" = 0 ] || { echo "nonroot-tests: run as root (it drops to uid 65534)"; exit 1; }
dir=$(mktemp -d /tmp/enforcerd-nonroot.XXXXXX)
trap 'rm -rf "$dir"' EXIT
chmod 755 "$dir"
for pkg in "$@"; do
	bin="$dir/$(echo "$pkg" | tr / _).test"
	go test -c -tags seccomp -o "$bin" "./$pkg"
	[ -e "$bin" ] || continue # no test files
	chmod 755 "$bin"
	echo "nonroot: $pkg as uid 65534"
	# (ENFORCERD_NONROOT_RERUN: a test that only root can set up skips here, having run as root)
	(cd "$pkg" && ENFORCERD_NONROOT_RERUN=1 setpriv --reuid 65534 --regid 65534 --clear-groups "$bin" -test.count=1)
done

#!/usr/bin/env bash
# ensure-go.sh: print the path of a go binary at least as new as go.mod's `go` line, and
# fetch that toolchain first when this machine has none. Only the path goes to stdout
# (the Makefile sets GO from it); progress and errors go to stderr.
#
# Looked at in this order, the first new enough wins:
#   1. `go` on PATH
#   2. /usr/local/go/bin/go (the official tarball's place; sudo's PATH lacks it)
#   3. the toolchain this script fetched before, .cache/go/<version>/bin/go
#   4. a fresh fetch into that place.
#
# The fetch is the toolchain module that `GOTOOLCHAIN=goX.Y.Z` itself uses,
# golang.org/toolchain@v0.0.1-goX.Y.Z.linux-<arch>, downloaded by an older go (the one on
# PATH, else Debian's golang-go, apt-get installed through scripts/ensure-packages.sh) with
#   go mod download -json golang.org/toolchain@v0.0.1-goX.Y.Z.linux-<arch>
# That is the go command's own module download: from its default module proxy (or the
# mirror GOPROXY names) and checked against its default checksum database, signed tree
# proofs included. This script names no server and pins no hash; it clears every setting
# that would skip or redirect that check (GOSUMDB, GONOSUMDB, GONOSUMCHECK, GOPRIVATE,
# GOINSECURE, GOFLAGS, the user's go env file). The download goes to a module cache under
# .cache/go (nothing outside the checkout is written); the verified module directory it
# prints (`Dir`) is copied to .cache/go/<version>, its programs made executable (a module
# zip keeps no modes, as the go command does for toolchains), and the module cache removed.
# .cache is gitignored and kept by make clean, so a second run fetches nothing.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cache="$root/.cache/go"

say() { echo "ensure-go: $*" >&2; }
die() { say "$*"; exit 1; }

# The version go.mod needs (`go` line) and the one to fetch (`toolchain` line if newer).
norm() { # 1.26 -> go1.26.0 (from 1.21 on, a two-part version names the .0 release)
	local v=${1#go}
	[[ $v =~ ^[0-9]+\.[0-9]+$ ]] && v=$v.0
	echo "go$v"
}
gomod_go=$(awk '$1 == "go" { print $2; exit }' "$root/go.mod")
gomod_tc=$(awk '$1 == "toolchain" { print $2; exit }' "$root/go.mod")
[ -n "$gomod_go" ] || die "no go line in $root/go.mod"
want=$(norm "$gomod_go")

# ge A B: version A (go1.x.y) is at least B.
ge() { [ "$(printf '%s\n' "${2#go}" "${1#go}" | sort -V | head -n1)" = "${2#go}" ]; }
get=$want
if [ -n "$gomod_tc" ] && [ "$gomod_tc" != default ] && ge "$(norm "$gomod_tc")" "$want"; then
	get=$(norm "$gomod_tc")
fi

# version BIN: the release BIN reports, run from / with GOTOOLCHAIN=local so that a
# go >= 1.21 neither reads our go.mod nor switches toolchains.
version() { (cd / && GOTOOLCHAIN=local "$1" env GOVERSION 2>/dev/null); }
# usable BIN: BIN runs and reports a release at least $want.
usable() {
	local v
	[ -x "$1" ] || return 1
	v=$(version "$1") || return 1
	[[ $v =~ ^go[0-9] ]] && ge "$v" "$want"
}

cached="$cache/$get/bin/go"
for cand in "$(command -v go || true)" /usr/local/go/bin/go "$cached"; do
	if [ -n "$cand" ] && usable "$cand"; then
		echo "$cand"
		exit 0
	fi
done

case "$(uname -m)" in
x86_64 | amd64) arch=amd64 ;;
aarch64 | arm64) arch=arm64 ;;
*) arch="" ;;
esac
if [ "$(uname -s)" != Linux ] || [ -z "$arch" ]; then
	die "no go >= $want here and no toolchain module for $(uname -s)/$(uname -m); install Go $want"
fi

# The go that fetches: any go that runs (the one on PATH), else Debian's golang-go.
fetcher=$(command -v go || true)
if [ -z "$fetcher" ] || ! version "$fetcher" >/dev/null; then
	"$root/scripts/ensure-packages.sh" golang-go ca-certificates >&2 || die "need a go (Debian's golang-go) to fetch Go $get"
	fetcher=/usr/bin/go
fi
[ -x "$fetcher" ] || die "no go to fetch Go $get with: $fetcher is missing after installing golang-go"

mod="golang.org/toolchain@v0.0.1-$get.linux-$arch"
mkdir -p "$cache"
tmp=$(mktemp -d "$cache/.fetch.XXXXXX")
# The module cache's files are read-only; make them writable to remove them.
trap 'chmod -R u+w "$tmp" 2>/dev/null; rm -rf "$tmp"' EXIT
mkdir "$tmp/gopath" "$tmp/gocache" "$tmp/home" "$tmp/work"
# (a module of its own, so that the fetching go, older than ours, never reads our go.mod)
printf 'module fetch.example.org/toolchain\n\ngo 1.19\n' >"$tmp/work/go.mod"
say "no go >= $want found; fetching $mod (about 70 MB) with $fetcher ($(version "$fetcher"))"

# Run in that module's directory, with a clean environment: only the proxy
# setting (a mirror, if the operator has one), the HTTP proxy and the TLS roots
# (SSL_CERT_FILE, SSL_CERT_DIR) survive from the caller's. None of them can weaken the
# checksum database's check.
fetchenv=(env -i PATH=/usr/bin:/bin HOME="$tmp/home" GOENV=off GO111MODULE=on GOTOOLCHAIN=local
	GOPATH="$tmp/gopath" GOMODCACHE="$tmp/gopath/pkg/mod" GOCACHE="$tmp/gocache" GOFLAGS=
	${GOPROXY:+GOPROXY="$GOPROXY"}
	${http_proxy:+http_proxy="$http_proxy"} ${https_proxy:+https_proxy="$https_proxy"}
	${HTTP_PROXY:+HTTP_PROXY="$HTTP_PROXY"} ${HTTPS_PROXY:+HTTPS_PROXY="$HTTPS_PROXY"}
	${NO_PROXY:+NO_PROXY="$NO_PROXY"} ${no_proxy:+no_proxy="$no_proxy"}
	${SSL_CERT_FILE:+SSL_CERT_FILE="$SSL_CERT_FILE"} ${SSL_CERT_DIR:+SSL_CERT_DIR="$SSL_CERT_DIR"})
if ! json=$(cd "$tmp/work" && "${fetchenv[@]}" "$fetcher" mod download -json "$mod" 2>"$tmp/err"); then
	cat "$tmp/err" >&2
	err=$(sed -n 's/^[[:space:]]*"Error": "\(.*\)",\{0,1\}$/\1/p' <<<"$json")
	die "go mod download $mod failed${err:+: $err} (is $get a Go release for linux-$arch?)"
fi
field() { sed -n 's/^[[:space:]]*"'"$1"'": "\(.*\)",\{0,1\}$/\1/p' <<<"$json" | head -n1; }
dir=$(field Dir)
sum=$(field Sum)
[ -n "$dir" ] && [ -d "$dir" ] || die "go mod download $mod printed no module directory"
[ -x "$dir/bin/go" ] || [ -f "$dir/bin/go" ] || die "$dir has no bin/go: not a Go toolchain"
say "downloaded and verified $mod ($sum)"

# Copy the module's tree, then give the programs back their modes (the go command does
# the same for a toolchain it switches to).
cp -a "$dir" "$tmp/root"
chmod -R u+w "$tmp/root"
find "$tmp/root/bin" "$tmp/root/pkg/tool" -type f -exec chmod 0755 {} +

# An atomic rename: a make running in parallel that won the race leaves its tree in place.
mv -T "$tmp/root" "$cache/$get" 2>/dev/null || [ -x "$cached" ] ||
	die "could not move the toolchain into $cache/$get (remove it and retry)"
usable "$cached" || die "$cached does not run (remove $cache/$get and retry)"
say "installed $get in ${cache#"$root"/}/$get"
echo "$cached"

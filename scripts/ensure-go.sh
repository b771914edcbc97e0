#!/usr/bin/env bash
# ensure-go.sh: print the path of a go binary at least as new as go.mod's `go` line, and
# download that toolchain first when this machine has none. Only the path goes to stdout
# (the Makefile sets GO from it); progress and errors go to stderr.
#
# Looked at in this order, the first new enough wins:
#   1. `go` on PATH
#   2. /usr/local/go/bin/go (the official tarball's place; sudo's PATH lacks it)
#   3. the toolchain this script downloaded before, .cache/go/<version>/...
#   4. a fresh download into that place.
#
# The download is the toolchain module zip that `GOTOOLCHAIN=goX.Y.Z` itself fetches:
#   $GOPROXY/golang.org/toolchain/@v/v0.0.1-goX.Y.Z.linux-<arch>.zip
# Debian 12's golang-go (1.19) predates GOTOOLCHAIN (1.21), so we fetch it with curl instead.
# The zip is unpacked into a temporary directory and its module hash (the "h1:" dirhash that
# go.sum and the checksum database hold: base64 of the SHA-256 of the `sha256sum` lines of
# every file, sorted by name) is computed here with coreutils and compared with:
#   - the hash pinned below for this version and arch, when there is one. The pinned hashes
#     were obtained with `go mod download -json golang.org/toolchain@v0.0.1-goX.Y.Z.linux-ARCH`,
#     which checks them against sum.golang.org with its signed tree proofs; or else
#   - the hash the checksum database returns for it (through the proxy's sumdb endpoint, as
#     the go command does, else sum.golang.org directly). That lookup is authenticated by TLS
#     only: this script cannot check the database's signature and inclusion proofs, so a
#     warning asks to pin the hash.
# Only a verified tree is moved into .cache/go/<version> (.cache is gitignored; make clean
# removes it), so a directory there is a verified toolchain and a second run downloads nothing.
# The download needs curl, ca-certificates and unzip; missing ones are apt-get installed
# through scripts/ensure-packages.sh (root only).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cache="$root/.cache/go"

say() { echo "ensure-go: $*" >&2; }
die() { say "$*"; exit 1; }

# Pinned module hashes: "<version>-<arch>) echo h1:...;;". Add a line per go.mod bump.
pinned() {
	case "$1" in
	go1.26.8-amd64) echo 'h1:ZOmGe1OnfREDMIdb1Qi4G9JSuDPBLGExZMQ4nis1RXM=' ;;
	go1.26.8-arm64) echo 'h1:sYL/O6MqS68ML0kjsQ36WoYIpJqkw60TxizWUYUKQMc=' ;;
	esac
}

# The version go.mod needs (`go` line) and the one to download (`toolchain` line if newer).
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

# usable BIN: BIN runs and reports a release at least $want. Run from / with
# GOTOOLCHAIN=local so that a go >= 1.21 neither reads our go.mod nor switches toolchains.
usable() {
	local v
	[ -x "$1" ] || return 1
	v=$(cd / && GOTOOLCHAIN=local "$1" env GOVERSION 2>/dev/null) || return 1
	[[ $v =~ ^go[0-9] ]] && ge "$v" "$want"
}

case "$(uname -m)" in
x86_64 | amd64) arch=amd64 ;;
aarch64 | arm64) arch=arm64 ;;
*) arch="" ;;
esac
mod="golang.org/toolchain@v0.0.1-$get.linux-$arch"
cached="$cache/$get/$mod/bin/go"

for cand in "$(command -v go || true)" /usr/local/go/bin/go "$cached"; do
	if [ -n "$cand" ] && usable "$cand"; then
		echo "$cand"
		exit 0
	fi
done

if [ "$(uname -s)" != Linux ] || [ -z "$arch" ]; then
	die "no go >= $want here and no download for $(uname -s)/$(uname -m); install Go $want"
fi

# The proxy: GOPROXY's first entry when it is a URL (a mirror), else the public one.
proxy=${GOPROXY:-}
proxy=${proxy%%[,|]*}
[[ $proxy =~ ^https?:// ]] || proxy=https://proxy.golang.org
proxy=${proxy%/}

need=()
command -v curl >/dev/null || need+=(curl)
command -v unzip >/dev/null || need+=(unzip)
[ -e /etc/ssl/certs/ca-certificates.crt ] || need+=(ca-certificates)
if [ ${#need[@]} -gt 0 ]; then
	"$root/scripts/ensure-packages.sh" curl ca-certificates unzip >&2 ||
		die "need ${need[*]} to download Go $get"
fi

mkdir -p "$cache"
tmp=$(mktemp -d "$cache/.download.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
url="$proxy/golang.org/toolchain/@v/v0.0.1-$get.linux-$arch.zip"
say "no go >= $want found; downloading $get (linux-$arch, about 70 MB) from $url"
curl -fsSL --retry 3 -o "$tmp/go.zip" "$url" || die "download of $url failed (is $get a Go release for linux-$arch?)"

# Every entry must be a plain file under the module's prefix (no directories, no ..).
unzip -Z1 "$tmp/go.zip" >"$tmp/files" || die "$url is not a zip"
if awk -v p="$mod/" 'index($0, p) != 1 || /\/$/ || /\\/ || /\/\.\.\// { bad = 1 } END { exit !bad }' "$tmp/files"; then
	die "$url has entries outside $mod/ (or directories, .. or backslashes)"
fi
mkdir "$tmp/root"
unzip -q "$tmp/go.zip" -d "$tmp/root" || die "unzip of $url failed"

# The h1: dirhash (golang.org/x/mod/sumdb/dirhash.Hash1) of the zip's files.
hex=$(cd "$tmp/root" && LC_ALL=C sort "$tmp/files" | xargs -d '\n' sha256sum | sha256sum | cut -d' ' -f1)
esc=""
for ((i = 0; i < ${#hex}; i += 2)); do esc+="\\x${hex:i:2}"; done
# shellcheck disable=SC2059 # the format is the \xNN escapes of the digest's bytes
got="h1:$(printf "$esc" | base64)"

expect=$(pinned "$get-$arch")
source="pinned in scripts/ensure-go.sh"
if [ -z "$expect" ]; then
	line="golang.org/toolchain v0.0.1-$get.linux-$arch h1:"
	for db in "$proxy/sumdb/sum.golang.org" https://sum.golang.org; do
		expect=$(curl -fsS --retry 2 "$db/lookup/$mod" 2>/dev/null | grep -F "$line" | awk '{ print $3 }' || true)
		[ -n "$expect" ] && source="the checksum database at $db, over TLS only, not its signed proofs" && break
	done
	[ -n "$expect" ] || die "go.mod wants $get; no hash is pinned for linux-$arch and the checksum database is unreachable: add its h1 to scripts/ensure-go.sh"
	say "warning: no hash pinned for $get-$arch; add \"$get-$arch) echo '$expect' ;;\" to pinned() in scripts/ensure-go.sh"
fi
[ "$got" = "$expect" ] || die "$url: module hash $got, want $expect ($source); nothing installed"
say "verified $got ($source)"

# An atomic rename: a make running in parallel that won the race leaves its tree in place.
mv -T "$tmp/root" "$cache/$get" 2>/dev/null || [ -x "$cached" ] ||
	die "could not move the toolchain into $cache/$get (remove it and retry)"
usable "$cached" || die "$cached does not run (remove $cache/$get and retry)"
say "installed $get in ${cache#"$root"/}/$get"
echo "$cached"

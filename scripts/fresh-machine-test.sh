#!/usr/bin/env bash
# fresh-machine-test.sh [REF]: run `CI=true make test` from a fresh clone of REF (default HEAD)
# on a fresh Debian 12 machine: a bookworm root made with debootstrap (minbase, plus only what
# booting needs - systemd, systemd-sysv, dbus - and git, ca-certificates, make), booted with
# systemd-nspawn. Nothing else is installed beforehand: no Go, no runc, no crun, none of the
# Makefile's PKGS but util-linux (essential in Debian); make test installs what it needs as
# it would on any machine. Root only.
#
# The machine:
# - debootstrap's mirror is the one this host's apt uses (read from /etc/apt/sources.list and
#   /etc/apt/sources.list.d: the first `deb` source of the host's Debian release).
# - systemd-nspawn -b, sharing the host's network (apt and the go command's module proxy are
#   reached through it; the tests make their own network namespaces), all capabilities,
#   not registered with machined (the host may run no systemd), /proc/sys and /sys writable
#   (SYSTEMD_NSPAWN_API_VFS_WRITABLE=1), the keyring system calls allowed (nspawn's filter
#   refuses them; libcontainer gives each sandbox a session keyring, as runc does), REF as a bare repository bound read-only at /src.git
#   and a results directory bound at /results. The CA certificates the host added locally
#   (/usr/local/share/ca-certificates) are added to the machine's: it is on the host's network.
# - One unit runs the test, enforcerd-fresh-test.service (wanted by multi-user.target): it
#   remounts the cgroup v1 controller hierarchies read-write (nspawn mounts them read-only; a
#   booted host has them read-write), lists what is not installed, clones /src.git into a
#   `mktemp -d` directory (mode 0700, as a CI clone may be), runs `CI=true make test` there and
#   powers the machine off. Its output goes to /results/log, its exit status to /results/rc.
#
# Prints the log's last lines and exits with make test's status; the whole log and the
# machine's console are copied to .cache/fresh-machine.log and .cache/fresh-machine-console.log. Everything is made under one
# `mktemp -d /var/tmp/enforcerd-fresh.XXXXXX` directory and removed at the end by that name
# (FRESH_KEEP=1 keeps it). FRESH_TIMEOUT (default 150m) bounds the machine's run.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
ref=${1:-HEAD}
limit=${FRESH_TIMEOUT:-150m}

say() { echo "fresh-machine: $*" >&2; }
die() { say "$*"; exit 1; }

[ "$(id -u)" -eq 0 ] || die "run as root (debootstrap and systemd-nspawn need it)"
commit=$(git -C "$root" rev-parse --verify "$ref^{commit}") || die "no commit $ref in $root"
"$root/scripts/ensure-packages.sh" debootstrap systemd-container git >&2

# The host's Debian release and its mirror, from the host's own apt sources.
. /etc/os-release
suite=${VERSION_CODENAME:-}
[ -n "$suite" ] || die "/etc/os-release names no VERSION_CODENAME"
[ "$suite" = bookworm ] || say "warning: the host runs $suite; the machine is bookworm, from the host's mirror"
mirror=$(
	shopt -s nullglob
	# one-line sources: "deb [opts] URI SUITE COMPONENTS"
	for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
		[ -f "$f" ] && awk -v s="$suite" '$1 == "deb" { i = 2; if ($2 ~ /^\[/) { while (i <= NF && $i !~ /\]$/) i++; i++ } if ($(i+1) == s) { print $i; exit } }' "$f"
	done
	# deb822 sources: a stanza with Types: deb, Suites: containing the release, URIs:
	for f in /etc/apt/sources.list.d/*.sources; do
		awk -v s="$suite" '
			function flush() { if (deb && has && uri != "") { print uri; exit } deb = has = 0; uri = "" }
			/^[[:space:]]*$/ { flush(); next }
			/^Types:/ { for (i = 2; i <= NF; i++) if ($i == "deb") deb = 1 }
			/^Suites:/ { for (i = 2; i <= NF; i++) if ($i == s) has = 1 }
			/^URIs:/ { uri = $2 }
			END { flush() }' "$f"
	done | head -n1
)
[ -n "$mirror" ] || die "no deb source for $suite in /etc/apt/sources.list*: cannot pick a mirror"

work=$(mktemp -d /var/tmp/enforcerd-fresh.XXXXXX)
chmod 0755 "$work"
machine="enforcerd-fresh-$(basename "$work" | cut -d. -f2 | tr 'A-Z' 'a-z')"
cleanup() {
	if [ "${FRESH_KEEP:-}" = 1 ]; then
		say "kept $work"
	else
		rm -rf --one-file-system "$work"
	fi
	rm -rf --one-file-system "/run/systemd/nspawn/propagate/$machine"
}
trap cleanup EXIT
say "machine $machine in $work; commit $commit; mirror of $suite from the host's apt sources"

t0=$(date +%s)
say "debootstrap $suite (minbase + systemd, systemd-sysv, dbus, ca-certificates, git, make)"
debootstrap --variant=minbase --include=systemd,systemd-sysv,dbus,ca-certificates,git,make \
	"$suite" "$work/root" "$mirror" >"$work/debootstrap.log" 2>&1 ||
	{ tail -n 20 "$work/debootstrap.log" >&2; die "debootstrap failed"; }
say "debootstrap done in $(($(date +%s) - t0)) s"

# The CA certificates this host added locally (a TLS-intercepting egress proxy's, on some
# networks): the machine uses the host's network, so it trusts what the host trusts there.
cas=0
for c in $(find /usr/local/share/ca-certificates -name '*.crt' -type f 2>/dev/null); do
	cp "$c" "$work/root/usr/local/share/ca-certificates/" && cas=$((cas + 1))
done
if [ "$cas" -gt 0 ]; then
	chroot "$work/root" update-ca-certificates >/dev/null || die "update-ca-certificates in the machine failed"
	say "the machine trusts the host's $cas local CA certificate(s) too"
fi

# The commit, alone, as a bare repository the machine clones from.
git init -q --bare "$work/src.git"
git -C "$root" push -q "$work/src.git" "$commit:refs/heads/main"
git -C "$work/src.git" symbolic-ref HEAD refs/heads/main
mkdir "$work/results"

echo "$machine" >"$work/root/etc/hostname"
cat >"$work/root/usr/local/sbin/enforcerd-fresh-test" <<'EOF'
#!/bin/bash
set -u
echo "== fresh machine $(hostname): $(date -u +%FT%TZ), Debian $(cat /etc/debian_version), kernel $(uname -r)"
echo "== cgroups: $(awk '$3 ~ /^cgroup/ { printf "%s(%s) ", $2, $3 }' /proc/mounts)"
for m in /sys/fs/cgroup/*/; do
	# (nspawn mounts the v1 controllers read-only; a booted host has them read-write)
	mount -o remount,bind,rw "$m" || echo "== could not remount $m read-write"
done
ver() { # the installed version of package $1, or -
	local v
	v=$(dpkg-query -W -f '${db:Status-Abbrev}${Version}' "$1" 2>/dev/null)
	case "$v" in ii*) echo "${v#ii }" ;; *) echo - ;; esac
}
echo "== installed beforehand (- is not):"
for p in runc crun podman golang-go gcc nftables iproute2 busybox-static libseccomp-dev util-linux; do
	printf '==   %-16s %s\n' "$p" "$(ver "$p")"
done
echo "==   go on PATH: $(command -v go || echo none); runc: $(command -v runc || echo none); crun: $(command -v crun || echo none)"
dir=$(mktemp -d)
echo "== clone into $dir ($(stat -c %a "$dir"))"
cd "$dir" && git clone -q /src.git enforcerd && cd enforcerd || exit 1
echo "== commit $(git log -1 --format='%h %s' | cut -c1-100)"
start=$(date +%s)
CI=true make test
rc=$?
echo "== make test: exit $rc after $(($(date +%s) - start)) s, $(date -u +%FT%TZ)"
echo "== installed now: runc $(ver runc), crun $(ver crun), podman $(ver podman), golang-go $(ver golang-go)"
echo "$rc" >/results/rc
systemctl poweroff --no-block
EOF
chmod 0755 "$work/root/usr/local/sbin/enforcerd-fresh-test"
cat >"$work/root/etc/systemd/system/enforcerd-fresh-test.service" <<'EOF'
[Unit]
Description=enforcerd: CI=true make test from a fresh clone
Wants=network-online.target
After=network-online.target

[Service]
Type=oneshot
TimeoutStartSec=infinity
Environment=HOME=/root TERM=dumb
ExecStart=/usr/local/sbin/enforcerd-fresh-test
StandardOutput=append:/results/log
StandardError=append:/results/log
TasksMax=infinity

[Install]
WantedBy=multi-user.target
EOF
ln -s /etc/systemd/system/enforcerd-fresh-test.service \
	"$work/root/etc/systemd/system/multi-user.target.wants/enforcerd-fresh-test.service"

say "booting $machine; its test log is $work/results/log"
t1=$(date +%s)
set +e
SYSTEMD_NSPAWN_API_VFS_WRITABLE=1 timeout --kill-after=60 "$limit" \
	systemd-nspawn --quiet --directory="$work/root" --machine="$machine" --boot \
	--register=no --keep-unit --capability=all --system-call-filter=@keyring --console=pipe \
	--bind-ro="$work/src.git:/src.git" --bind="$work/results:/results" \
	</dev/null >"$work/console.log" 2>&1
nspawn_rc=$?
set -e
say "the machine ran $(($(date +%s) - t1)) s (nspawn exit $nspawn_rc); whole run $(($(date +%s) - t0)) s"
mkdir -p "$root/.cache"
cp "$work/results/log" "$root/.cache/fresh-machine.log" 2>/dev/null || true
cp "$work/console.log" "$root/.cache/fresh-machine-console.log"
say "logs kept in .cache/fresh-machine.log and .cache/fresh-machine-console.log"
if [ ! -s "$work/results/rc" ]; then
	tail -n 40 "$work/results/log" 2>/dev/null >&2 || true
	tail -n 20 "$work/console.log" >&2
	die "the machine stopped without a make test status (timeout $limit?)"
fi
rc=$(cat "$work/results/rc")
grep -E '^(== |ok |FAIL|--- FAIL|PASS$|panic)' "$work/results/log" | tail -n 60
[ "$rc" = 0 ] || { tail -n 80 "$work/results/log" >&2; die "make test exit $rc"; }
say "make test passed on the fresh machine"

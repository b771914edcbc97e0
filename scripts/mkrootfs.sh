#!/usr/bin/env bash
# mkrootfs.sh DIR: build a minimal busybox root filesystem for enforcerd sandboxes in DIR.
#
# It copies Debian's statically linked busybox (package busybox-static, installed with apt-get
# if missing), links every applet it has into /bin (sh, wget, nc, ping, nslookup, ip, cat, sleep,
# timeout, id, grep, tail, seq, ...), and writes /etc/passwd, /etc/group and empty mount points
# for the files enforcerd bind-mounts per session (/etc/resolv.conf, /etc/hosts, /etc/hostname).
# Running it again on the same DIR is harmless: it converges to the same tree.
#
# The result is an image directory: enforcerd mounts it read-only under an overlay per session
# and never changes it, so many sessions share one DIR.
#
# Any other root filesystem directory works the same way (session create --rootfs DIR), e.g.
#   a Debian rootfs:      debootstrap --variant=minbase bookworm /srv/images/debian
#   an OCI or Docker image: enforcerd image import NAME ARCHIVE (a docker save archive or an
#                         OCI layout), then session create --image NAME (README, Images)
# It needs no enforcerd file: the sandbox's pid 1 is built into enforcerd, and /etc/resolv.conf,
# /etc/hosts and /etc/hostname are mounted over per session.
set -euo pipefail

if [ $# -ne 1 ] || [ -z "$1" ]; then
	echo "usage: mkrootfs.sh DIR" >&2
	exit 2
fi
dir=$1
bb=/bin/busybox

# Debian's busybox-static installs /bin/busybox; the dynamically linked "busybox" package would
# not run inside a rootfs without its libraries.
if ! dpkg-query -W -f='${Status}' busybox-static 2>/dev/null | grep -q 'install ok installed'; then
	if [ "$(id -u)" -ne 0 ]; then
		echo "mkrootfs: busybox-static is not installed; run as root or install it first" >&2
		exit 1
	fi
	export DEBIAN_FRONTEND=noninteractive
	apt-get update -qq
	apt-get install -y -qq --no-install-recommends busybox-static >/dev/null
fi
if ! "$bb" --list >/dev/null 2>&1; then
	echo "mkrootfs: $bb is not a working busybox" >&2
	exit 1
fi

mkdir -p "$dir"
cd "$dir"
for d in bin sbin usr/bin usr/sbin etc proc sys dev tmp root var/tmp home run; do
	mkdir -p "$d"
done
chmod 1777 tmp var/tmp
chmod 0700 root

# Copy busybox only when it changed, through a temporary file so a half-written binary is never
# in place.
if ! cmp -s "$bb" bin/busybox; then
	install -m 0755 "$bb" bin/.busybox.new
	mv -f bin/.busybox.new bin/busybox
fi

# Every applet as a relative symlink in /bin. perl (Essential in Debian) makes the ~400 links in
# one process; the ln loop is the slow fallback.
applets=$("$bb" --list | grep -vx busybox)
if command -v perl >/dev/null; then
	# shellcheck disable=SC2086 # one applet per word
	perl -e 'chdir shift or die "chdir: $!\n";
		for (@ARGV) {
			next if -l $_ && readlink($_) eq "busybox";
			unlink $_; symlink("busybox", $_) or die "symlink $_: $!\n";
		}' bin $applets
else
	for applet in $applets; do
		ln -sfn busybox "bin/$applet"
	done
fi

write() { # write PATH MODE: stdin to PATH, replacing it only when the content differs
	local path=$1 mode=$2 tmp
	tmp=$(mktemp "$path.XXXXXX")
	cat >"$tmp"
	chmod "$mode" "$tmp"
	if cmp -s "$tmp" "$path"; then
		rm -f "$tmp"
	else
		mv -f "$tmp" "$path"
	fi
}

write etc/passwd 0644 <<'EOF'
root:x:0:0:root:/root:/bin/sh
nobody:x:65534:65534:nobody:/nonexistent:/bin/false
EOF
write etc/group 0644 <<'EOF'
root:x:0:
tty:x:5:
nogroup:x:65534:
EOF
write etc/shadow 0600 <<'EOF'
root:*:19000:0:99999:7:::
nobody:*:19000:0:99999:7:::
EOF
# Mount points: enforcerd bind-mounts per-session files over these three.
for f in etc/resolv.conf etc/hosts etc/hostname; do
	[ -f "$f" ] || : >"$f"
done
echo "mkrootfs: busybox rootfs ready in $dir"

#!/usr/bin/env bash
# mkguest.sh DIR: build a tiny VM guest for the VM-session tests in DIR (default .cache/guest):
#   DIR/vmlinuz         Debian's kernel (the package linux-image-amd64 depends on), extracted
#                       with dpkg-deb from a package apt-get downloads: nothing is installed
#   DIR/initrd.cpio.gz  a busybox (busybox-static) initramfs made with cpio, whose /init loads
#                       the virtio network modules, runs udhcpc on eth0 and then the probes the
#                       kernel command line names in probes=..., printing "PROBE ..." lines on
#                       the serial console, and reboots (with QEMU's -no-reboot: exits)
# Probes (comma-separated): resolve:NAME, tcp:HOST:PORT (a line sent to an echo server comes
# back), spoof:ADDR:HOST:PORT (the guest takes ADDR instead of its lease, keeping the gateway's
# MAC, and tries tcp:HOST:PORT), mac:MAC (with '-' for ':'; the guest takes that MAC, asks for a
# lease and tries tcp:198.18.1.10:7, then takes its own back), sleep:SECONDS, renew (a new
# DISCOVER and REQUEST), resume (a DHCP client daemon, then a connect to 198.18.1.10:7 each
# second; on the first failure a renewal and a new lookup, until it connects: a fork's guest). Only Debian packages are fetched; running it again reuses the
# kernel and rebuilds the initramfs.
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:-.cache/guest}
mkdir -p "$dir"
dir=$(cd "$dir" && pwd)
scripts/ensure-packages.sh busybox-static cpio

if [ ! -s "$dir/vmlinuz" ] || [ ! -d "$dir/modules" ]; then
	pkg=$(apt-cache depends linux-image-amd64 | sed -n 's/^ *Depends: \(linux-image-[0-9][^ ]*\)$/\1/p' | head -n1)
	[ -n "$pkg" ] || { echo "mkguest: no linux-image package behind linux-image-amd64 (apt-get update?)" >&2; exit 1; }
	tmp=$(mktemp -d)
	trap 'rm -rf "$tmp"' EXIT
	(cd "$tmp" && apt-get download "$pkg" >/dev/null 2>&1) || { apt-get update -qq && (cd "$tmp" && apt-get download "$pkg" >/dev/null); }
	dpkg-deb -x "$tmp"/"$pkg"_*.deb "$tmp/x"
	cp "$tmp"/x/boot/vmlinuz-* "$dir/vmlinuz"
	rm -rf "$dir/modules" && mkdir -p "$dir/modules"
	kdir=$(echo "$tmp"/x/lib/modules/*/kernel)
	# In load order (each module's depends= comes before it); virtio_mmio for -M microvm,
	# virtio_pci for q35.
	n=0
	for m in drivers/virtio/virtio_ring drivers/virtio/virtio drivers/virtio/virtio_mmio \
		drivers/virtio/virtio_pci_legacy_dev drivers/virtio/virtio_pci_modern_dev drivers/virtio/virtio_pci \
		net/core/failover drivers/net/net_failover drivers/net/virtio_net; do
		n=$((n + 1))
		cp "$kdir/$m.ko" "$dir/modules/$(printf %02d $n)-$(basename "$m").ko"
	done
	echo "mkguest: kernel $pkg"
fi

root=$(mktemp -d)
trap 'rm -rf "$root" ${tmp:+"$tmp"}' EXIT
mkdir -p "$root"/{bin,dev,proc,sys,etc,tmp,lib/modules}
cp /bin/busybox "$root/bin/busybox"
cp "$dir"/modules/*.ko "$root/lib/modules/"
cat >"$root/init" <<'EOF'
#!/bin/busybox sh
/bin/busybox --install -s /bin
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev 2>/dev/null
p() { echo "PROBE $*"; }
for m in /lib/modules/*.ko; do insmod "$m" 2>/dev/null; done
ip link set lo up
i=0
while ! ip link show eth0 >/dev/null 2>&1; do
	i=$((i + 1)); [ $i -gt 50 ] && { p "fail no eth0"; reboot -f; }
	sleep 0.1
done
p "mac $(cat /sys/class/net/eth0/address)"
ip link set eth0 up
udhcpc -i eth0 -s /udhcpc.script -n -q -t 10 -T 1 || p "fail no lease"
gw=$(ip route | sed -n 's/^default via \([0-9.]*\).*/\1/p')
tcp() {
	out=$(echo enforcerd-probe | nc -w 3 "$1" "$2" 2>&1)
	case $out in *enforcerd-probe*) echo ok ;; *) echo "fail $(echo "$out" | tail -n1)" ;; esac
}
for probe in $(sed -n 's/.*probes=\([^ ]*\).*/\1/p' /proc/cmdline | tr ',' ' '); do
	kind=${probe%%:*}
	arg=${probe#*:}
	case $kind in
	resolve)
		out=$(nslookup "$arg" 2>&1)
		addrs=$(echo "$out" | sed -n '/^Name:/,$ s/^Address[^:]*: *\([0-9.]*\).*/\1/p' | tr '\n' ' ')
		if [ -n "$addrs" ]; then p "resolve $arg ok $addrs"; else p "resolve $arg fail $(echo "$out" | tail -n1)"; fi ;;
	tcp)
		p "tcp $arg $(tcp "${arg%:*}" "${arg##*:}")" ;;
	spoof)
		addr=${arg%%:*}
		hp=${arg#*:}
		own=$(ip -4 -o addr show eth0 | sed -n 's/.* inet \([0-9./]*\).*/\1/p')
		gwmac=$(ip neigh show "$gw" | sed -n 's/.*lladdr \([0-9a-f:]*\).*/\1/p')
		ip addr flush dev eth0
		ip addr add "$addr/32" dev eth0
		ip route add "$gw" dev eth0 2>/dev/null
		ip route add default via "$gw" dev eth0 2>/dev/null
		[ -n "$gwmac" ] && arp -i eth0 -s "$gw" "$gwmac"
		p "spoof $addr $hp $(tcp "${hp%:*}" "${hp##*:}")"
		ip addr flush dev eth0
		ip addr add "$own" dev eth0
		ip route add default via "$gw" dev eth0 2>/dev/null ;;
	mac)
		# Another MAC (given with '-' for ':'): no lease, no way out.
		new=$(echo "$arg" | tr - :)
		own=$(cat /sys/class/net/eth0/address)
		ip link set eth0 down
		ip link set eth0 address "$new"
		ip link set eth0 up
		# /bin/true as the script: the guest keeps its address, so what
		# fails below is the new MAC's, not a missing address.
		if udhcpc -i eth0 -s /bin/true -n -q -t 3 -T 1 >/dev/null 2>&1; then l=lease; else l=nolease; fi
		ip route add default via "$gw" dev eth0 2>/dev/null
		p "mac $new $l $(tcp 198.18.1.10 7)"
		ip link set eth0 down
		ip link set eth0 address "$own"
		ip link set eth0 up
		ip route add default via "$gw" dev eth0 2>/dev/null ;;
	sleep)
		p "sleeping $arg"
		sleep "$arg" ;;
	renew)
		# A fresh DISCOVER and REQUEST.
		if udhcpc -i eth0 -s /udhcpc.script -n -q -t 5 -T 1 >/dev/null 2>&1; then p "renew ok"; else p "renew fail"; fi ;;
	resume)
		# For a fork: a DHCP client daemon holds the lease; the guest then
		# connects once a second. When a connect fails (resumed from a
		# snapshot in another session), it renews at once (SIGUSR1: a
		# unicast REQUEST for the address it holds), looks the name up
		# again and reports once it connects.
		udhcpc -i eth0 -s /udhcpc.script -p /tmp/udhcpc.pid -t 10 -T 1 -b 2>/dev/null
		p "ready $(ip -4 -o addr show eth0 | sed -n 's/.* inet \([0-9./]*\).*/\1/p')"
		renewed=0
		i=0
		while [ $i -lt 90 ]; do
			i=$((i + 1))
			nslookup api.e2e.test >/dev/null 2>&1 # keeps the address attested
			if [ "$(tcp 198.18.1.10 7)" = ok ]; then
				[ $renewed = 1 ] && { p "resumed $(ip -4 -o addr show eth0 | sed -n 's/.* inet \([0-9./]*\).*/\1/p') tcp ok"; break; }
				sleep 1
			elif [ $renewed = 0 ]; then
				p "dark $(ip -4 -o addr show eth0 | sed -n 's/.* inet \([0-9./]*\).*/\1/p')"
				renewed=1
				kill -USR1 "$(cat /tmp/udhcpc.pid)"
				sleep 2
			else
				sleep 1
			fi
		done ;;
	*) p "fail unknown probe $probe" ;;
	esac
done
p done
reboot -f
EOF
# The script writes to /dev/console: a udhcpc in the background (-b) has no stdout.
cat >"$root/udhcpc.script" <<'EOF'
#!/bin/sh
case "$1" in
deconfig) ip addr flush dev "$interface"; ip link set "$interface" up ;;
bound|renew)
	ip addr flush dev "$interface"
	ip addr add "$ip/$mask" dev "$interface"
	[ -n "$mtu" ] && ip link set "$interface" mtu "$mtu"
	for r in $router; do ip route add default via "$r" dev "$interface"; break; done
	: >/etc/resolv.conf
	for d in $dns; do echo "nameserver $d" >>/etc/resolv.conf; done
	echo "PROBE lease $ip/$mask router=$router dns=$dns mtu=$mtu lease=$lease serverid=$serverid" >/dev/console ;;
nak) echo "PROBE nak $message" >/dev/console ;;
esac
EOF
chmod 755 "$root/init" "$root/udhcpc.script"
(cd "$root" && find . | LC_ALL=C sort | cpio -o -H newc --quiet) | gzip -1 >"$dir/initrd.cpio.gz.tmp"
mv "$dir/initrd.cpio.gz.tmp" "$dir/initrd.cpio.gz"
echo "mkguest: guest ready in $dir (vmlinuz, initrd.cpio.gz)"

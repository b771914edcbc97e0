#!/usr/bin/env bash
# bench.sh: `make bench`. Builds integration/cmd/bench and runs it as root: every figure
# measures enforcerd and its peer (CNI ptp, iperf3 unfiltered, dnsmasq --nftset, runc) side
# by side in the same run, inside network namespaces the program creates, and prints the
# ratios: a table plus one `RESULT name=... k=v` line per figure (docs/benchmarks.md).
#
#   make bench                 full run (about 23-24 minutes on 2 cores, the IPv6 figures included)
#   BENCH_QUICK=1 make bench   smoke run (about 2 minutes)
#   BENCH_ONLY=dns,runc make bench    some figures only (net,datapath,dns,net6,datapath6,dns6,runc,daemon,droplog,namecheck,cni,update,scale,pool)
#
# Needs ENFORCERD_BIN (the daemon binary) and ENFORCERD_ROOTFS (a busybox image from
# scripts/mkrootfs.sh); the Makefile sets both. Results also go to .cache/bench/last.txt.
set -euo pipefail
cd "$(dirname "$0")/.."

[ "$(id -u)" -eq 0 ] || { echo "bench: run as root (it builds network namespaces)" >&2; exit 1; }
: "${ENFORCERD_BIN:?set ENFORCERD_BIN to the enforcerd binary (make bench does)}"
: "${ENFORCERD_ROOTFS:?set ENFORCERD_ROOTFS to a busybox rootfs (make bench does)}"
missing=()
for tool in ip nft nsenter taskset iperf3 dnsperf dnsmasq runc; do
	command -v "$tool" >/dev/null || missing+=("$tool")
done
[ -x /usr/lib/cni/ptp ] || missing+=(/usr/lib/cni/ptp)
if [ ${#missing[@]} -gt 0 ]; then
	echo "bench: missing ${missing[*]} (make bench-deps installs them)" >&2
	exit 1
fi

GO=${GO:-go}
mkdir -p bin .cache/bench
CGO_ENABLED=1 "$GO" build -tags "seccomp netgo osusergo" -ldflags "-extldflags=-static" -o bin/enforcerd-bench ./integration/cmd/bench
echo "bench: bin/enforcerd-bench -bin $ENFORCERD_BIN -rootfs $ENFORCERD_ROOTFS${BENCH_QUICK:+ (BENCH_QUICK=$BENCH_QUICK)}${BENCH_ONLY:+ (BENCH_ONLY=$BENCH_ONLY)}" >&2
bin/enforcerd-bench -bin "$ENFORCERD_BIN" -rootfs "$ENFORCERD_ROOTFS" | tee .cache/bench/last.txt

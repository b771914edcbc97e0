#!/usr/bin/env bash
# install.sh: install a built enforcerd, enforcerctl and enforcerd-cni (make build) and the
# systemd units.
# Run as root.
#
# Where (defaults in brackets; packagers and tests set them):
#   DESTDIR          a staging root every installed path is put under [none]
#   PREFIX           [/usr/local]: binaries in PREFIX/bin, units in PREFIX/lib/systemd/system,
#                    man pages, completions and docs under PREFIX/share
#   SYSCONFDIR       [/etc]: enforcerd.toml, written only when missing
#   SYSTEMD_RUN_DIR  [/run/systemd/system]: systemd runs when it exists (then daemon-reload)
#   CNI_PLUGIN_DIRS  [/opt/cni/bin /usr/lib/cni]: container runtimes' plugin directories
#
# enforcerd-cni is installed next to enforcerd; it is not put into a runtime's plugin directory
# (that changes what the runtime may run): for each of CNI_PLUGIN_DIRS that exists this prints
# the link to make. scripts/uninstall.sh removes such a link when it points at our binary.
# enforcerctl is the thin client: enforcerd's client commands (session, image, events,
# version) in a small binary that starts fast, for scripts and agents that create many
# sessions; the daemon, doctor, reap and bugreport are enforcerd's.
set -euo pipefail
cd "$(dirname "$0")/.."
case "${1:-}" in
-h | --help)
	sed -n '2,19p' "$0" | sed 's/^# \{0,1\}//'
	exit 0
	;;
"") ;;
*)
	echo "install.sh: unknown argument $1; it takes none (see --help)" >&2
	exit 2
	;;
esac
[ "$(id -u)" -eq 0 ] || { echo "install.sh: run as root" >&2; exit 1; }
for b in enforcerd enforcerctl enforcerd-cni; do
	[ -x "bin/$b" ] || { echo "install.sh: bin/$b missing; run make build first" >&2; exit 1; }
done
PREFIX=${PREFIX:-/usr/local}
DESTDIR=${DESTDIR:-}
SYSCONFDIR=${SYSCONFDIR:-/etc}
SYSTEMD_RUN_DIR=${SYSTEMD_RUN_DIR:-/run/systemd/system}
CNI_PLUGIN_DIRS=${CNI_PLUGIN_DIRS:-/opt/cni/bin /usr/lib/cni}
bindir=$DESTDIR$PREFIX/bin
sharedir=$DESTDIR$PREFIX/share
unitdir=$DESTDIR$PREFIX/lib/systemd/system
conf=$DESTDIR$SYSCONFDIR/enforcerd.toml

install -d -m 0755 "$bindir"
install -m 0755 bin/enforcerd "$bindir/enforcerd"
install -m 0755 bin/enforcerctl "$bindir/enforcerctl"
install -m 0755 bin/enforcerd-cni "$bindir/enforcerd-cni"
# Man pages and shell completions, generated from the installed binary's own command definitions.
gen=$(mktemp -d)
trap 'rm -rf "$gen"' EXIT
"$bindir/enforcerd" man "$gen/man1"
"$bindir/enforcerd" completion bash >"$gen/enforcerd.bash"
"$bindir/enforcerd" completion zsh >"$gen/_enforcerd"
"$bindir/enforcerd" completion fish >"$gen/enforcerd.fish"
"$bindir/enforcerctl" man "$gen/man1"
"$bindir/enforcerctl" completion bash >"$gen/enforcerctl.bash"
"$bindir/enforcerctl" completion zsh >"$gen/_enforcerctl"
"$bindir/enforcerctl" completion fish >"$gen/enforcerctl.fish"
install -d -m 0755 "$sharedir/man/man1" "$sharedir/bash-completion/completions" \
	"$sharedir/zsh/site-functions" "$sharedir/fish/vendor_completions.d"
install -m 0644 "$gen"/man1/*.1 "$sharedir/man/man1/"
install -m 0644 "$gen/enforcerd.bash" "$sharedir/bash-completion/completions/enforcerd"
install -m 0644 "$gen/_enforcerd" "$sharedir/zsh/site-functions/_enforcerd"
install -m 0644 "$gen/enforcerd.fish" "$sharedir/fish/vendor_completions.d/enforcerd.fish"
install -m 0644 "$gen/enforcerctl.bash" "$sharedir/bash-completion/completions/enforcerctl"
install -m 0644 "$gen/_enforcerctl" "$sharedir/zsh/site-functions/_enforcerctl"
install -m 0644 "$gen/enforcerctl.fish" "$sharedir/fish/vendor_completions.d/enforcerctl.fish"
install -d -m 0755 "$sharedir/doc/enforcerd"
install -m 0644 README.md docs/network-model.md docs/threat-model.md "$sharedir/doc/enforcerd/"
# The vendor unit directory for locally installed software; /etc/systemd/system stays the
# admin's place for overrides (systemctl edit enforcerd).
install -d -m 0755 "$unitdir"
install -m 0644 scripts/enforcerd.service "$unitdir/enforcerd.service"
install -m 0644 scripts/enforcerd.socket "$unitdir/enforcerd.socket"
if [ "$PREFIX" != /usr/local ]; then
	# The units name /usr/local/bin/enforcerd and its docs: point them at this PREFIX.
	sed -i "s|/usr/local/|$PREFIX/|g" "$unitdir/enforcerd.service" "$unitdir/enforcerd.socket"
fi
if [ ! -e "$conf" ]; then
	install -d -m 0755 "$(dirname "$conf")"
	cat >"$conf" <<'TOML'
# enforcerd configuration; every key is also a `enforcerd serve` flag (flags win).
# socket-group = "enforcerd"
# upstream = ["192.0.2.53"]
# dns-min-ttl = "60s"
TOML
fi
for d in $CNI_PLUGIN_DIRS; do
	if [ -d "$d" ] && [ ! -e "$d/enforcerd-cni" ]; then
		echo "a CNI plugin directory exists: to let its runtime use enforcerd-cni, run: ln -s $PREFIX/bin/enforcerd-cni $d/enforcerd-cni"
	fi
done
if command -v systemctl >/dev/null && [ -d "$SYSTEMD_RUN_DIR" ]; then
	systemctl daemon-reload
	echo "installed; start with: systemctl enable --now enforcerd.socket enforcerd"
else
	echo "installed $PREFIX/bin/enforcerd, enforcerctl and enforcerd-cni; no systemd here: run 'enforcerd serve' under your supervisor"
fi

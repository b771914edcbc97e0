#!/usr/bin/env bash
# uninstall.sh [--purge]: remove what install.sh installed. Run as root.
#
# Without --purge it refuses (one line, exit 1) while sessions live: it asks the daemon
# (enforcerd session ls --json) and, when no daemon answers, looks for session records, netns
# and sandboxes of the configured name prefix and state dir. With no session it stops
# enforcerd.socket and enforcerd, runs `enforcerd reap` (the prefix's table and DNS interface,
# its entry in /run/enforcerd), and removes the binaries, units, man pages, completions and
# docs; /etc/enforcerd.toml and the state dir stay.
#
# --purge removes the sessions too and leaves nothing: it stops enforcerd.socket and enforcerd,
# runs `enforcerd reap` with /etc/enforcerd.toml's name prefix, state dir and pool (every
# session, sandbox, exec and kernel object of the prefix) before the binary goes, then
# removes what install.sh installed, /etc/enforcerd.toml, the state dir (with the default
# images dir in it), /run/enforcerd and a link to enforcerd-cni in a CNI plugin directory.
# An --images-dir outside the state dir is yours and stays.
#
# Where: DESTDIR, PREFIX, SYSCONFDIR, SYSTEMD_RUN_DIR and CNI_PLUGIN_DIRS as for install.sh;
# RUNDIR [/run/enforcerd].
set -euo pipefail
purge=0
case "${1:-}" in
--purge) purge=1 ;;
-h | --help)
	sed -n '2,19p' "$0" | sed 's/^# \{0,1\}//'
	exit 0
	;;
"") ;;
*)
	echo "uninstall.sh: unknown argument $1; want --purge or nothing (see --help)" >&2
	exit 2
	;;
esac
[ $# -le 1 ] || { echo "uninstall.sh: one argument at most (--purge), got $#" >&2; exit 2; }
[ "$(id -u)" -eq 0 ] || { echo "uninstall.sh: run as root" >&2; exit 1; }
PREFIX=${PREFIX:-/usr/local}
DESTDIR=${DESTDIR:-}
SYSCONFDIR=${SYSCONFDIR:-/etc}
SYSTEMD_RUN_DIR=${SYSTEMD_RUN_DIR:-/run/systemd/system}
CNI_PLUGIN_DIRS=${CNI_PLUGIN_DIRS:-/opt/cni/bin /usr/lib/cni}
RUNDIR=${RUNDIR:-/run/enforcerd}
bindir=$DESTDIR$PREFIX/bin
sharedir=$DESTDIR$PREFIX/share
unitdir=$DESTDIR$PREFIX/lib/systemd/system
conf=$DESTDIR$SYSCONFDIR/enforcerd.toml
bin=$bindir/enforcerd

# conf_get KEY DEFAULT: the string value of KEY in the config (KEY = "VALUE"), else DEFAULT.
conf_get() {
	local v=""
	if [ -r "$conf" ]; then
		v=$(sed -n -E "s/^[[:space:]]*$1[[:space:]]*=[[:space:]]*\"([^\"]*)\".*/\\1/p" "$conf" | tail -n 1)
	fi
	printf '%s\n' "${v:-$2}"
}
socket=$(conf_get socket /run/enforcerd/enforcerd.sock)
statedir=$(conf_get state-dir /var/lib/enforcerd)
prefix=$(conf_get name-prefix enf)
have_systemd() { command -v systemctl >/dev/null && [ -d "$SYSTEMD_RUN_DIR" ]; }

# live_sessions prints the live sessions' names (or, with no daemon, what shows they live).
live_sessions() {
	local out
	if [ -x "$bin" ] && out=$(timeout 10 "$bin" --socket "$socket" session ls --json 2>/dev/null); then
		printf '%s' "$out" | grep -o '"name": *"[^"]*"' | sed -E 's/.*"([^"]*)"$/\1/' || true
		return
	fi
	local f
	for f in "$statedir"/sessions/*.json; do
		[ -e "$f" ] && basename "$f" .json
	done
	for f in /run/netns/"$prefix"-*; do
		case $f in */"$prefix"-pool_*) continue ;; esac
		[ -e "$f" ] && echo "netns ${f##*/}"
	done
	for f in "$statedir"/containers/"$prefix"-*; do
		[ -e "$f" ] && echo "sandbox ${f##*/}"
	done
	return 0
}

if [ $purge -eq 0 ]; then
	live=$(live_sessions | sort -u | paste -sd ' ' -)
	if [ -n "$live" ]; then
		echo "uninstall.sh: sessions live ($live); delete them (enforcerd session rm NAME) or remove everything with uninstall.sh --purge" >&2
		exit 1
	fi
fi

# Socket first: with it left listening, the next DNS query or CLI call starts the daemon again.
if have_systemd; then
	# (Units already gone or never enabled are no reason to stop here: reap below refuses
	# while a daemon still serves.)
	systemctl stop enforcerd.socket enforcerd || true
	systemctl disable enforcerd.socket enforcerd || true
fi
if [ -x "$bin" ]; then
	reap=("$bin" reap)
	[ -r "$conf" ] && reap+=(--config "$conf")
	# Refused while a daemon still serves the prefix (one not run by systemd): nothing is removed.
	"${reap[@]}" || { echo "uninstall.sh: enforcerd reap failed; nothing was removed" >&2; exit 1; }
elif [ $purge -eq 1 ] && [ -n "$(live_sessions)" ]; then
	echo "uninstall.sh: $bin is gone, so the sessions cannot be reaped; reinstall (scripts/install.sh) and run uninstall.sh --purge again" >&2
	exit 1
fi

rm -f "$unitdir/enforcerd.service" "$unitdir/enforcerd.socket" "$bin" "$bindir/enforcerctl" "$bindir/enforcerd-cni"
rm -rf "$sharedir/doc/enforcerd"
rm -f "$sharedir"/man/man1/enforcerd.1 "$sharedir"/man/man1/enforcerd-*.1 \
	"$sharedir"/man/man1/enforcerctl.1 "$sharedir"/man/man1/enforcerctl-*.1 \
	"$sharedir/bash-completion/completions/enforcerd" "$sharedir/zsh/site-functions/_enforcerd" \
	"$sharedir/fish/vendor_completions.d/enforcerd.fish" \
	"$sharedir/bash-completion/completions/enforcerctl" "$sharedir/zsh/site-functions/_enforcerctl" \
	"$sharedir/fish/vendor_completions.d/enforcerctl.fish"
for d in $CNI_PLUGIN_DIRS; do
	if [ -L "$d/enforcerd-cni" ] && [ "$(readlink "$d/enforcerd-cni")" = "$PREFIX/bin/enforcerd-cni" ]; then
		rm -f "$d/enforcerd-cni"
	fi
done
if [ $purge -eq 1 ]; then
	rm -f "$conf"
	# The state dir goes whole, images included, only when it is one: an absolute path other
	# than / that holds the daemon's lock file or is named enforcerd (a config naming a wrong
	# dir removes nothing).
	if [ "${statedir#/}" != "$statedir" ] && [ "$statedir" != / ] &&
		{ [ -e "$statedir/lock" ] || [ "${statedir##*/}" = enforcerd ]; }; then
		rm -rf "$statedir"
	fi
	rm -rf "$RUNDIR"
fi
if have_systemd; then
	systemctl daemon-reload
fi
if [ $purge -eq 1 ]; then
	echo "uninstalled and purged: no session, state or configuration of enforcerd is left"
else
	echo "uninstalled; $conf and $statedir were left in place (uninstall.sh --purge removes them)"
fi

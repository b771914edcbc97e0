#!/usr/bin/env bash
# uninstall.sh: remove what install.sh installed. Sessions and state are not touched: stop the
# daemon and run `enforcerd reap` first if you want them gone too. Run as root.
set -euo pipefail
[ "$(id -u)" -eq 0 ] || { echo "uninstall.sh: run as root" >&2; exit 1; }
unit=/usr/local/lib/systemd/system/enforcerd.service
if command -v systemctl >/dev/null && [ -d /run/systemd/system ] && [ -e "$unit" ]; then
	systemctl disable --now enforcerd enforcerd.socket || true
fi
rm -f "$unit" /usr/local/lib/systemd/system/enforcerd.socket /usr/local/bin/enforcerd
rm -rf /usr/local/share/doc/enforcerd
rm -f /usr/local/share/man/man1/enforcerd.1 /usr/local/share/man/man1/enforcerd-*.1 \
	/usr/local/share/bash-completion/completions/enforcerd /usr/local/share/zsh/site-functions/_enforcerd \
	/usr/local/share/fish/vendor_completions.d/enforcerd.fish
if command -v systemctl >/dev/null && [ -d /run/systemd/system ]; then
	systemctl daemon-reload
fi
echo "uninstalled; /etc/enforcerd.toml and /var/lib/enforcerd were left in place"

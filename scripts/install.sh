#!/usr/bin/env bash
# install.sh: install a built enforcerd (make build) and its systemd unit. Run as root.
set -euo pipefail
cd "$(dirname "$0")/.."
[ "$(id -u)" -eq 0 ] || { echo "install.sh: run as root" >&2; exit 1; }
[ -x bin/enforcerd ] || { echo "install.sh: bin/enforcerd missing; run make build first" >&2; exit 1; }
install -m 0755 bin/enforcerd /usr/local/bin/enforcerd
# Man pages and shell completions, generated from the installed binary's own command definitions.
gen=$(mktemp -d)
trap 'rm -rf "$gen"' EXIT
/usr/local/bin/enforcerd man "$gen/man1"
/usr/local/bin/enforcerd completion bash >"$gen/enforcerd.bash"
/usr/local/bin/enforcerd completion zsh >"$gen/_enforcerd"
/usr/local/bin/enforcerd completion fish >"$gen/enforcerd.fish"
install -d -m 0755 /usr/local/share/man/man1 /usr/local/share/bash-completion/completions \
	/usr/local/share/zsh/site-functions /usr/local/share/fish/vendor_completions.d
install -m 0644 "$gen"/man1/*.1 /usr/local/share/man/man1/
install -m 0644 "$gen/enforcerd.bash" /usr/local/share/bash-completion/completions/enforcerd
install -m 0644 "$gen/_enforcerd" /usr/local/share/zsh/site-functions/_enforcerd
install -m 0644 "$gen/enforcerd.fish" /usr/local/share/fish/vendor_completions.d/enforcerd.fish
install -d -m 0755 /usr/local/share/doc/enforcerd
install -m 0644 README.md docs/network-model.md docs/threat-model.md /usr/local/share/doc/enforcerd/
# The vendor unit directory for locally installed software; /etc/systemd/system stays the
# admin's place for overrides (systemctl edit enforcerd).
install -d -m 0755 /usr/local/lib/systemd/system
install -m 0644 scripts/enforcerd.service /usr/local/lib/systemd/system/enforcerd.service
install -m 0644 scripts/enforcerd.socket /usr/local/lib/systemd/system/enforcerd.socket
if [ ! -e /etc/enforcerd.toml ]; then
	cat >/etc/enforcerd.toml <<'TOML'
# enforcerd configuration; every key is also a `enforcerd serve` flag (flags win).
# socket-group = "enforcerd"
# upstream = ["192.0.2.53"]
# dns-min-ttl = "60s"
TOML
fi
if command -v systemctl >/dev/null && [ -d /run/systemd/system ]; then
	systemctl daemon-reload
	echo "installed; start with: systemctl enable --now enforcerd.socket enforcerd"
else
	echo "installed /usr/local/bin/enforcerd; no systemd here: run 'enforcerd serve' under your supervisor"
fi

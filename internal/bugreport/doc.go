// Package bugreport assembles the archive an operator attaches to a bug
// report (`enforcerd bugreport`): one tar.gz of named sections, each a
// file, with a summary.json saying which were gathered and, for those that
// were not, why (the daemon is down, journalctl or dpkg-query is missing).
//
// It owns the archive's layout, the host-side collectors (kernel version,
// package versions, the daemon's last error lines from the journal or a
// log file), the secret-free session summary, and the scrub every section
// passes through: the userinfo of any URL is removed, so a scope password
// given at create can never reach the archive even if some text carried
// it. It reads nothing from inside a sandbox.
//
// It is a package of its own, not part of cmd/enforcerd, because it
// grew past wiring: the collectors and the archive are tested here
// without a daemon, and cmd/enforcerd keeps only the command line (the
// config, doctor and API calls it hands in as sections). It imports api
// only: the daemon's doctor and config stay with their owners.
//
// Limits, stated: journalctl and dpkg-query are run as programs (they
// have no library interface); a section whose tool is missing is recorded
// as unavailable with a note, never guessed.
package bugreport

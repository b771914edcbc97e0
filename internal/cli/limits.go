package cli

import (
	"errors"
	"math"
	"strconv"
	"strings"

	"github.com/spf13/pflag"
)

// Flags of the counted limits (issue 24): --connections N, --budget SIZE
// and --egress-budget SIZE on session create and update.

// maxConnections bounds --connections: each use is an element of a
// kernel set the grant sizes (about 100 bytes each once used).
const maxConnections = 1 << 24

// byteSizeFlag is a byte budget: a whole number of bytes, at least 1,
// with an optional unit: k, M, G, T (decimal, with or without B: 50MB is
// 50,000,000 bytes) or Ki, Mi, Gi, Ti (binary, with or without B: 50MiB is
// 52,428,800 bytes).
type byteSizeFlag struct{ bytes uint64 }

func (s *byteSizeFlag) Type() string { return "SIZE" }

func (s *byteSizeFlag) String() string {
	if s == nil || s.bytes == 0 {
		return ""
	}
	return strconv.FormatUint(s.bytes, 10)
}

func (s *byteSizeFlag) Set(v string) error {
	n, err := parseByteSize(v)
	if err != nil {
		return err
	}
	s.bytes = n
	return nil
}

var errByteSize = errors.New("want a whole number of bytes, at least 1, with an optional unit: 50MB (50,000,000), 50MiB (52,428,800), 2G, 512k or 1048576")

// parseByteSize parses a byte budget (see byteSizeFlag).
func parseByteSize(v string) (uint64, error) {
	s := strings.TrimSpace(v)
	i := 0
	for i < len(s) && s[i] >= '0' && s[i] <= '9' {
		i++
	}
	if i == 0 {
		return 0, errByteSize
	}
	n, err := strconv.ParseUint(s[:i], 10, 64)
	if err != nil || n == 0 {
		return 0, errByteSize
	}
	unit := strings.TrimSpace(s[i:])
	if u, ok := strings.CutSuffix(strings.ToUpper(unit), "B"); ok && u != "" {
		unit = unit[:len(u)]
	} else if ok {
		unit = ""
	}
	mult := uint64(1)
	if unit != "" {
		base := uint64(1000)
		if rest, ok := strings.CutSuffix(strings.ToLower(unit), "i"); ok {
			unit, base = unit[:len(rest)], 1024
		}
		exp := strings.Index("KMGT", strings.ToUpper(unit)) + 1
		if len(unit) != 1 || exp == 0 {
			return 0, errByteSize
		}
		for range exp {
			mult *= base
		}
	}
	if n > math.MaxUint64/mult {
		return 0, errByteSize
	}
	return n * mult, nil
}

// limitFlags are the three flags, shared by create and update.
type limitFlags struct {
	connections  atLeastFlag
	budget       byteSizeFlag
	egressBudget byteSizeFlag
}

func newLimitFlags() *limitFlags {
	return &limitFlags{connections: atLeastFlag{min: 1, want: func() string {
		return "want a whole number of connections from 1 to " + strconv.Itoa(maxConnections)
	}}}
}

func (l *limitFlags) register(fs *pflag.FlagSet) {
	fs.Var(&l.connections, "connections", "make this call's --allow entries (addresses, CIDRs, names) a grant of `N` new connections each, counted in the kernel: the next is refused (grant-used)")
	fs.Var(&l.budget, "budget", "give this call's --allow entries (addresses, CIDRs, names) a byte budget each: the bytes the session may send there (`SIZE`: 50MB, 50MiB, 2G), counted in the kernel; then its packets there are refused (budget), established ones too")
	fs.Var(&l.egressBudget, "egress-budget", "the bytes the session may send in all (`SIZE`: 50MB, 50MiB, 2G), counted in the kernel; then everything it sends is refused (budget), established flows too")
}

// values returns the flags' values; an N beyond maxConnections is refused.
func (l *limitFlags) values() (connections uint32, budget, egress uint64, err error) {
	if l.connections.n > maxConnections {
		return 0, 0, 0, errors.New("--connections " + strconv.FormatInt(l.connections.n, 10) + ": " + l.connections.want())
	}
	return uint32(l.connections.n), l.budget.bytes, l.egressBudget.bytes, nil
}

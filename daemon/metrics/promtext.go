package metrics

// The Prometheus text exposition format (version 0.0.4), written by hand.
// enforcerd is one binary, so whatever the daemon links every CLI call
// starts too. Measured (issue 21, 2 cores under load, `enforcerd --help`
// 150 times, 10 interleaved rounds, best round): 4.71 ms a start without
// the client library, 5.62 ms with github.com/prometheus/client_golang
// linked in (its package init registers collectors and builds protobuf
// descriptors: 1.24 -> 1.97 ms of init, GODEBUG=inittrace=1, median of
// 15), about a fifth more per CLI call. So the writer stays: what the
// daemon exports needs only counters, gauges and histograms with fixed
// buckets, which this file writes, and its test parses the output with
// Prometheus's own parser. cmd/enforcerd/depaware.txt shows the library
// is not linked.

import (
	"bufio"
	"io"
	"math"
	"strconv"
	"strings"
)

// promWriter writes metric families in the text format. Errors stick: the
// first one is returned by flush and everything after it is skipped.
type promWriter struct {
	w   *bufio.Writer
	err error
}

func newPromWriter(w io.Writer) *promWriter { return &promWriter{w: bufio.NewWriter(w)} }

// family starts a family: its HELP and TYPE lines. typ is counter, gauge
// or histogram.
func (p *promWriter) family(name, help, typ string) {
	p.printf("# HELP ", name, " ", escapeHelp(help), "\n# TYPE ", name, " ", typ, "\n")
}

// sample writes one series; labels alternate name and value.
func (p *promWriter) sample(name string, v float64, labels ...string) {
	p.printf(name, renderLabels(labels, "", ""), " ", formatFloat(v), "\n")
}

// histogram writes one histogram series from cumulative bucket counts
// (counts[i] observations at most bounds[i]); the +Inf bucket is count.
func (p *promWriter) histogram(name string, bounds []float64, counts []uint64, count uint64, sum float64, labels ...string) {
	for i, b := range bounds {
		p.printf(name, "_bucket", renderLabels(labels, "le", formatFloat(b)), " ", strconv.FormatUint(counts[i], 10), "\n")
	}
	p.printf(name, "_bucket", renderLabels(labels, "le", "+Inf"), " ", strconv.FormatUint(count, 10), "\n")
	p.printf(name, "_sum", renderLabels(labels, "", ""), " ", formatFloat(sum), "\n")
	p.printf(name, "_count", renderLabels(labels, "", ""), " ", strconv.FormatUint(count, 10), "\n")
}

func (p *promWriter) printf(parts ...string) {
	for _, s := range parts {
		if p.err != nil {
			return
		}
		_, p.err = p.w.WriteString(s)
	}
}

func (p *promWriter) flush() error {
	if p.err != nil {
		return p.err
	}
	return p.w.Flush()
}

// renderLabels renders {a="x",b="y"}, with extra (the histogram's le)
// last, or nothing when there are no labels.
func renderLabels(labels []string, extraName, extraValue string) string {
	if len(labels) == 0 && extraName == "" {
		return ""
	}
	var b strings.Builder
	b.WriteByte('{')
	for i := 0; i+1 < len(labels); i += 2 {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(labels[i])
		b.WriteString(`="`)
		b.WriteString(escapeLabelValue(labels[i+1]))
		b.WriteByte('"')
	}
	if extraName != "" {
		if len(labels) > 0 {
			b.WriteByte(',')
		}
		b.WriteString(extraName)
		b.WriteString(`="`)
		b.WriteString(extraValue)
		b.WriteByte('"')
	}
	b.WriteByte('}')
	return b.String()
}

var (
	helpEscaper  = strings.NewReplacer(`\`, `\\`, "\n", `\n`)
	labelEscaper = strings.NewReplacer(`\`, `\\`, "\n", `\n`, `"`, `\"`)
)

func escapeHelp(s string) string       { return helpEscaper.Replace(s) }
func escapeLabelValue(s string) string { return labelEscaper.Replace(s) }

// formatFloat writes a sample value as the format spells it.
func formatFloat(v float64) string {
	switch {
	case math.IsInf(v, 1):
		return "+Inf"
	case math.IsInf(v, -1):
		return "-Inf"
	case math.IsNaN(v):
		return "NaN"
	}
	return strconv.FormatFloat(v, 'g', -1, 64)
}

package main

import (
	"fmt"
	"io"
	"math"
	"slices"
	"strings"
	"sync"
	"text/tabwriter"
	"time"
)

// Goal says which way a figure should go and how far: the ratio ours/peer
// (or, for an absolute target, ours itself) must stay at or below (AtMost)
// or at or above (AtLeast) Target. A ratio figure with Target 0 has no
// target and is printed for information only.
type Goal int

const (
	AtMost Goal = iota
	AtLeast
)

// Result is one figure: ours and the peer measured side by side in the same
// run, and the ratio ours/peer; and, where the figure has one, its floor:
// a minimal program doing only the kernel's part of the same work, measured
// in the same run, and the ratio ours/floor (issue 25: peers move with the
// machine, floors move less).
type Result struct {
	Name   string
	Unit   string  // "ms", "q/s", "Gbit/s", "MiB", ...
	Ours   float64 // NaN: not measured
	Peer   float64
	Goal   Goal
	Target float64 // 0 (without Abs): no target
	Abs    bool    // Target applies to Ours, not to the ratio (no peer)
	Note   string  // what "peer" is, or why a figure is missing
	Extra  []string

	// The floor: FloorIs names it, one token of the RESULT line
	// ("netlink-create-floor"; "": the figure has none, its line says
	// floor=none). FloorGoal/FloorTarget are on Ours/Floor or, with
	// FloorPlus, on Ours-Floor (in Unit: "the floor + 0.5 ms"); a zero
	// FloorTarget is no target on the floor.
	Floor       float64
	FloorIs     string
	FloorGoal   Goal
	FloorTarget float64
	FloorPlus   bool
}

// FloorRatio is ours/floor (NaN without a floor).
func (r Result) FloorRatio() float64 {
	if r.FloorIs == "" || math.IsNaN(r.Ours) || math.IsNaN(r.Floor) || r.Floor == 0 {
		return math.NaN()
	}
	return r.Ours / r.Floor
}

// floorMet is "yes", "no" or "n/a" (no floor target, or not measured).
func (r Result) floorMet() string {
	if r.FloorIs == "" || r.FloorTarget == 0 {
		return "n/a"
	}
	v := r.FloorRatio()
	if r.FloorPlus {
		v = r.Ours - r.Floor
	}
	if math.IsNaN(v) {
		return "n/a"
	}
	if (r.FloorGoal == AtMost && v <= r.FloorTarget) || (r.FloorGoal == AtLeast && v >= r.FloorTarget) {
		return "yes"
	}
	return "no"
}

// floorTargetString is the floor's target as printed: "<=1.25" (on the
// ratio), "floor+0.5" (on the difference) or "none".
func (r Result) floorTargetString() string {
	if r.FloorIs == "" || r.FloorTarget == 0 {
		return "none"
	}
	if r.FloorPlus {
		return fmt.Sprintf("floor+%g", r.FloorTarget)
	}
	if r.FloorGoal == AtLeast {
		return fmt.Sprintf(">=%g", r.FloorTarget)
	}
	return fmt.Sprintf("<=%g", r.FloorTarget)
}

// Ratio is ours/peer (NaN when either is missing or the peer is zero).
func (r Result) Ratio() float64 {
	if math.IsNaN(r.Ours) || math.IsNaN(r.Peer) || r.Peer == 0 {
		return math.NaN()
	}
	return r.Ours / r.Peer
}

func (r Result) hasTarget() bool { return r.Abs || r.Target != 0 }

// Met is "yes" when every target of the figure (on the peer and on the
// floor) is met, "no" when one is missed, "n/a" when it has none (or was
// not measured).
func (r Result) Met() string {
	peer, floor := r.peerMet(), r.floorMet()
	switch {
	case peer == "no" || floor == "no":
		return "no"
	case peer == "yes" || floor == "yes":
		return "yes"
	}
	return "n/a"
}

// peerMet is Met for the target on the peer (or on ours itself) alone.
func (r Result) peerMet() string {
	v := r.Ratio()
	if r.Abs {
		v = r.Ours
	}
	if !r.hasTarget() || math.IsNaN(v) {
		return "n/a"
	}
	if (r.Goal == AtMost && v <= r.Target) || (r.Goal == AtLeast && v >= r.Target) {
		return "yes"
	}
	return "no"
}

// targetString is the target as printed: on the ratio ("<=0.1"), or on
// ours itself ("ours<=16").
func (r Result) targetString() string {
	if !r.hasTarget() {
		return "none"
	}
	op := "<="
	if r.Goal == AtLeast {
		op = ">="
	}
	if r.Abs {
		return fmt.Sprintf("ours%s%g", op, r.Target)
	}
	return fmt.Sprintf("%s%g", op, r.Target)
}

func nan() float64 { return math.NaN() }

// Line is the machine-readable form: RESULT name=... k=v ...
func (r Result) Line() string {
	var b strings.Builder
	fmt.Fprintf(&b, "RESULT name=%s unit=%s ours=%s peer=%s ratio=%s target=%s met=%s",
		r.Name, r.Unit, num(r.Ours), num(r.Peer), num(r.Ratio()), r.targetString(), r.Met())
	if r.FloorIs == "" {
		b.WriteString(" floor=none")
	} else {
		fmt.Fprintf(&b, " floor=%s floor_ratio=%s floor_target=%s floor_met=%s floor_is=%s",
			num(r.Floor), num(r.FloorRatio()), r.floorTargetString(), r.floorMet(), r.FloorIs)
	}
	for _, e := range r.Extra {
		b.WriteString(" " + e)
	}
	return b.String()
}

func num(v float64) string {
	switch {
	case math.IsNaN(v):
		return "NA"
	case v == 0:
		return "0"
	case math.Abs(v) >= 100:
		return fmt.Sprintf("%.1f", v)
	case math.Abs(v) >= 1:
		return fmt.Sprintf("%.3f", v)
	}
	return fmt.Sprintf("%.4f", v)
}

// Report collects results as figures finish and prints them.
type Report struct {
	mu      sync.Mutex
	out     io.Writer
	results []Result
}

// Add records r and prints its RESULT line at once (so a run that is cut
// short still leaves what it measured).
func (rp *Report) Add(r Result) {
	rp.mu.Lock()
	defer rp.mu.Unlock()
	rp.results = append(rp.results, r)
	fmt.Fprintln(rp.out, r.Line())
}

// Table prints every result as an aligned table.
func (rp *Report) Table(w io.Writer) {
	rp.mu.Lock()
	defer rp.mu.Unlock()
	tw := tabwriter.NewWriter(w, 2, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "figure\tunit\tours\tpeer\tratio\ttarget\tfloor\tratio\ttarget\tmet\tpeer is / note; floor is")
	for _, r := range rp.results {
		floor, floorIs := nan(), ""
		if r.FloorIs != "" {
			floor, floorIs = r.Floor, "; floor: "+r.FloorIs
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s%s\n", r.Name, r.Unit, num(r.Ours), num(r.Peer),
			num(r.Ratio()), r.targetString(), num(floor), num(r.FloorRatio()), r.floorTargetString(), r.Met(), r.Note, floorIs)
	}
	tw.Flush()
}

// Samples are durations of one operation.
type Samples []time.Duration

// Pct is the nearest-rank percentile p (0 < p <= 100) in milliseconds, NaN
// when empty.
func (s Samples) Pct(p float64) float64 {
	if len(s) == 0 {
		return math.NaN()
	}
	v := slices.Clone(s)
	slices.Sort(v)
	i := int(math.Ceil(p / 100 * float64(len(v))))
	i = min(max(i, 1), len(v))
	return ms(v[i-1])
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// pctFloat is the nearest-rank percentile of plain numbers (NaN when empty).
func pctFloat(v []float64, p float64) float64 {
	if len(v) == 0 {
		return math.NaN()
	}
	v = slices.Clone(v)
	slices.Sort(v)
	i := int(math.Ceil(p / 100 * float64(len(v))))
	i = min(max(i, 1), len(v))
	return v[i-1]
}

// median of plain numbers (NaN when empty).
func median(v []float64) float64 { return pctFloat(v, 50) }

// logf prints a progress line to stderr-like output.
func logf(format string, a ...any) {
	fmt.Fprintf(progress, "  "+format+"\n", a...)
}

func section(title string) {
	fmt.Fprintf(progress, "\n== %s (%s)\n", title, time.Now().Format("15:04:05"))
}

package container

import (
	"slices"
	"testing"
)

func TestForbiddenCapabilitiesCoverThePromise(t *testing.T) {
	promised := []string{"CAP_NET_ADMIN", "CAP_SYS_ADMIN", "CAP_SYS_MODULE", "CAP_SYS_PTRACE",
		"CAP_SYS_RAWIO", "CAP_BPF", "CAP_PERFMON", "CAP_SYS_TIME"}
	for _, c := range promised {
		if !slices.Contains(ForbiddenCapabilities(), c) {
			t.Errorf("ForbiddenCapabilities lacks %s", c)
		}
	}
	for _, c := range ForbiddenCapabilities() {
		if _, ok := capBits[c]; !ok {
			t.Errorf("forbidden capability %s is not a known name", c)
		}
		if slices.Contains(DefaultCapabilities(), c) {
			t.Errorf("default capabilities include forbidden %s", c)
		}
	}
	if slices.Contains(DefaultCapabilities(), "CAP_NET_RAW") {
		t.Error("default capabilities include CAP_NET_RAW; it must be opt-in")
	}
}

func TestCapabilitySet(t *testing.T) {
	def := DefaultCapabilities()
	withRaw := append(slices.Clone(def), "CAP_NET_RAW")
	slices.Sort(withRaw)
	tests := []struct {
		name string
		spec Spec
		want []string
	}{
		{"default", Spec{}, def},
		{"net raw", Spec{NetRaw: true}, withRaw},
		{"net raw via extra caps is not enough", Spec{ExtraCaps: []string{"CAP_NET_RAW"}}, def},
		{"forbidden extras dropped", Spec{ExtraCaps: []string{"CAP_NET_ADMIN", "sys_admin", "cap_bpf", "CAP_SYS_PTRACE"}}, def},
		{"allowed extra added, lower case", Spec{ExtraCaps: []string{"sys_nice"}}, sorted(append(slices.Clone(def), "CAP_SYS_NICE"))},
		{"duplicates collapse", Spec{NetRaw: true, ExtraCaps: []string{"NET_RAW", "CAP_KILL"}}, withRaw},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := capabilitySet(tt.spec)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got, tt.want) {
				t.Errorf("got %v, want %v", got, tt.want)
			}
		})
	}
}

// Whatever a Spec asks for, no forbidden capability is ever in the set, and NET_RAW is there
// exactly when NetRaw is set.
func TestCapabilitySetNeverForbidden(t *testing.T) {
	var all []string
	for c := range capBits {
		all = append(all, c)
	}
	for _, raw := range []bool{false, true} {
		for _, extra := range [][]string{all, ForbiddenCapabilities(), {"CAP_NET_RAW"}} {
			got, err := capabilitySet(Spec{NetRaw: raw, ExtraCaps: extra})
			if err != nil {
				t.Fatal(err)
			}
			for _, c := range ForbiddenCapabilities() {
				if slices.Contains(got, c) {
					t.Errorf("NetRaw=%v extras=%v: set contains forbidden %s", raw, extra, c)
				}
			}
			if slices.Contains(got, "CAP_NET_RAW") != raw {
				t.Errorf("NetRaw=%v: CAP_NET_RAW present=%v", raw, !raw)
			}
		}
	}
}

func TestCapabilitySetUnknown(t *testing.T) {
	_, err := capabilitySet(Spec{ExtraCaps: []string{"CAP_FLY"}})
	want := `capability "CAP_FLY": unknown; use a Linux capability name such as CAP_NET_RAW`
	if err == nil || err.Error() != want {
		t.Fatalf("got %v, want %q", err, want)
	}
}

func TestCapabilityBit(t *testing.T) {
	for name, want := range map[string]uint{"CAP_NET_ADMIN": 12, "net_raw": 13, "CAP_SYS_ADMIN": 21, "bpf": 39} {
		got, ok := CapabilityBit(name)
		if !ok || got != want {
			t.Errorf("CapabilityBit(%q) = %d, %v; want %d", name, got, ok, want)
		}
	}
	if _, ok := CapabilityBit("CAP_FLY"); ok {
		t.Error("CapabilityBit(CAP_FLY) ok")
	}
}

func sorted(s []string) []string { slices.Sort(s); return s }

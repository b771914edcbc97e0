package nsmgr

import (
	"net/netip"
	"strings"
	"testing"
)

func TestValidatePrefix(t *testing.T) {
	const want = "want 1 to 6 characters of a-z and 0-9, starting with a letter"
	tests := []struct {
		in   string
		want string // "" = valid
	}{
		{"e", ""},
		{"enf", ""},
		{"enf2", ""},
		{"abcdef", ""},
		{"n1a2b3", ""},
		{"", `invalid prefix "": empty; ` + want},
		{"abcdefg", `invalid prefix "abcdefg": 7 characters; ` + want},
		{"Enf", `invalid prefix "Enf": character 'E' not allowed; ` + want},
		{"en-f", `invalid prefix "en-f": character '-' not allowed; ` + want},
		{"en_f", `invalid prefix "en_f": character '_' not allowed; ` + want},
		{"en f", `invalid prefix "en f": character ' ' not allowed; ` + want},
		{"1enf", `invalid prefix "1enf": starts with '1'; ` + want},
		{"é", `invalid prefix "é": character 'é' not allowed; ` + want},
		{"ABCDEFGH", `invalid prefix "ABCDEFGH": character 'A' not allowed; ` + want},
	}
	for _, tt := range tests {
		err := ValidatePrefix(tt.in)
		got := ""
		if err != nil {
			got = err.Error()
		}
		if got != tt.want {
			t.Errorf("ValidatePrefix(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
}

func TestValidateSessionName(t *testing.T) {
	const want = "want 1 to 32 characters of a-z, 0-9 and '-', starting with a letter or digit"
	long := strings.Repeat("a", 32)
	tests := []struct {
		in   string
		want string
	}{
		{"a", ""},
		{"7", ""},
		{"s-1", ""},
		{"a-", ""},
		{"0-x--y", ""},
		{long, ""},
		{"", `invalid session name "": empty; ` + want},
		{long + "b", `invalid session name "` + long + `b": 33 characters; ` + want},
		{"-a", `invalid session name "-a": starts with '-'; ` + want},
		{"Sess", `invalid session name "Sess": character 'S' not allowed; ` + want},
		{"a.b", `invalid session name "a.b": character '.' not allowed; ` + want},
		{"a/b", `invalid session name "a/b": character '/' not allowed; ` + want},
		{"a_b", `invalid session name "a_b": character '_' not allowed; ` + want},
		{"sessión", `invalid session name "sessión": character 'ó' not allowed; ` + want},
	}
	for _, tt := range tests {
		err := ValidateSessionName(tt.in)
		got := ""
		if err != nil {
			got = err.Error()
		}
		if got != tt.want {
			t.Errorf("ValidateSessionName(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
}

func TestNames(t *testing.T) {
	if got := NetnsName("enf", "s1"); got != "enf-s1" {
		t.Errorf("NetnsName = %q", got)
	}
	if got := HostIfaceName("enf", 12); got != "enf12h" {
		t.Errorf("HostIfaceName = %q", got)
	}
	if got := DNSIfaceName("enf"); got != "enfdns" {
		t.Errorf("DNSIfaceName = %q", got)
	}
}

// Every interface name fits the kernel's 15 characters: the longest prefix
// with the largest slot of the largest pool.
func TestInterfaceNamesFit(t *testing.T) {
	p, err := NewIPAM(netip.MustParsePrefix("10.0.0.0/8"))
	if err != nil {
		t.Fatal(err)
	}
	prefix := "abcdef"
	last := p.Slots() - 1
	if last != 4194302 {
		t.Fatalf("largest slot of a /8 = %d, want 4194302", last)
	}
	for _, name := range []string{HostIfaceName(prefix, last), DNSIfaceName(prefix), GuestIface} {
		if len(name) > ifNameMax {
			t.Errorf("%q has %d characters, more than %d", name, len(name), ifNameMax)
		}
	}
	if got := HostIfaceName(prefix, last); got != "abcdef4194302h" {
		t.Errorf("HostIfaceName = %q", got)
	}
}

func TestParseNetnsName(t *testing.T) {
	tests := []struct {
		prefix, name string
		session      string
		ok           bool
	}{
		{"enf", "enf-x", "x", true},
		{"enf", "enf-a-b", "a-b", true},
		{"enf", "enf2-x", "", false}, // another prefix
		{"en", "enf-x", "", false},   // another prefix
		{"enf", "enf-", "", false},
		{"enf", "enf--x", "", false}, // session may not start with '-'
		{"enf", "enf-X", "", false},
		{"enf", "enf", "", false},
		{"enf", "enfdns", "", false},
		{"enf", "other-x", "", false},
	}
	for _, tt := range tests {
		s, ok := parseNetnsName(tt.prefix, tt.name)
		if s != tt.session || ok != tt.ok {
			t.Errorf("parseNetnsName(%q, %q) = %q, %v; want %q, %v", tt.prefix, tt.name, s, ok, tt.session, tt.ok)
		}
	}
}

func TestParseHostIfaceName(t *testing.T) {
	tests := []struct {
		prefix, name string
		slot         int
		ok           bool
	}{
		{"enf", "enf0h", 0, true},
		{"enf", "enf25h", 25, true},
		{"enf2", "enf25h", 5, true}, // the same name: ownership comes from the alias
		{"enf", "enf4194302h", 4194302, true},
		{"enf", "enf05h", 0, false}, // leading zero: we never make it
		{"enf", "enfh", 0, false},
		{"enf", "enf5", 0, false},
		{"enf", "enf5x", 0, false},
		{"enf", "enf-5h", 0, false},
		{"enf", "enfdns", 0, false},
		{"enf", "en5h", 0, false},
		{"enf", "enf1234567890h", 0, false},
	}
	for _, tt := range tests {
		slot, ok := parseHostIfaceName(tt.prefix, tt.name)
		if ok != tt.ok || (ok && slot != tt.slot) {
			t.Errorf("parseHostIfaceName(%q, %q) = %d, %v; want %d, %v", tt.prefix, tt.name, slot, ok, tt.slot, tt.ok)
		}
	}
}

package nsmgr

import "testing"

func TestValidateIfName(t *testing.T) {
	for _, c := range []struct {
		name, err string
	}{
		{"eth0", ""},
		{"net1", ""},
		{"abcdefghijklmno", ""},
		{"", `invalid interface name "": empty; ` + ifNameWant},
		{"abcdefghijklmnop", `invalid interface name "abcdefghijklmnop": 16 bytes; ` + ifNameWant},
		{".", `invalid interface name ".": ` + ifNameWant},
		{"..", `invalid interface name "..": ` + ifNameWant},
		{"a/b", `invalid interface name "a/b": character '/' not allowed; ` + ifNameWant},
		{"a:1", `invalid interface name "a:1": character ':' not allowed; ` + ifNameWant},
		{"a b", `invalid interface name "a b": character ' ' not allowed; ` + ifNameWant},
		{"a\tb", `invalid interface name "a\tb": character '\t' not allowed; ` + ifNameWant},
	} {
		err := ValidateIfName(c.name)
		if got := errText(err); got != c.err {
			t.Errorf("ValidateIfName(%q) = %q, want %q", c.name, got, c.err)
		}
	}
}

func TestOwnerAlias(t *testing.T) {
	for _, attached := range []bool{false, true} {
		a := ownerAlias("enf", "s-1", attached)
		s, at, ok := parseOwnerAlias("enf", a)
		if !ok || s != "s-1" || at != attached {
			t.Errorf("parseOwnerAlias(%q) = %q, %v, %v", a, s, at, ok)
		}
	}
	for _, a := range []string{"", "enf2-x attached", "enf-", "enf- attached", "enf-x attached2", "other"} {
		if s, at, ok := parseOwnerAlias("enf", a); ok || at || s != "" {
			t.Errorf("parseOwnerAlias(%q) = %q, %v, %v; want not ours", a, s, at, ok)
		}
	}
}

func errText(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

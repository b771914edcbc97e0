package nsmgr

import (
	"strings"
	"testing"
)

func TestGuestMAC(t *testing.T) {
	a, b := GuestMAC("ed", "s1"), GuestMAC("ed", "s2")
	if a.String() == b.String() {
		t.Fatalf("two sessions share MAC %s", a)
	}
	if a.String() != GuestMAC("ed", "s1").String() {
		t.Fatal("GuestMAC is not stable")
	}
	if a[0]&0x03 != 0x02 {
		t.Fatalf("MAC %s: want locally administered unicast", a)
	}
}

func TestParseGuestMAC(t *testing.T) {
	if _, err := ParseGuestMAC("02:00:00:00:00:01"); err != nil {
		t.Fatal(err)
	}
	for _, bad := range []string{"", "01:00:5e:00:00:01", "00:00:00:00:00:00", "02:00:00:00:00", "zz:00:00:00:00:01", "02:00:00:00:00:00:00:01"} {
		if _, err := ParseGuestMAC(bad); err == nil || !strings.Contains(err.Error(), "want") {
			t.Errorf("ParseGuestMAC(%q) = %v, want an error saying what is wanted", bad, err)
		}
	}
}

func TestValidateVMConfig(t *testing.T) {
	vm := VMConfig{TapOwner: NoTapOwner}
	if err := ValidateVMConfig("ed", "s1", &vm); err != nil {
		t.Fatal(err)
	}
	if vm.Tap != DefaultTap || vm.MAC.String() != GuestMAC("ed", "s1").String() {
		t.Fatalf("defaults: %+v", vm)
	}
	for _, bad := range []VMConfig{
		{Tap: "eth0", TapOwner: NoTapOwner},
		{Tap: "br0", TapOwner: NoTapOwner},
		{Tap: "a/b", TapOwner: NoTapOwner},
		{Tap: "averyveryverylongname", TapOwner: NoTapOwner},
		{TapOwner: -2},
	} {
		if err := ValidateVMConfig("ed", "s1", &bad); err == nil {
			t.Errorf("ValidateVMConfig(%+v) accepted", bad)
		}
	}
}

func TestOwnerAliasVM(t *testing.T) {
	session, attached, ok := parseOwnerAlias("ed", "ed-s1"+vmMark)
	if !ok || attached || session != "s1" {
		t.Fatalf("parseOwnerAlias(vm) = %q %v %v", session, attached, ok)
	}
}

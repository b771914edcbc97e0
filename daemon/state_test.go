package daemon

import (
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/enforcerd/enforcerd/api"
)

func sampleRecord(name string, slot int) SessionRecord {
	return SessionRecord{
		Name:      name,
		Created:   time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC),
		Request:   api.CreateRequest{Name: name, NetworkOnly: true, Allow: []string{"a.test"}, Pin: true, Labels: map[string]string{"run": "1"}},
		Slot:      slot,
		Netns:     "enf-" + name,
		NetnsPath: "/run/netns/enf-" + name,
		HostIface: "enf" + name + "h",
		Guest:     netip.MustParseAddr("10.20.0.2"),
		Gateway:   netip.MustParseAddr("10.20.0.1"),
		Pinned:    map[string][]netip.Addr{"a.test": {netip.MustParseAddr("198.18.1.10")}},
		Sandbox:   false,
	}
}

func listDir(t *testing.T, dir string) []string {
	t.Helper()
	es, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range es {
		out = append(out, e.Name())
	}
	sort.Strings(out)
	return out
}

func TestStateSaveLoadRemove(t *testing.T) {
	root := t.TempDir()
	st, err := NewStateStore(root)
	if err != nil {
		t.Fatal(err)
	}
	if st.Dir() != filepath.Join(root, "sessions") {
		t.Fatalf("dir %s", st.Dir())
	}
	rec := sampleRecord("s1", 3)
	if err := st.Save(rec); err != nil {
		t.Fatal(err)
	}
	got, err := st.Load("s1")
	if err != nil {
		t.Fatal(err)
	}
	rec.Version = stateVersion
	if !reflect.DeepEqual(got, rec) {
		t.Fatalf("round trip:\n got  %+v\nwant %+v", got, rec)
	}
	fi, err := os.Stat(filepath.Join(st.Dir(), "s1.json"))
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("record mode %v, %v", fi.Mode(), err)
	}

	// Saving again replaces the record and leaves no temp file.
	rec.Slot = 7
	if err := st.Save(rec); err != nil {
		t.Fatal(err)
	}
	if got, _ := st.Load("s1"); got.Slot != 7 {
		t.Fatalf("slot %d after re-save", got.Slot)
	}
	if names := listDir(t, st.Dir()); !reflect.DeepEqual(names, []string{"s1.json"}) {
		t.Fatalf("dir holds %v", names)
	}

	// A session without a NIC: slot -1, no addresses.
	none := SessionRecord{Name: "quiet", Slot: -1, Netns: "enf-quiet", Request: api.CreateRequest{Name: "quiet", NetworkOnly: true}}
	if err := st.Save(none); err != nil {
		t.Fatal(err)
	}
	if got, err := st.Load("quiet"); err != nil || got.Slot != -1 || got.Guest.IsValid() {
		t.Fatalf("no-NIC record %+v, %v", got, err)
	}

	for i := 0; i < 2; i++ { // idempotent
		if err := st.Remove("s1"); err != nil {
			t.Fatalf("remove #%d: %v", i+1, err)
		}
	}
	if _, err := st.Load("s1"); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("load after remove: %v", err)
	}
}

// TestStateSpareRecords: a removed record's file is kept as a spare
// (a temp file's name) and the next Save writes into it, so a
// remove-then-create makes no new file (same inode, mode 0600, the new
// content only); a spare gone from under the store is not an error; a
// start's LoadAll removes the spares as it removes every temp file.
func TestStateSpareRecords(t *testing.T) {
	st, err := NewStateStore(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	inode := func(name string) uint64 {
		t.Helper()
		fi, err := os.Stat(filepath.Join(st.Dir(), name))
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().Perm() != 0o600 {
			t.Fatalf("%s mode %v, want 0600", name, fi.Mode())
		}
		return fi.Sys().(*syscall.Stat_t).Ino
	}
	big := sampleRecord("s1", 1)
	big.Request.Allow = []string{strings.Repeat("a", 60) + ".test", strings.Repeat("b", 60) + ".test"}
	if err := st.Save(big); err != nil {
		t.Fatal(err)
	}
	first := inode("s1.json")
	if err := st.Remove("s1"); err != nil {
		t.Fatal(err)
	}
	if names := listDir(t, st.Dir()); !reflect.DeepEqual(names, []string{".spare.tmp-1"}) {
		t.Fatalf("after remove the dir holds %v, want the spare", names)
	}
	small := sampleRecord("s2", 2)
	if err := st.Save(small); err != nil {
		t.Fatal(err)
	}
	if names := listDir(t, st.Dir()); !reflect.DeepEqual(names, []string{"s2.json"}) {
		t.Fatalf("after save the dir holds %v, want the record alone", names)
	}
	if got := inode("s2.json"); got != first {
		t.Errorf("s2.json is inode %d, want the spare's %d", got, first)
	}
	got, err := st.Load("s2")
	small.Version = stateVersion
	if err != nil || !reflect.DeepEqual(got, small) {
		t.Fatalf("record written into the spare: %+v, %v; want %+v (nothing of the longer one before)", got, err, small)
	}

	// A spare removed underneath: Save makes a new file.
	if err := st.Remove("s2"); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(st.Dir(), ".spare.tmp-2")); err != nil {
		t.Fatal(err)
	}
	if err := st.Save(sampleRecord("s3", 3)); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Load("s3"); err != nil {
		t.Fatal(err)
	}

	// A start removes the spares.
	if err := st.Save(sampleRecord("s4", 4)); err != nil {
		t.Fatal(err)
	}
	if err := st.Remove("s4"); err != nil {
		t.Fatal(err)
	}
	again, _ := NewStateStore(filepath.Dir(st.Dir()))
	if recs, err := again.LoadAll(); err != nil || len(recs) != 1 || recs[0].Name != "s3" {
		t.Fatalf("LoadAll: %v, %v; want s3 alone", recs, err)
	}
	if names := listDir(t, st.Dir()); !reflect.DeepEqual(names, []string{"s3.json"}) {
		t.Fatalf("after a start the dir holds %v, want s3.json alone", names)
	}
}

func TestStateInvalidNames(t *testing.T) {
	st, _ := NewStateStore(t.TempDir())
	for _, name := range []string{"", "../x", "A", "-a", "a/b", strings.Repeat("a", 33), "a.json"} {
		if err := st.Save(SessionRecord{Name: name}); err == nil {
			t.Errorf("save %q: no error", name)
		}
		if _, err := st.Load(name); err == nil {
			t.Errorf("load %q: no error", name)
		}
		if err := st.Remove(name); err == nil {
			t.Errorf("remove %q: no error", name)
		}
	}
	for _, name := range []string{"a", "0", "a-b", strings.Repeat("z", 32)} {
		if !sessionNameValid(name) {
			t.Errorf("%q should be valid", name)
		}
	}
}

// TestStateLoadAll: sorted, temp files of an interrupted save are removed,
// corrupt records are quarantined once and reported.
func TestStateLoadAll(t *testing.T) {
	st, _ := NewStateStore(t.TempDir())
	for _, n := range []string{"zeta", "alpha", "mid"} {
		if err := st.Save(sampleRecord(n, 1)); err != nil {
			t.Fatal(err)
		}
	}
	d := st.Dir()
	os.WriteFile(filepath.Join(d, ".alpha.json.tmp-123"), []byte("{half"), 0o600)
	os.WriteFile(filepath.Join(d, "broken.json"), []byte("{half"), 0o600)
	os.WriteFile(filepath.Join(d, "other.json"), []byte(`{"version":1,"name":"someone"}`), 0o600)
	os.WriteFile(filepath.Join(d, "future.json"), []byte(`{"version":9,"name":"future"}`), 0o600)
	os.WriteFile(filepath.Join(d, "README"), []byte("x"), 0o600)

	recs, bad, err := st.LoadAllReport()
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, r := range recs {
		names = append(names, r.Name)
	}
	if !reflect.DeepEqual(names, []string{"alpha", "mid", "zeta"}) {
		t.Fatalf("records %v", names)
	}
	var badNames []string
	for _, b := range bad {
		badNames = append(badNames, b.Name+"|"+filepath.Base(b.Path)+"|"+b.Err.Error())
	}
	sort.Strings(badNames)
	want := []string{
		"|README|state directory " + d + `: unexpected entry "README"`,
		"broken|broken.json.bad|load state of session broken: invalid character 'h' looking for beginning of object key string",
		"future|future.json.bad|load state of session future: schema version 9, want 1",
		`other|other.json.bad|load state of session other: record names "someone"`,
	}
	sort.Strings(want)
	if !reflect.DeepEqual(badNames, want) {
		t.Fatalf("bad records\n got %q\nwant %q", badNames, want)
	}
	want2 := []string{"README", "alpha.json", "broken.json.bad", "future.json.bad", "mid.json", "other.json.bad", "zeta.json"}
	if got := listDir(t, d); !reflect.DeepEqual(got, want2) {
		t.Fatalf("dir after load\n got %v\nwant %v", got, want2)
	}

	// Quarantined records are not reported again.
	recs2, err := st.LoadAll()
	if err != nil || len(recs2) != 3 {
		t.Fatalf("second load: %d records, %v", len(recs2), err)
	}
	if _, bad, _ := st.LoadAllReport(); len(bad) != 1 {
		t.Fatalf("second load reported %v", bad)
	}

	if err := st.RemovePath(filepath.Join(d, "README")); err != nil {
		t.Fatal(err)
	}
	if err := st.RemovePath("/etc/passwd"); err == nil {
		t.Fatal("RemovePath outside the directory: no error")
	}
	for i := 0; i < 2; i++ {
		if err := st.RemoveAll(); err != nil {
			t.Fatal(err)
		}
	}
	if got := listDir(t, d); len(got) != 0 {
		t.Fatalf("after RemoveAll: %v", got)
	}
}

package integration

import (
	"errors"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/enforcerd/enforcerd/integration/world"
	"github.com/enforcerd/enforcerd/nsmgr"
)

// TestNsmgrCreateAlongside: CreateAlongside runs its work while the
// create's own steps run, with the session's names and addresses as
// Create returns them, and returns after both. The work fails: the create
// fails with its error and unwinds every step (no netns, link, slot or
// session left), and the name can be created again. A step fails while the
// work runs: the create waits for the work before it returns. Without a
// NIC the work is not run. (The daemon adds the session's firewall
// elements this way: TestE2E* create sessions through it.)
func TestNsmgrCreateAlongside(t *testing.T) {
	w := world.New(t)
	prefix := nsmgrPrefix(t, w)
	checkNoLeftovers(t, prefix)
	hh := hostHandle(t, w)
	var failAt atomic.Value
	failAt.Store("")
	m := newManager(t, w, prefix, "10.20.0.0/16", func(step string) error {
		if step == failAt.Load().(string) {
			return errInjected
		}
		return nil
	})

	// The positive control: the work sees what Create returns, and ended
	// before Create returned.
	var got nsmgr.Session
	var ended atomic.Bool
	sess, err := m.CreateAlongside("al", true, func(s nsmgr.Session) error {
		got = s
		time.Sleep(20 * time.Millisecond) // longer than the steps after the slot on this machine: Create must wait
		ended.Store(true)
		return nil
	})
	if err != nil {
		t.Fatalf("CreateAlongside: %v", err)
	}
	if !ended.Load() {
		t.Fatal("CreateAlongside returned before its work ended")
	}
	if got.Name != sess.Name || got.Slot != sess.Slot || got.HostIface != sess.HostIface || got.Guest != sess.Guest || got.NetnsPath != sess.NetnsPath {
		t.Errorf("the work got %+v, Create returned %+v", got, sess)
	}
	if err := m.Delete("al", sess.Slot); err != nil {
		t.Fatal(err)
	}
	waitLinkGone(t, hh, sess.HostIface)

	// The work fails: the create fails with its error and unwinds.
	errWork := errors.New("work failed")
	if _, err := m.CreateAlongside("bw", true, func(nsmgr.Session) error { return errWork }); !errors.Is(err, errWork) {
		t.Fatalf("CreateAlongside with failing work: %v, want its error", err)
	}
	assertUnwound(t, m, hh, prefix, "bw")

	// A step fails while the work runs: the create waits for the work.
	failAt.Store(nsmgr.StepGuestRoute)
	ended.Store(false)
	if _, err := m.CreateAlongside("cs", true, func(nsmgr.Session) error {
		time.Sleep(20 * time.Millisecond)
		ended.Store(true)
		return nil
	}); !errors.Is(err, errInjected) {
		t.Fatalf("CreateAlongside with a failing step: %v, want the injected error", err)
	}
	if !ended.Load() {
		t.Error("CreateAlongside returned, its step failed, before its work ended")
	}
	assertUnwound(t, m, hh, prefix, "cs")
	failAt.Store("")

	// Without a NIC the work is not run.
	var ran atomic.Bool
	s, err := m.CreateAlongside("nn", false, func(nsmgr.Session) error { ran.Store(true); return nil })
	if err != nil || ran.Load() {
		t.Fatalf("CreateAlongside without a NIC: %v, work ran %v; want created, not run", err, ran.Load())
	}
	if err := m.Delete("nn", s.Slot); err != nil {
		t.Fatal(err)
	}

	// The failed names are free: created again with no work.
	for _, name := range []string{"bw", "cs"} {
		s, err := m.Create(name, true)
		if err != nil {
			t.Fatalf("re-create %s after the unwind: %v", name, err)
		}
		if err := m.Delete(name, s.Slot); err != nil {
			t.Fatal(err)
		}
		waitLinkGone(t, hh, s.HostIface)
	}
}

// assertUnwound checks a failed create of name left nothing: no netns
// file, no link of the prefix, no slot, no session.
func assertUnwound(t *testing.T, m *nsmgr.Manager, hh *netlink.Handle, prefix, name string) {
	t.Helper()
	if _, err := os.Stat(m.NetnsPath(name)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("%s: netns file left: %v", name, err)
	}
	for _, l := range linkNames(t, hh) {
		if strings.HasPrefix(l, prefix) {
			t.Errorf("%s: link %s left in the host netns", name, l)
		}
	}
	if n := m.SlotsInUse(); n != 0 {
		t.Errorf("%s: %d slots in use after the unwind", name, n)
	}
	if got := m.Sessions(); len(got) != 0 {
		t.Errorf("%s: sessions %v after the unwind", name, got)
	}
}

package nsmgr

import (
	"slices"
	"testing"
)

func TestSessionLinks(t *testing.T) {
	m := &Manager{cfg: Config{Prefix: "enf"}}
	st := kernelState{
		netns: []foundNetns{
			{session: "live", mounted: true},
			{session: "quiet", mounted: true},
			{session: "crashed", mounted: false},
		},
		links: []foundLink{
			{name: "enf0h", slot: 0, session: "live"},
			{name: "enf1h", slot: 1, session: "gone"},    // netns deleted, veth lingers
			{name: "enf2h", slot: 2, session: "crashed"}, // netns file without mount
			{name: "enf25h", slot: 25, session: ""},      // another prefix's ("enf2" slot 5)
		},
	}
	owner, stale := m.sessionLinks(st)
	if len(owner) != 1 || owner["live"].name != "enf0h" {
		t.Errorf("owner = %v, want live -> enf0h", owner)
	}
	var names []string
	for _, l := range stale {
		names = append(names, l.name)
	}
	slices.Sort(names)
	if !slices.Equal(names, []string{"enf1h", "enf2h"}) {
		t.Errorf("stale = %v, want [enf1h enf2h]", names)
	}
}

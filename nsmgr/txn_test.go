package nsmgr

import (
	"errors"
	"testing"
)

func TestUndoStackUnwindsInReverse(t *testing.T) {
	var u undoStack
	var order []string
	u.push("a", func() error { order = append(order, "a"); return nil })
	u.push("b", func() error { order = append(order, "b"); return errors.New("busy") })
	u.push("c", func() error { order = append(order, "c"); return nil })
	err := u.unwind()
	if got := len(order); got != 3 || order[0] != "c" || order[1] != "b" || order[2] != "a" {
		t.Fatalf("order = %v, want [c b a]", order)
	}
	if err == nil || err.Error() != "undo b: busy" {
		t.Fatalf("unwind = %v, want %q", err, "undo b: busy")
	}
	if err := u.unwind(); err != nil || len(order) != 3 {
		t.Fatalf("second unwind ran again: %v %v", err, order)
	}
}

func TestCreateStepsUnique(t *testing.T) {
	seen := map[string]bool{}
	for _, s := range CreateSteps {
		if seen[s] {
			t.Fatalf("step %q listed twice", s)
		}
		seen[s] = true
	}
	if CreateSteps[0] != StepAllocateSlot || CreateSteps[len(CreateSteps)-1] != StepGuestRoute {
		t.Fatalf("CreateSteps = %v", CreateSteps)
	}
}

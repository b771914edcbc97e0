package txn

import (
	"errors"
	"io/fs"
	"slices"
	"testing"
)

func TestUnwindRunsInReverseAndJoinsFailures(t *testing.T) {
	var u Undo
	var order []string
	u.Push("a", func() error { order = append(order, "a"); return errors.New("gone") })
	u.Push("b", func() error { order = append(order, "b"); return errors.New("busy") })
	u.Push("c", func() error { order = append(order, "c"); return nil })
	err := u.Unwind()
	if want := []string{"c", "b", "a"}; !slices.Equal(order, want) {
		t.Fatalf("order = %v, want %v", order, want)
	}
	if want := "undo b: busy\nundo a: gone"; err == nil || err.Error() != want {
		t.Fatalf("Unwind = %q, want %q", err, want)
	}
	if err := u.Unwind(); err != nil || len(order) != 3 {
		t.Fatalf("second Unwind ran again: %v %v", err, order)
	}
}

func TestUnwindEmpty(t *testing.T) {
	var u Undo
	if err := u.Unwind(); err != nil {
		t.Fatalf("Unwind of an empty log = %v", err)
	}
}

func TestFailKeepsTheStepErrorFirst(t *testing.T) {
	step := &fs.PathError{Op: "open", Path: "x", Err: fs.ErrNotExist}

	var ok Undo
	ok.Push("a", func() error { return nil })
	if err := ok.Fail(step); err != error(step) {
		t.Fatalf("Fail with undos that succeed = %v, want the step's error itself", err)
	}

	var bad Undo
	bad.Push("rules", func() error { return fs.ErrPermission })
	err := bad.Fail(step)
	if want := "open x: file does not exist\nundo rules: permission denied"; err.Error() != want {
		t.Fatalf("Fail = %q, want %q", err, want)
	}
	if !errors.Is(err, fs.ErrNotExist) || !errors.Is(err, fs.ErrPermission) {
		t.Fatalf("Fail = %v: the step's and the undo's errors must both be found", err)
	}
}

package nsmgr

import (
	"errors"
	"fmt"
)

// undoStack is the undo log of a transaction: every step that changed
// something pushes how to take it back, and unwind runs them in reverse.
type undoStack struct {
	undos []undoEntry
}

type undoEntry struct {
	what string
	fn   func() error
}

func (u *undoStack) push(what string, fn func() error) {
	u.undos = append(u.undos, undoEntry{what, fn})
}

// unwind runs every undo in reverse order, also after one of them failed,
// and returns their errors joined.
func (u *undoStack) unwind() error {
	var errs []error
	for i := len(u.undos) - 1; i >= 0; i-- {
		if err := u.undos[i].fn(); err != nil {
			errs = append(errs, fmt.Errorf("undo %s: %w", u.undos[i].what, err))
		}
	}
	u.undos = nil
	return errors.Join(errs...)
}

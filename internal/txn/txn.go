package txn

import (
	"errors"
	"fmt"
)

// Undo is the undo log of one transaction. The zero value is empty and
// ready to use. It is not safe for concurrent use: one goroutine runs a
// transaction.
type Undo struct {
	steps []step
}

type step struct {
	what string
	fn   func() error
}

// Push records how to take back a step that has been done. what names the
// step's object in the error of a failed undo ("rules", "veth e3h").
func (u *Undo) Push(what string, fn func() error) {
	u.steps = append(u.steps, step{what, fn})
}

// Unwind runs every undo in reverse order, also after one of them failed,
// and empties the log. It returns each failure as "undo <what>: <err>",
// joined (errors.Is and errors.As see every one); nil when all succeeded.
func (u *Undo) Unwind() error {
	var errs []error
	for i := len(u.steps) - 1; i >= 0; i-- {
		if err := u.steps[i].fn(); err != nil {
			errs = append(errs, fmt.Errorf("undo %s: %w", u.steps[i].what, err))
		}
	}
	u.steps = nil
	return errors.Join(errs...)
}

// Fail unwinds the log after err ended the transaction and returns err
// joined with the failed undos: err stays first and findable with
// errors.Is, and the caller learns what the failure left behind.
func (u *Undo) Fail(err error) error {
	if uerr := u.Unwind(); uerr != nil {
		return errors.Join(err, uerr)
	}
	return err
}

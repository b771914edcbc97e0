package nsmgr

import "testing"

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

package observe

import "testing"

// An Outcome, a HoldEnd and a WakeupState have names for every value, and
// a name for a value out of range.
func TestOutcome_String(t *testing.T) {
	want := []string{"acquired", "held", "canceled", "closed", "rolled_back", "broken", "refused", "failed"}
	for o := OutcomeAcquired; o <= OutcomeFailed; o++ {
		if s := o.String(); s != want[o] {
			t.Errorf("Outcome(%d): got %q, want %q", o, s, want[o])
		}
	}
	if s := Outcome(99).String(); s != "unknown" {
		t.Errorf("Outcome(99): got %q, want unknown", s)
	}
	if s := Outcome(-1).String(); s != "unknown" {
		t.Errorf("Outcome(-1): got %q, want unknown", s)
	}
}

func TestHoldEnd_String(t *testing.T) {
	for e, want := range []string{"held", "released", "lost", "lapsed", "closed"} {
		if s := HoldEnd(e).String(); s != want {
			t.Errorf("HoldEnd(%d): got %q, want %q", e, s, want)
		}
	}
	if s := HoldEnd(5).String(); s != "unknown" {
		t.Errorf("HoldEnd(5): got %q, want unknown", s)
	}
}

func TestWakeupState_String(t *testing.T) {
	for st, want := range []string{"granted", "timed_out", "failed", "off"} {
		if s := WakeupState(st).String(); s != want {
			t.Errorf("WakeupState(%d): got %q, want %q", st, s, want)
		}
	}
	if s := WakeupState(4).String(); s != "unknown" {
		t.Errorf("WakeupState(4): got %q, want unknown", s)
	}
}

package sqllocktest

import (
	"fmt"
	"time"
)

// The server's clock: what UTC_TIMESTAMP(6) returns. Leases start, expire and
// are compared by it, never by the Client's clock, as on a real server. It
// runs with the machine's clock, shifted by every Advance; with
// WithFrozenClock it moves only by Advance.

// Now returns the server's clock, in UTC, to the microsecond, as
// UTC_TIMESTAMP(6) would.
func (s *Server) Now() time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return time.UnixMicro(s.nowMicros()).UTC()
}

// Advance moves the server's clock forward by d: a lease whose time left is
// d or less has expired after it. It returns an error, and moves nothing,
// when d is negative: a server's clock that went back would let a lease
// outlive its time.
func (s *Server) Advance(d time.Duration) error {
	if d < 0 {
		return fmt.Errorf("sqllocktest: Advance(%v): the server's clock only moves forward", d)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.offset += d
	s.broadcast()
	return nil
}

// nowMicros is the clock in microseconds since 1970; s.mu is held.
func (s *Server) nowMicros() int64 {
	base := s.frozenAt
	if base.IsZero() {
		base = time.Now()
	}
	return base.Add(s.offset).UnixMicro()
}

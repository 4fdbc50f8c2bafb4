package sqllock

import (
	"sync"
	"time"
)

// Clocks that disagree. On a cluster whose nodes each decide expiry by
// their own clock (Galera, Group Replication multi-primary), a node whose
// clock runs ahead takes other nodes' leases over early, while they are
// live by their holders' reckoning (docs/servers.md, Clocks). Inspect and
// List read, with each lease, how far its acquired_at (written by the
// clock of the node that took it) lies ahead of the reading node's clock:
// a lease's age, negative, unless the writer's clock is ahead by at least
// that much. Past clockSkewWarn the Client warns, at most once a minute.
// It costs nothing beyond the column: the statements are read anyway.

// clockSkewWarn is how far ahead of the reading server's clock a lease's
// acquired_at must lie for the Client to warn: well above what two reads
// of one clock differ by (about 15 ms measured on a loaded machine), and
// below the smallest keep-alive margin worth having.
const clockSkewWarn = 50 * time.Millisecond

// clockSkewEvery bounds how often a Client warns of clocks that disagree.
const clockSkewEvery = time.Minute

// skewWarnings rate-limits a Client's warnings of clock skew.
type skewWarnings struct {
	mu   sync.Mutex
	last time.Time
}

// noteAhead warns, through the Client's logger, when the lease on name was
// acquired ahead µs in this server's future (a NULL ahead, ok false, is a
// released lease).
func (c *Client) noteAhead(name string, ahead int64, ok bool) {
	d := time.Duration(ahead) * time.Microsecond
	if !ok || d <= clockSkewWarn {
		return
	}
	c.skew.mu.Lock()
	due := c.skew.last.IsZero() || time.Since(c.skew.last) >= clockSkewEvery
	if due {
		c.skew.last = time.Now()
	}
	c.skew.mu.Unlock()
	if due {
		c.log.Warn("sqllock: a lease was acquired ahead of this server's clock: the clock of the node that took it is ahead of this node's by at least this much, and that node takes leases over early; keep node clocks far closer than the keep-alive's margin (docs/servers.md, Clocks)",
			"name", name, "ahead", d)
	}
}

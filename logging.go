package sqllock

import (
	"context"
	"errors"
	"log/slog"
)

var discardLogger = slog.New(slog.DiscardHandler)

// logRetry reports a statement that failed in a way that is retried, to
// the logger and the Observer.
func (c *Client) logRetry(ctx context.Context, stmt, name string, err error) {
	c.log.DebugContext(ctx, "sqllock: statement failed; retrying", "name", name, "statement", stmt, "err", err)
	c.retried(stmt, name, err)
}

// logRenewFailed reports a keep-alive renewal that failed without proof
// of loss; the keep-alive tries again.
func (l *Lock) logRenewFailed(failures int, err error) {
	l.c.log.Warn("sqllock: lease renewal failed; retrying", "name", l.name, "fence", l.fence, "failures", failures, "err", err)
}

// logLost reports a lease the keep-alive gave up for lost.
func (l *Lock) logLost(cause error) {
	l.c.log.Error("sqllock: lease lost", "name", l.name, "fence", l.fence, "err", cause)
}

// logClosed reports a lease Close released, or failed to.
func (l *Lock) logClosed(err error) {
	switch {
	case errors.Is(err, ErrNotHeld):
		l.c.log.Warn("sqllock: Close found lease lost already", "name", l.name, "fence", l.fence, "err", err)
		return
	case err != nil:
		l.c.log.Warn("sqllock: Close could not release lease; it expires on its own", "name", l.name, "fence", l.fence, "err", err)
		return
	}
	l.c.log.Info("sqllock: Close released lease", "name", l.name, "fence", l.fence)
}

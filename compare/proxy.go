package main

import (
	"time"

	"github.com/sqllock/sqllock/internal/faultproxy"
)

// newProxy starts a proxy to target that delays every chunk by the same
// time each way, so that a round trip costs what it costs between hosts,
// and counts round trips (faultproxy.Proxy.RoundTrips).
func newProxy(target string, delay time.Duration) (*faultproxy.Proxy, error) {
	p, err := faultproxy.Start(target)
	if err != nil {
		return nil, err
	}
	p.Latency(faultproxy.Both, delay)
	return p, nil
}

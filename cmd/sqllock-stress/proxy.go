package main

import (
	"fmt"
	"net"

	"github.com/sqllock/sqllock/internal/faultproxy"
)

// loopback reports whether addr (host:port) names this machine: a loopback
// IP address, or localhost.
func loopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// newProxy starts a proxy to target, which must be a loopback address: the
// partitions are this machine's alone. Its Stall blackholes a direction:
// nothing sent that way arrives and nothing is refused or reset, as on a
// link that silently drops every packet, and the heal delivers what was
// sent, as TCP's retransmissions would.
func newProxy(target string) (*faultproxy.Proxy, error) {
	if !loopback(target) {
		return nil, fmt.Errorf("proxy: %q is not a loopback address; partitions are made on this machine only", target)
	}
	return faultproxy.Start(target)
}

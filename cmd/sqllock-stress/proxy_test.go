package main

import "testing"

// Nothing off this machine is proxied to.
func TestProxy_loopbackOnly(t *testing.T) {
	for _, addr := range []string{"192.0.2.1:3306", "db.example:3306", "[2001:db8::1]:3306", "nonsense"} {
		if p, err := newProxy(addr); err == nil {
			p.Close()
			t.Errorf("newProxy(%q): got no error, want a refusal", addr)
		}
	}
	for _, addr := range []string{"127.0.0.1:3306", "127.0.0.2:1", "localhost:3306", "[::1]:3306"} {
		if !loopback(addr) {
			t.Errorf("loopback(%q): got false, want true", addr)
		}
	}
}

package main

import (
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
)

// A direction is what a proxy's blackhole holds back: what the clients send
// to the server, what the server sends back, or both.
type direction int

const (
	pass     direction = 0
	toServer direction = 1
	toClient direction = 2
	bothWays           = toServer | toClient
)

func (d direction) String() string {
	switch d {
	case pass:
		return "pass"
	case toServer:
		return "client-to-server"
	case toClient:
		return "server-to-client"
	case bothWays:
		return "both"
	}
	return fmt.Sprintf("direction(%d)", int(d))
}

// A proxy forwards TCP connections from a listener on 127.0.0.1 to a server
// on this machine, and blackholes them on demand: while a direction is cut,
// nothing sent that way arrives and nothing is refused or reset, as on a
// link that silently drops every packet. What was sent arrives after the
// heal, as TCP's retransmissions would deliver it; a connection opened
// during the cut is not carried to the server until the heal (its SYN or
// SYN-ACK would be lost), though the client's connect returns at once.
type proxy struct {
	ln     net.Listener
	target string

	mu     sync.Mutex
	cond   *sync.Cond // broadcast when cut or closed changes
	cut    direction
	closed bool
	conns  map[net.Conn]struct{}
	wg     sync.WaitGroup
}

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
// partitions are this machine's alone.
func newProxy(target string) (*proxy, error) {
	if !loopback(target) {
		return nil, fmt.Errorf("proxy: %q is not a loopback address; partitions are made on this machine only", target)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &proxy{ln: ln, target: target, conns: map[net.Conn]struct{}{}}
	p.cond = sync.NewCond(&p.mu)
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// addr is the address clients dial instead of the target.
func (p *proxy) addr() string { return p.ln.Addr().String() }

// set cuts the directions in d and heals the others (pass heals all).
func (p *proxy) set(d direction) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cut = d & bothWays
	p.cond.Broadcast()
}

// wait returns once nothing cuts direction d, or false when the proxy has
// been closed.
func (p *proxy) wait(d direction) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	for p.cut&d != 0 && !p.closed {
		p.cond.Wait()
	}
	return !p.closed
}

// close stops accepting, closes every connection and waits for the
// proxy's goroutines.
func (p *proxy) close() {
	p.mu.Lock()
	p.closed = true
	for c := range p.conns {
		c.Close()
	}
	p.cond.Broadcast()
	p.mu.Unlock()
	p.ln.Close()
	p.wg.Wait()
}

// track registers c to be closed with the proxy; false if it is closed.
func (p *proxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		c.Close()
		return false
	}
	p.conns[c] = struct{}{}
	return true
}

func (p *proxy) untrack(c net.Conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.conns, c)
	c.Close()
}

func (p *proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		if !p.track(c) {
			return
		}
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			defer p.untrack(c)
			// The handshake needs both ways: a connection made during a cut
			// reaches the server after the heal.
			if !p.wait(bothWays) {
				return
			}
			s, err := net.Dial("tcp", p.target)
			if err != nil {
				return // the client sees its connection close, as on a refused connect
			}
			if !p.track(s) {
				return
			}
			defer p.untrack(s)
			var wg sync.WaitGroup
			wg.Add(2)
			go func() { defer wg.Done(); p.pump(s, c, toServer) }()
			go func() { defer wg.Done(); p.pump(c, s, toClient) }()
			wg.Wait()
		}()
	}
}

// pump copies from src to dst what flows in direction d, holding each
// chunk it has read, and the end of the stream, while d is cut. When one
// side fails, both connections close.
func (p *proxy) pump(dst, src net.Conn, d direction) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if !p.wait(d) {
			return
		}
		if n > 0 {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				src.Close()
				return
			}
		}
		if err != nil {
			// The end of the stream passes on, half-closed, as a FIN would.
			if cw, ok := dst.(interface{ CloseWrite() error }); ok && errors.Is(err, io.EOF) {
				_ = cw.CloseWrite()
				return
			}
			dst.Close()
			return
		}
	}
}

package main

import (
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// A proxy forwards TCP connections on loopback to one server, delaying
// every chunk by the same time each way (so that a round trip costs what it
// costs between hosts) and counting round trips: a burst of bytes from the
// client that follows a reply from the server (or opens the connection) is
// one. That counts what the client waits for, whatever the protocol: a
// statement sent with its arguments after a separate prepare is two, a
// pipelined burst is one, and a statement with no reply (MySQL's
// COM_STMT_CLOSE) joins the next.
type proxy struct {
	ln     net.Listener
	target string
	delay  time.Duration
	trips  atomic.Int64

	mu    sync.Mutex
	conns map[net.Conn]struct{}
	wg    sync.WaitGroup
}

func newProxy(target string, delay time.Duration) (*proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &proxy{ln: ln, target: target, delay: delay, conns: make(map[net.Conn]struct{})}
	p.wg.Add(1)
	go p.serve()
	return p, nil
}

// addr is the address to dial instead of the target.
func (p *proxy) addr() string { return p.ln.Addr().String() }

// roundTrips is the count so far, over every connection.
func (p *proxy) roundTrips() int64 { return p.trips.Load() }

func (p *proxy) close() {
	p.ln.Close()
	p.mu.Lock()
	for c := range p.conns {
		c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
}

func (p *proxy) track(c net.Conn, add bool) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !add {
		delete(p.conns, c)
		return true
	}
	if p.conns == nil {
		return false
	}
	p.conns[c] = struct{}{}
	return true
}

func (p *proxy) serve() {
	defer p.wg.Done()
	for {
		client, err := p.ln.Accept()
		if err != nil {
			p.mu.Lock()
			p.conns = nil // closed: refuse to track more
			p.mu.Unlock()
			return
		}
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			p.handle(client)
		}()
	}
}

func (p *proxy) handle(client net.Conn) {
	defer client.Close()
	server, err := net.Dial("tcp", p.target)
	if err != nil {
		return
	}
	defer server.Close()
	if !p.track(client, true) || !p.track(server, true) {
		return
	}
	defer p.track(client, false)
	defer p.track(server, false)
	setNoDelay(client)
	setNoDelay(server)

	// serverSpoke is set when a chunk from the server is read, before it is
	// passed on, so the client's next request (which can only follow it)
	// always finds it set.
	var serverSpoke atomic.Bool
	serverSpoke.Store(true)
	done := make(chan struct{}, 2)
	go func() {
		p.pipe(server, client, func() {
			if serverSpoke.Swap(false) {
				p.trips.Add(1)
			}
		})
		done <- struct{}{}
	}()
	go func() {
		p.pipe(client, server, func() { serverSpoke.Store(true) })
		done <- struct{}{}
	}()
	<-done
	client.Close()
	server.Close()
	<-done
}

func setNoDelay(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		tc.SetNoDelay(true)
	}
}

type chunk struct {
	buf *[]byte
	n   int
	due time.Time
}

// buffers keeps the delayed chunks' buffers, so that the proxy, which runs
// in the measuring process, adds no allocations to what is measured.
var buffers = sync.Pool{New: func() any { b := make([]byte, 64<<10); return &b }}

// pipe copies from src to dst, calling seen for each chunk read before it
// is written, and holding each chunk back until delay after it was read.
func (p *proxy) pipe(dst, src net.Conn, seen func()) {
	if p.delay <= 0 {
		buf := buffers.Get().(*[]byte)
		defer buffers.Put(buf)
		for {
			n, err := src.Read(*buf)
			if n > 0 {
				seen()
				if _, werr := dst.Write((*buf)[:n]); werr != nil {
					return
				}
			}
			if err != nil {
				return
			}
		}
	}
	ch := make(chan chunk, 4096)
	go func() {
		defer close(ch)
		for {
			buf := buffers.Get().(*[]byte)
			n, err := src.Read(*buf)
			if n > 0 {
				seen()
				ch <- chunk{buf, n, time.Now().Add(p.delay)}
			} else {
				buffers.Put(buf)
			}
			if err != nil {
				return
			}
		}
	}()
	for c := range ch {
		sleepUntil(c.due)
		_, err := dst.Write((*c.buf)[:c.n])
		buffers.Put(c.buf)
		if err != nil {
			src.Close() // ends the reader
			for c := range ch {
				buffers.Put(c.buf)
			}
			return
		}
	}
}

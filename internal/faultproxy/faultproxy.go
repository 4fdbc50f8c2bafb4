// Package faultproxy is a TCP proxy for tests and measurements that puts
// network faults between MySQL clients and a server: it holds bytes as a
// partition would, delays them, refuses or resets connections, cuts a
// connection right after a chosen command has reached the server, and
// counts the commands and round trips it carries.
//
// It reads the client's stream in clear, so clients that want commands
// counted or cut must use neither TLS nor the compressed protocol; the other
// faults work on any TCP stream. It imports only the standard library, so
// the root's tests, cmd/sqllock-stress and compare share it.
package faultproxy

import (
	"context"
	"errors"
	"io"
	"maps"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// Command codes of the MySQL client/server protocol that tests name.
const (
	ComQuery       = 0x03
	ComPing        = 0x0e
	ComStmtPrepare = 0x16
	ComStmtExecute = 0x17
)

// maxPacketLen is the payload length of a packet whose payload continues in
// the next packet.
const maxPacketLen = 0xFFFFFF

// A Direction is which way bytes flow: to the server, to the client, or
// both.
type Direction uint8

const (
	ToServer Direction = 1 << iota
	ToClient
	Both = ToServer | ToClient
)

// index is d's slot in per-direction arrays; d is ToServer or ToClient.
func (d Direction) index() int {
	if d == ToServer {
		return 0
	}
	return 1
}

// closeWait is how long Close waits for the proxy's goroutines.
const closeWait = 10 * time.Second

// A Proxy forwards every TCP connection it accepts on 127.0.0.1 to one
// target. Its methods are safe for concurrent use and take effect on live
// connections. Close stops it; the zero value is not usable, call Start.
type Proxy struct {
	ln     net.Listener
	target string
	ctx    context.Context // ends at Close, so that dials in progress give up
	cancel context.CancelFunc
	wg     sync.WaitGroup // every goroutine the proxy started
	trips  atomic.Int64

	mu      sync.Mutex
	closed  bool
	conns   map[*conn]struct{}
	counts  map[byte]int
	flowing [2]chan struct{} // per direction: closed unless stalled
	stalled Direction
	latency [2]time.Duration
	refuse  bool
	// cuts counts CutAll calls: a connection accepted before one and
	// still dialing the server when it came is cut as it registers.
	cuts    int
	cutCode byte
	cutLeft int // commands with cutCode to forward until a cut; 0 for none
	// cutRefuses: the cut also makes the proxy refuse new connections
	// (Refuse(true)), from the moment it fires.
	cutRefuses bool
	// cutReplied is closed once the armed cut's command has been answered
	// by the server, or its server connection has ended (CutReplied).
	cutReplied     chan struct{}
	cutRepliedOnce *sync.Once
}

// A conn is one client connection and the server connection it was given.
type conn struct {
	client, server net.Conn
	done           chan struct{} // closed by close, to wake pumps that wait
	once           sync.Once
	// cut is set once CutAfterCommand chose this connection: the client is
	// gone and what the server sends is dropped.
	cut atomic.Bool
	// replied, set with cut, closes the proxy's CutReplied channel.
	replied func()
	// serverSpoke is set when a chunk from the server is read, so that the
	// client's next chunk, which can only follow it, counts a round trip.
	serverSpoke atomic.Bool
}

// Start starts a proxy on 127.0.0.1 that forwards every connection to
// target (host:port). The caller must Close it.
func Start(target string) (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	p := &Proxy{
		ln:     ln,
		target: target,
		ctx:    ctx,
		cancel: cancel,
		conns:  make(map[*conn]struct{}),
		counts: make(map[byte]int),
	}
	for i := range p.flowing {
		p.flowing[i] = make(chan struct{})
		close(p.flowing[i])
	}
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// Addr returns the address clients should dial, as host:port.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Close stops the proxy: the listener and every connection are closed, and
// its goroutines have ended when Close returns. It returns an error if they
// are still running 10 s later.
func (p *Proxy) Close() error {
	p.cancel()
	p.ln.Close()
	p.mu.Lock()
	p.closed = true
	for c := range p.conns {
		c.close(true)
	}
	p.mu.Unlock()
	done := make(chan struct{})
	go func() { p.wg.Wait(); close(done) }()
	select {
	case <-done:
		return nil
	case <-time.After(closeWait):
		return errors.New("faultproxy: goroutines still running 10s after Close")
	}
}

// Commands returns how many commands of each code clients have sent since
// the start or the last ResetCounts. A command counts when the proxy
// receives it, even if a stall still holds it.
func (p *Proxy) Commands() map[byte]int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return maps.Clone(p.counts)
}

// CommandCount returns how many commands of any code clients have sent
// since the start or the last ResetCounts.
func (p *Proxy) CommandCount() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for _, c := range p.counts {
		n += c
	}
	return n
}

// ResetCounts sets every command count back to zero.
func (p *Proxy) ResetCounts() {
	p.mu.Lock()
	defer p.mu.Unlock()
	clear(p.counts)
}

// RoundTrips returns how many round trips clients have made, over every
// connection: a burst of bytes from a client that opens its connection or
// follows a reply from the server is one. That counts what the client waits
// for, whatever the protocol: a statement sent after a separate prepare is
// two, a pipelined burst is one, and a command with no reply (MySQL's
// COM_STMT_CLOSE) joins the next.
func (p *Proxy) RoundTrips() int64 { return p.trips.Load() }

// Stall holds the bytes that flow in the directions in d, and heals the
// others (Stall(0) heals all), like a partition that silently drops
// packets: nothing is refused or reset. While any direction is held, a new
// connection is accepted but not carried to the server. When a direction
// heals, the held bytes, and the end of a stream, flow on in order, as TCP's
// retransmissions would deliver them: a statement whose client gave up
// meanwhile still reaches the server.
func (p *Proxy) Stall(d Direction) {
	p.mu.Lock()
	defer p.mu.Unlock()
	d &= Both
	for _, dir := range []Direction{ToServer, ToClient} {
		was, now := p.stalled&dir != 0, d&dir != 0
		switch {
		case now && !was:
			p.flowing[dir.index()] = make(chan struct{})
		case was && !now:
			close(p.flowing[dir.index()])
		}
	}
	p.stalled = d
}

// Latency delays each chunk that flows in the directions in d by delay,
// counted from when the proxy read it, so that chunks in flight overlap as
// on a long link; 0 ends the delay. The other directions keep theirs.
func (p *Proxy) Latency(d Direction, delay time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, dir := range []Direction{ToServer, ToClient} {
		if d&dir != 0 {
			p.latency[dir.index()] = delay
		}
	}
}

// Refuse makes the proxy reset each new connection as soon as it accepts it,
// while on is true. Live connections are left alone.
func (p *Proxy) Refuse(on bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.refuse = on
}

// CutAll resets every live connection now, on both sides, and every
// connection accepted but still waiting for the server. Later connections
// are served as usual.
func (p *Proxy) CutAll() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cuts++
	for c := range p.conns {
		c.close(true)
	}
}

// CutAfterCommand makes the n-th next command with the given code, on
// whichever connection, an unknown outcome: once the proxy has forwarded it
// to the server it resets the client, drops the server's reply, and closes
// the server connection when that reply arrives (so the server has run the
// statement to the end). A reply that never comes leaves the server
// connection open until CutAll or Close. It fires once; n < 1 disarms it.
func (p *Proxy) CutAfterCommand(code byte, n int) {
	p.arm(code, n, false)
}

// CutAfterCommandThenRefuse is CutAfterCommand whose cut also makes the
// proxy refuse every new connection, as Refuse(true), until Refuse(false):
// the statement's resends and cleanup find no way back, on whichever
// connection it ran, an idle one of the pool or a new one.
func (p *Proxy) CutAfterCommandThenRefuse(code byte, n int) {
	p.arm(code, n, true)
}

func (p *Proxy) arm(code byte, n int, refuses bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cutCode, p.cutLeft, p.cutRefuses = code, max(n, 0), refuses
	p.cutReplied, p.cutRepliedOnce = make(chan struct{}), new(sync.Once)
}

// CutReplied returns a channel that is closed once the command the last
// armed cut fired on has been answered by the server, which has then run
// it to the end, or its server connection has ended. What the server wrote
// is settled from then on: a test can read it without racing the
// statement. It returns nil when no cut was armed.
func (p *Proxy) CutReplied() <-chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.cutReplied
}

// accept serves connections until the listener is closed.
func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		refuse := p.refuse || p.closed
		cuts := p.cuts
		p.mu.Unlock()
		if refuse {
			resetConn(c)
			continue
		}
		p.wg.Add(1)
		go p.serve(c, cuts)
	}
}

// serve connects client to the target, once no direction is stalled, and
// forwards both ways until both are done. cuts is the CutAll count when the
// client was accepted: a CutAll while the server was being dialed cuts the
// connection too, since it was live for the client.
func (p *Proxy) serve(client net.Conn, cuts int) {
	defer p.wg.Done()
	// The handshake needs both ways: a connection made during a stall
	// reaches the server after the heal.
	for _, dir := range []Direction{ToServer, ToClient} {
		select {
		case <-p.flowingCh(dir):
		case <-p.ctx.Done():
			resetConn(client)
			return
		}
	}
	var d net.Dialer
	server, err := d.DialContext(p.ctx, "tcp", p.target)
	if err != nil {
		resetConn(client)
		return
	}
	c := &conn{client: client, server: server, done: make(chan struct{})}
	c.serverSpoke.Store(true)
	p.mu.Lock()
	if p.closed || p.cuts != cuts {
		// Close or CutAll has already closed the connections it knew of.
		p.mu.Unlock()
		c.close(true)
		return
	}
	p.conns[c] = struct{}{}
	p.mu.Unlock()

	up := make(chan struct{})
	go func() {
		defer close(up)
		p.pump(c, ToServer)
	}()
	p.pump(c, ToClient)
	<-up
	c.close(false)
	p.mu.Lock()
	delete(p.conns, c)
	p.mu.Unlock()
}

func (p *Proxy) flowingCh(d Direction) chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.flowing[d.index()]
}

// A chunk is what a pump read, with when it may leave.
type chunk struct {
	buf *[]byte
	n   int
	due time.Time
	cut bool  // the cut command ends with this chunk
	err error // the read's error, on the last chunk
}

// buffers keeps chunks' buffers, so that the proxy, which may run in a
// process that measures its allocations, adds none once warm.
var buffers = sync.Pool{New: func() any { b := make([]byte, 32<<10); return &b }}

// pump forwards the bytes that flow in direction d. It reads, counts and
// stamps each chunk and, while no latency holds chunks back, writes it
// itself, as soon as no stall holds it; a delayed chunk, and every chunk
// after it until the queue is empty, goes through a writer goroutine, so
// that delayed chunks in flight overlap.
func (p *Proxy) pump(c *conn, d Direction) {
	ch := make(chan chunk, 256)
	var queued atomic.Int32 // chunks sent to the writer and not yet written
	written := make(chan struct{})
	go func() {
		defer close(written)
		on := true
		for k := range ch {
			if on {
				on = p.deliver(c, d, k)
			} else {
				putChunk(k)
			}
			queued.Add(-1)
		}
	}()
	emit := func(k chunk) bool {
		if k.due.IsZero() && queued.Load() == 0 {
			return p.deliver(c, d, k)
		}
		queued.Add(1)
		select {
		case ch <- k:
			return true
		case <-c.done:
			queued.Add(-1)
			putChunk(k)
			return false
		}
	}
	if d == ToServer {
		p.readClient(c, emit)
	} else {
		p.readServer(c, emit)
	}
	close(ch)
	<-written
}

// deliver writes k to its destination once neither a stall nor its due time
// holds it, and frees it. It reports false when the direction is done: the
// stream ended, the cut command has gone, or the connection is closed.
func (p *Proxy) deliver(c *conn, d Direction, k chunk) bool {
	defer putChunk(k)
	if !p.hold(c, d) || !sleepUntil(k.due, c.done) {
		return false
	}
	dst := c.server
	if d == ToClient {
		dst = c.client
	}
	if k.cut {
		// Before the last byte leaves: the reply must find it set.
		c.cut.Store(true)
	}
	if k.n > 0 {
		_, err := dst.Write((*k.buf)[:k.n])
		// After a cut the client is gone, but the reply is still to come:
		// keep reading until it does.
		if err != nil && !(d == ToClient && c.cut.Load()) {
			c.close(true)
			return false
		}
	}
	if k.cut {
		// The server side stays open until the reply arrives, so that the
		// server is not torn down while it runs the statement; the
		// server's pump closes it.
		resetConn(c.client)
		return false
	}
	if k.err != nil {
		// The end of the stream passes on, half-closed, as a FIN would.
		if cw, ok := dst.(interface{ CloseWrite() error }); ok && errors.Is(k.err, io.EOF) {
			_ = cw.CloseWrite()
			return false
		}
		c.close(false)
		return false
	}
	return true
}

func putChunk(k chunk) {
	if k.buf != nil {
		buffers.Put(k.buf)
	}
}

// readClient reads what the client sends, counting its commands and round
// trips, until the stream ends, a cut command has been read whole, or emit
// reports the direction done.
func (p *Proxy) readClient(c *conn, emit func(chunk) bool) {
	sc := packetScanner{onCommand: func(code byte) bool { return p.command(c, code) }}
	for {
		buf := buffers.Get().(*[]byte)
		n, err := c.client.Read(*buf)
		if n > 0 && c.serverSpoke.Swap(false) {
			p.trips.Add(1)
		}
		k, cut := sc.scan((*buf)[:n])
		if cut {
			emit(chunk{buf: buf, n: k, due: p.due(ToServer), cut: true})
			return // the rest of the stream is dropped
		}
		if !emit(chunk{buf: buf, n: n, due: p.due(ToServer), err: err}) || err != nil {
			return
		}
	}
}

// readServer reads what the server sends until the stream ends, emit
// reports the direction done, or the reply to a cut command arrives: then
// the server has run it, the client must not learn how it went, and the
// connection closes.
func (p *Proxy) readServer(c *conn, emit func(chunk) bool) {
	defer func() {
		// However it ends, a cut connection's command is settled: the
		// server answered it, or the connection to the server is gone.
		if c.cut.Load() {
			c.replied()
		}
	}()
	for {
		buf := buffers.Get().(*[]byte)
		n, err := c.server.Read(*buf)
		if n > 0 && c.cut.Load() {
			buffers.Put(buf)
			c.close(true)
			return
		}
		if n > 0 {
			c.serverSpoke.Store(true)
		}
		if !emit(chunk{buf: buf, n: n, due: p.due(ToClient), err: err}) || err != nil {
			return
		}
	}
}

// due is when a chunk read now in direction d may leave.
func (p *Proxy) due(d Direction) time.Time {
	p.mu.Lock()
	l := p.latency[d.index()]
	p.mu.Unlock()
	if l <= 0 {
		return time.Time{}
	}
	return time.Now().Add(l)
}

// command counts a command of c's and reports whether it is the one
// CutAfterCommand waits for.
func (p *Proxy) command(c *conn, code byte) (cut bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.counts[code]++
	if p.cutLeft > 0 && code == p.cutCode {
		p.cutLeft--
		if p.cutLeft > 0 {
			return false
		}
		if p.cutRefuses {
			p.refuse = true
		}
		ch, once := p.cutReplied, p.cutRepliedOnce
		c.replied = func() { once.Do(func() { close(ch) }) }
		return true
	}
	return false
}

// hold waits while direction d is stalled. It reports false if c was closed
// meanwhile.
func (p *Proxy) hold(c *conn, d Direction) bool {
	select {
	case <-p.flowingCh(d):
		return true
	case <-c.done:
		return false
	}
}

// close closes both sides of c, once; abrupt makes them reset rather than
// end cleanly, as when a network fails.
func (c *conn) close(abrupt bool) {
	c.once.Do(func() {
		close(c.done)
		if abrupt {
			resetConn(c.client)
			resetConn(c.server)
			return
		}
		c.client.Close()
		c.server.Close()
	})
}

// resetConn closes c with a TCP reset instead of a clean end.
func resetConn(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		tc.SetLinger(0)
	}
	c.Close()
}

// A packetScanner follows the MySQL packets of a client's stream, split
// anywhere by TCP, and reports each command to onCommand. A command is a
// packet with sequence id 0 that does not continue a 0xFFFFFF-long one; the
// handshake response and auth packets have other ids.
type packetScanner struct {
	onCommand func(code byte) (cut bool)

	hdr     [4]byte // 3-byte little-endian length, then sequence id
	nhdr    int     // header bytes of the current packet seen so far
	left    int     // payload bytes of the current packet still to come
	more    bool    // the current packet's payload goes on in the next one
	first   bool    // the next payload byte is a command code
	cutting bool    // onCommand asked to cut after the current command
}

// scan reads b and returns how much of it to forward: all of it, unless the
// command onCommand asked to cut ends inside b, in which case k is where it
// ends and cut is true. The caller drops the rest of the stream after a cut.
func (s *packetScanner) scan(b []byte) (k int, cut bool) {
	for i := 0; i < len(b); {
		if s.nhdr < len(s.hdr) {
			c := copy(s.hdr[s.nhdr:], b[i:])
			s.nhdr += c
			i += c
			if s.nhdr < len(s.hdr) {
				break
			}
			length := int(s.hdr[0]) | int(s.hdr[1])<<8 | int(s.hdr[2])<<16
			continues := s.more
			s.more = length == maxPacketLen
			s.left = length
			s.first = s.hdr[3] == 0 && !continues && length > 0
		} else {
			if s.first {
				s.first = false
				s.cutting = s.onCommand(b[i])
			}
			c := min(s.left, len(b)-i)
			s.left -= c
			i += c
		}
		if s.nhdr == len(s.hdr) && s.left == 0 {
			s.nhdr = 0 // the packet has ended
			if s.cutting && !s.more {
				s.cutting = false
				return i, true
			}
		}
	}
	return len(b), false
}

package sqllock

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"log"
	"maps"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
)

// Command codes of the MySQL client/server protocol that the tests name.
const (
	proxyComQuery       = 0x03
	proxyComPing        = 0x0e
	proxyComStmtPrepare = 0x16
	proxyComStmtExecute = 0x17
)

// proxyMaxPacketLen is the payload length of a packet whose payload
// continues in the next packet.
const proxyMaxPacketLen = 0xFFFFFF

// A proxy is a TCP proxy between MySQL clients and one server, for tests. It
// counts the commands clients send and injects faults: stalls, cuts, latency
// and refused connections. It reads the client's stream in clear, so clients
// must use neither TLS nor the compressed protocol. Its methods are safe for
// concurrent use and take effect on live connections.
type proxy struct {
	ln     net.Listener
	target string
	ctx    context.Context // ends at cleanup, so that dials in progress give up
	wg     sync.WaitGroup  // every goroutine the proxy started

	mu      sync.Mutex
	closed  bool
	conns   map[*proxyConn]struct{}
	counts  map[byte]int
	flowing chan struct{} // closed unless stalled; pumps wait on it
	stalled bool
	refuse  bool
	// cuts counts CutAll calls: a connection accepted before one and
	// still dialing the server when it came is cut as it registers.
	cuts    int
	latency time.Duration
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

// A proxyConn is one client connection and the server connection it was
// given.
type proxyConn struct {
	client, server net.Conn
	done           chan struct{} // closed by close, to wake pumps that wait
	once           sync.Once
	// cut is set once CutAfterCommand chose this connection: the client is
	// gone and what the server sends is dropped.
	cut atomic.Bool
	// replied, set with cut, closes the proxy's CutReplied channel.
	replied func()
}

// startProxy starts a proxy on 127.0.0.1 that forwards every connection to
// target (host:port). It stops in t.Cleanup: the listener and every
// connection are closed and its goroutines have ended when Cleanup returns.
func startProxy(t testing.TB, target string) *proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("proxy: listen: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	flowing := make(chan struct{})
	close(flowing)
	p := &proxy{
		ln:      ln,
		target:  target,
		ctx:     ctx,
		conns:   make(map[*proxyConn]struct{}),
		counts:  make(map[byte]int),
		flowing: flowing,
	}
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(func() {
		cancel()
		ln.Close()
		p.mu.Lock()
		p.closed = true
		for pc := range p.conns {
			pc.close(true)
		}
		p.mu.Unlock()
		done := make(chan struct{})
		go func() { p.wg.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Errorf("proxy: goroutines still running 10s after cleanup")
		}
	})
	return p
}

// Addr returns the address clients should dial, as host:port.
func (p *proxy) Addr() string { return p.ln.Addr().String() }

// Commands returns how many commands of each code clients have sent since
// the start or the last ResetCounts. A command counts when the proxy
// receives it, even if a stall still holds it.
func (p *proxy) Commands() map[byte]int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return maps.Clone(p.counts)
}

// CommandCount returns how many commands of any code clients have sent
// since the start or the last ResetCounts.
func (p *proxy) CommandCount() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for _, c := range p.counts {
		n += c
	}
	return n
}

// ResetCounts sets every command count back to zero.
func (p *proxy) ResetCounts() {
	p.mu.Lock()
	defer p.mu.Unlock()
	clear(p.counts)
}

// Stall holds the bytes of every connection, both ways, while on is true,
// like a network partition; new connections are accepted but get nothing.
// When it ends the held bytes flow on in order, as after a partition heals:
// a statement whose client gave up meanwhile still reaches the server.
func (p *proxy) Stall(on bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if on == p.stalled {
		return
	}
	p.stalled = on
	if on {
		p.flowing = make(chan struct{})
	} else {
		close(p.flowing)
	}
}

// CutAll resets every live connection now, on both sides. Later connections
// are served as usual.
func (p *proxy) CutAll() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cuts++
	for pc := range p.conns {
		pc.close(true)
	}
}

// CutAfterCommand makes the n-th next command with the given code, on
// whichever connection, an unknown outcome: once the proxy has forwarded it
// to the server it resets the client, drops the server's reply, and closes
// the server connection when that reply arrives (so the server has run the
// statement to the end). A reply that never comes leaves the server
// connection open until CutAll or cleanup. It fires once; n < 1 disarms it.
func (p *proxy) CutAfterCommand(code byte, n int) {
	p.arm(code, n, false)
}

// CutAfterCommandThenRefuse is CutAfterCommand whose cut also makes the
// proxy refuse every new connection, as Refuse(true), until Refuse(false):
// the statement's resends and cleanup find no way back, on whichever
// connection it ran, an idle one of the pool or a new one.
func (p *proxy) CutAfterCommandThenRefuse(code byte, n int) {
	p.arm(code, n, true)
}

func (p *proxy) arm(code byte, n int, refuses bool) {
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
func (p *proxy) CutReplied() <-chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.cutReplied
}

// Latency delays each chunk the server sends by d before the proxy forwards
// it to the client; 0 ends the delay.
func (p *proxy) Latency(d time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.latency = d
}

// Refuse makes the proxy reset each new connection as soon as it accepts it,
// while on is true. Live connections are left alone.
func (p *proxy) Refuse(on bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.refuse = on
}

// accept serves connections until the listener is closed.
func (p *proxy) accept() {
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

// serve connects client to the target and forwards both ways until either
// side is done. cuts is the CutAll count when the client was accepted: a
// CutAll while the server was being dialed cuts the connection too, since
// it was live for the client.
func (p *proxy) serve(client net.Conn, cuts int) {
	defer p.wg.Done()
	var d net.Dialer
	server, err := d.DialContext(p.ctx, "tcp", p.target)
	if err != nil {
		resetConn(client)
		return
	}
	pc := &proxyConn{client: client, server: server, done: make(chan struct{})}
	p.mu.Lock()
	if p.closed || p.cuts != cuts {
		// Cleanup or CutAll has already closed the connections it knew of.
		p.mu.Unlock()
		pc.close(true)
		return
	}
	p.conns[pc] = struct{}{}
	p.mu.Unlock()

	up := make(chan struct{})
	go func() {
		defer close(up)
		p.upstream(pc)
	}()
	p.downstream(pc)
	<-up
	pc.close(false)
	p.mu.Lock()
	delete(p.conns, pc)
	p.mu.Unlock()
}

// upstream forwards from client to server, counting commands on the way.
func (p *proxy) upstream(pc *proxyConn) {
	sc := packetScanner{onCommand: func(code byte) bool { return p.command(pc, code) }}
	buf := make([]byte, 32<<10)
	for {
		n, err := pc.client.Read(buf)
		chunk := buf[:n]
		for len(chunk) > 0 {
			k, cut := sc.scan(chunk)
			if !p.hold(pc) {
				return
			}
			if cut {
				// Before the last byte leaves: the reply must find it set.
				pc.cut.Store(true)
			}
			if _, err := pc.server.Write(chunk[:k]); err != nil {
				pc.close(true)
				return
			}
			if cut {
				// The server side stays open until the reply arrives, so
				// that the server is not torn down while it runs the
				// statement; downstream closes it.
				resetConn(pc.client)
				return
			}
			chunk = chunk[k:]
		}
		if err != nil {
			pc.close(false)
			return
		}
	}
}

// downstream forwards from server to client.
func (p *proxy) downstream(pc *proxyConn) {
	defer func() {
		// However it ends, a cut connection's command is settled: the
		// server answered it, or the connection to the server is gone.
		if pc.cut.Load() {
			pc.replied()
		}
	}()
	buf := make([]byte, 32<<10)
	for {
		n, err := pc.server.Read(buf)
		if n > 0 && pc.cut.Load() {
			// The reply to the cut command: the server has run it, and the
			// client must not learn how it went.
			pc.close(true)
			return
		}
		if n > 0 {
			if !p.delay(pc) || !p.hold(pc) {
				return
			}
			// After a cut the client is gone, but the reply is still to
			// come: keep reading until it does.
			if _, err := pc.client.Write(buf[:n]); err != nil && !pc.cut.Load() {
				pc.close(true)
				return
			}
		}
		if err != nil {
			pc.close(false)
			return
		}
	}
}

// command counts a command of pc's and reports whether it is the one
// CutAfterCommand waits for.
func (p *proxy) command(pc *proxyConn, code byte) (cut bool) {
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
		pc.replied = func() { once.Do(func() { close(ch) }) }
		return true
	}
	return false
}

// hold waits while the proxy is stalled. It reports false if pc was closed
// meanwhile.
func (p *proxy) hold(pc *proxyConn) bool {
	p.mu.Lock()
	flowing := p.flowing
	p.mu.Unlock()
	select {
	case <-flowing:
		return true
	case <-pc.done:
		return false
	}
}

// delay waits for the latency set by Latency. It reports false if pc was
// closed meanwhile.
func (p *proxy) delay(pc *proxyConn) bool {
	p.mu.Lock()
	d := p.latency
	p.mu.Unlock()
	if d <= 0 {
		return true
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-pc.done:
		return false
	}
}

// close closes both sides of pc, once; abrupt makes them reset rather than
// end cleanly, as when a network fails.
func (pc *proxyConn) close(abrupt bool) {
	pc.once.Do(func() {
		close(pc.done)
		if abrupt {
			resetConn(pc.client)
			resetConn(pc.server)
			return
		}
		pc.client.Close()
		pc.server.Close()
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
			s.more = length == proxyMaxPacketLen
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

// eachProxyConfig runs f on each test server, with the driver configuration
// of its DSN.
func eachProxyConfig(t *testing.T, f func(t *testing.T, cfg *mysql.Config)) {
	t.Helper()
	eachServer(t, func(t *testing.T, s testServer) {
		if s.Vitess {
			t.Skipf("%s is %s: %s", s.Label, s.Version, vitessNoProxy)
		}
		cfg, err := mysql.ParseDSN(s.DSN)
		if err != nil {
			t.Fatalf("%s: %v", dsnEnv, err)
		}
		if cfg.Net != "tcp" {
			t.Skipf("%s is reached over %q; the proxy needs tcp", s.Label, cfg.Net)
		}
		// Connection faults make the driver log; the tests check errors instead.
		cfg.Logger = log.New(io.Discard, "", 0)
		f(t, cfg)
	})
}

// openProxyTestDB opens a pool of at most one connection with cfg, closed in
// t.Cleanup. With addr set, it dials addr in clear instead of cfg.Addr.
func openProxyTestDB(t *testing.T, cfg *mysql.Config, addr string) *sql.DB {
	t.Helper()
	cfg = cfg.Clone()
	if addr != "" {
		cfg.Addr = addr
		// The proxy reads commands in the stream, so it must be plain.
		cfg.TLS, cfg.TLSConfig = nil, "false"
		if err := cfg.Apply(mysql.EnableCompression(false)); err != nil {
			t.Fatal(err)
		}
	}
	connector, err := mysql.NewConnector(cfg)
	if err != nil {
		t.Fatal(err)
	}
	db := sql.OpenDB(connector)
	db.SetMaxOpenConns(1)
	t.Cleanup(func() { db.Close() })
	return db
}

func TestProxy_scanner(t *testing.T) {
	packet := func(seq byte, payload []byte) []byte {
		n := len(payload)
		return append([]byte{byte(n), byte(n >> 8), byte(n >> 16), seq}, payload...)
	}
	big := bytes.Repeat([]byte{'x'}, proxyMaxPacketLen)
	big[0] = proxyComQuery
	var stream []byte
	stream = append(stream, packet(1, []byte{proxyComQuery, 1, 2})...) // handshake response
	stream = append(stream, packet(3, []byte{proxyComPing})...)        // auth switch response
	stream = append(stream, packet(0, []byte{proxyComPing})...)
	bigFrom := len(stream) + 16
	stream = append(stream, packet(0, big)...)
	bigTo := len(stream) - 16
	stream = append(stream, packet(1, []byte{0, 1})...) // continues big
	cutAt := len(stream)
	stream = append(stream, packet(0, []byte{proxyComStmtPrepare, 'x'})...)
	stream = append(stream, packet(0, []byte{proxyComQuery})...)

	// chunks splits stream as TCP might, every size bytes, except that the
	// middle of the big payload goes whole, which keeps the test fast.
	chunks := func(size int) [][]byte {
		var cs [][]byte
		for i := 0; i < len(stream); {
			n := min(size, len(stream)-i)
			if i >= bigFrom && i < bigTo {
				n = bigTo - i
			}
			cs = append(cs, stream[i:i+n])
			i += n
		}
		return cs
	}

	for _, size := range []int{1, 2, 3, 4, 5, 6, 7, 4099, len(stream)} {
		counts := map[byte]int{}
		sc := packetScanner{onCommand: func(code byte) bool {
			counts[code]++
			return false
		}}
		for _, c := range chunks(size) {
			if k, cut := sc.scan(c); k != len(c) || cut {
				t.Fatalf("size %d: scan = %d, %t; want %d, false", size, k, cut, len(c))
			}
		}
		want := map[byte]int{proxyComPing: 1, proxyComQuery: 2, proxyComStmtPrepare: 1}
		if !maps.Equal(counts, want) {
			t.Errorf("size %d: counts %v, want %v", size, counts, want)
		}

		// A cut on the big query comes where its continuation ends.
		sc = packetScanner{onCommand: func(code byte) bool { return code == proxyComQuery }}
		pos, cut := 0, false
		for _, c := range chunks(size) {
			var k int
			k, cut = sc.scan(c)
			pos += k
			if cut {
				break
			}
		}
		if !cut || pos != cutAt {
			t.Errorf("size %d: cut %t at %d, want at %d", size, cut, pos, cutAt)
		}
	}
}

func TestProxy_countsCommands(t *testing.T) {
	eachProxyConfig(t, func(t *testing.T, cfg *mysql.Config) {
		p := startProxy(t, cfg.Addr)
		db := openProxyTestDB(t, cfg, p.Addr())
		ctx := context.Background()

		stmt, err := db.PrepareContext(ctx, "DO ?")
		if err != nil {
			t.Fatal(err)
		}
		defer stmt.Close()
		if _, err := stmt.ExecContext(ctx, 1); err != nil {
			t.Fatal(err)
		}
		// The handshake and auth packets are no commands.
		if got, want := p.Commands(), map[byte]int{proxyComStmtPrepare: 1, proxyComStmtExecute: 1}; !maps.Equal(got, want) {
			t.Errorf("cold Exec: commands %v, want %v", got, want)
		}

		p.ResetCounts()
		if _, err := stmt.ExecContext(ctx, 2); err != nil {
			t.Fatal(err)
		}
		if got, want := p.Commands(), map[byte]int{proxyComStmtExecute: 1}; !maps.Equal(got, want) {
			t.Errorf("warm Exec: commands %v, want %v", got, want)
		}
		if n := p.CommandCount(); n != 1 {
			t.Errorf("warm Exec: CommandCount() = %d, want 1", n)
		}
	})
}

func TestProxy_stallHoldsUntilHealed(t *testing.T) {
	eachProxyConfig(t, func(t *testing.T, cfg *mysql.Config) {
		p := startProxy(t, cfg.Addr)
		db := openProxyTestDB(t, cfg, p.Addr())
		ctx := context.Background()
		if err := db.PingContext(ctx); err != nil {
			t.Fatal(err)
		}

		p.Stall(true)
		short, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
		defer cancel()
		var v int
		if err := db.QueryRowContext(short, "SELECT 1").Scan(&v); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("query during stall: %v, want %v", err, context.DeadlineExceeded)
		}

		// A query sent during the stall completes once it ends: its bytes (and
		// those of the new connection's handshake) were held, not dropped.
		done := make(chan error, 1)
		go func() {
			var v int
			err := db.QueryRowContext(ctx, "SELECT 2").Scan(&v)
			if err == nil && v != 2 {
				err = fmt.Errorf("got %d, want 2", v)
			}
			done <- err
		}()
		select {
		case err := <-done:
			t.Fatalf("query returned during stall: %v", err)
		case <-time.After(300 * time.Millisecond):
		}
		p.Stall(false)
		select {
		case err := <-done:
			if err != nil {
				t.Fatalf("query after stall: %v", err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("query still blocked 10s after the stall ended")
		}
	})
}

func TestProxy_cutAfterCommandHidesOutcome(t *testing.T) {
	eachProxyConfig(t, func(t *testing.T, cfg *mysql.Config) {
		direct := openProxyTestDB(t, cfg, "")
		ctx := context.Background()
		table := "proxy_cut_" + strconv.FormatInt(time.Now().UnixNano(), 36)
		if _, err := direct.ExecContext(ctx, "CREATE TABLE "+table+" (id INT PRIMARY KEY)"); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if _, err := direct.ExecContext(ctx, "DROP TABLE IF EXISTS "+table); err != nil {
				t.Errorf("drop %s: %v", table, err)
			}
		})

		p := startProxy(t, cfg.Addr)
		db := openProxyTestDB(t, cfg, p.Addr())
		stmt, err := db.PrepareContext(ctx, "INSERT INTO "+table+" (id) VALUES (?)")
		if err != nil {
			t.Fatal(err)
		}
		defer stmt.Close()
		if _, err := stmt.ExecContext(ctx, 1); err != nil {
			t.Fatal(err)
		}

		p.CutAfterCommand(proxyComStmtExecute, 1)
		if _, err := stmt.ExecContext(ctx, 2); err == nil {
			t.Fatal("Exec through a cut succeeded; want an error")
		} else {
			t.Logf("Exec through a cut: %v", err)
		}
		// The client may learn of the cut before the server has run the
		// statement, so wait for the row.
		deadline := time.Now().Add(5 * time.Second)
		for {
			var n int
			if err := direct.QueryRowContext(ctx, "SELECT COUNT(*) FROM "+table+" WHERE id = 2").Scan(&n); err != nil {
				t.Fatal(err)
			}
			if n == 1 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatal("the server did not apply the cut INSERT")
			}
			time.Sleep(10 * time.Millisecond)
		}

		// The cut fires once.
		if _, err := stmt.ExecContext(ctx, 3); err != nil {
			t.Fatalf("Exec after the cut: %v", err)
		}
	})
}

func TestProxy_cutAllBreaksLiveConnection(t *testing.T) {
	eachProxyConfig(t, func(t *testing.T, cfg *mysql.Config) {
		p := startProxy(t, cfg.Addr)
		db := openProxyTestDB(t, cfg, p.Addr())
		ctx := context.Background()
		conn, err := db.Conn(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := conn.PingContext(ctx); err != nil {
			t.Fatal(err)
		}

		p.CutAll()
		if err := conn.PingContext(ctx); err == nil {
			t.Fatal("Ping on a cut connection succeeded; want an error")
		}
		conn.Close()
		// New connections are served as usual.
		if err := db.PingContext(ctx); err != nil {
			t.Fatalf("Ping after CutAll: %v", err)
		}
	})
}

func TestProxy_refuseAndLatency(t *testing.T) {
	eachProxyConfig(t, func(t *testing.T, cfg *mysql.Config) {
		p := startProxy(t, cfg.Addr)
		db := openProxyTestDB(t, cfg, p.Addr())
		ctx := context.Background()

		p.Refuse(true)
		if err := db.PingContext(ctx); err == nil {
			t.Fatal("Ping while refusing succeeded; want an error")
		}
		p.Refuse(false)
		if err := db.PingContext(ctx); err != nil {
			t.Fatalf("Ping after refusing: %v", err)
		}

		const d = 200 * time.Millisecond
		p.Latency(d)
		p.ResetCounts()
		start := time.Now()
		if err := db.PingContext(ctx); err != nil {
			t.Fatal(err)
		}
		if took := time.Since(start); took < d {
			t.Errorf("Ping with latency %v took %v", d, took)
		}
		if got, want := p.Commands(), map[byte]int{proxyComPing: 1}; !maps.Equal(got, want) {
			t.Errorf("Ping: commands %v, want %v", got, want)
		}
	})
}

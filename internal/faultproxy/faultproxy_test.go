package faultproxy

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"maps"
	"net"
	"strings"
	"testing"
	"time"
)

// quiet is how long a test waits to see that nothing arrives.
const quiet = 300 * time.Millisecond

func start(t *testing.T, target string) *Proxy {
	t.Helper()
	p, err := Start(target)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := p.Close(); err != nil {
			t.Error(err)
		}
	})
	return p
}

func dial(t *testing.T, p *Proxy) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// listen starts a server on 127.0.0.1 that runs serve on each connection.
func listen(t *testing.T, serve func(net.Conn)) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				serve(c)
			}()
		}
	}()
	return ln.Addr().String()
}

// echoServer answers each line with "echo: " and the line, and tells got
// every line it receives.
func echoServer(t *testing.T) (addr string, got <-chan string) {
	t.Helper()
	lines := make(chan string, 100)
	addr = listen(t, func(c net.Conn) {
		sc := bufio.NewScanner(c)
		for sc.Scan() {
			lines <- sc.Text()
			if _, err := c.Write([]byte("echo: " + sc.Text() + "\n")); err != nil {
				return
			}
		}
	})
	return addr, lines
}

// packet is a MySQL packet: 3-byte length, sequence id, payload.
func packet(seq byte, payload ...byte) []byte {
	n := len(payload)
	return append([]byte{byte(n), byte(n >> 8), byte(n >> 16), seq}, payload...)
}

// mysqlServer reads MySQL packets, tells got each payload's first byte, and
// answers each with a 1-byte packet holding that byte, as a server answers
// a command; a handshake-free stream.
func mysqlServer(t *testing.T) (addr string, got <-chan byte) {
	t.Helper()
	codes := make(chan byte, 100)
	addr = listen(t, func(c net.Conn) {
		r := bufio.NewReader(c)
		for {
			var hdr [4]byte
			if _, err := io.ReadFull(r, hdr[:]); err != nil {
				return
			}
			payload := make([]byte, int(hdr[0])|int(hdr[1])<<8|int(hdr[2])<<16)
			if _, err := io.ReadFull(r, payload); err != nil {
				return
			}
			codes <- payload[0]
			if _, err := c.Write(packet(hdr[3]+1, payload[0])); err != nil {
				return
			}
		}
	})
	return addr, codes
}

// command sends a command packet on c and reads its answer.
func command(c net.Conn, code byte) error {
	if _, err := c.Write(packet(0, code, 'x')); err != nil {
		return err
	}
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	var reply [5]byte
	if _, err := io.ReadFull(c, reply[:]); err != nil {
		return err
	}
	if reply[4] != code {
		return errors.New("answer to another command")
	}
	return nil
}

// readLine reads one line within limit.
func readLine(c net.Conn, r *bufio.Reader, limit time.Duration) (string, error) {
	_ = c.SetReadDeadline(time.Now().Add(limit))
	s, err := r.ReadString('\n')
	return strings.TrimSuffix(s, "\n"), err
}

func expectNothing[T any](t *testing.T, ch <-chan T, what string) {
	t.Helper()
	select {
	case v := <-ch:
		t.Fatalf("%s: got %v, want nothing", what, v)
	case <-time.After(quiet):
	}
}

func expect[T comparable](t *testing.T, ch <-chan T, want T) {
	t.Helper()
	select {
	case got := <-ch:
		if got != want {
			t.Fatalf("server got %v, want %v", got, want)
		}
	case <-time.After(5 * time.Second):
		t.Fatalf("server got nothing, want %v", want)
	}
}

// expectGone checks that c's peer is gone: reading what is left ends with
// an end or error that is no timeout.
func expectGone(t *testing.T, c net.Conn, what string) {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	_, err := io.Copy(io.Discard, c)
	if err == nil {
		return // io.EOF
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		t.Fatalf("%s: read got %v, want the connection gone", what, err)
	}
}

// expectRefused checks that a new connection to p is reset, as it is
// accepted or at once after.
func expectRefused(t *testing.T, p *Proxy, what string) {
	t.Helper()
	c, err := net.Dial("tcp", p.Addr())
	if err != nil {
		return
	}
	defer c.Close()
	expectGone(t, c, what)
}

func TestScanner(t *testing.T) {
	big := bytes.Repeat([]byte{'x'}, maxPacketLen)
	big[0] = ComQuery
	var stream []byte
	stream = append(stream, packet(1, ComQuery, 1, 2)...) // handshake response
	stream = append(stream, packet(3, ComPing)...)        // auth switch response
	stream = append(stream, packet(0, ComPing)...)
	bigFrom := len(stream) + 16
	stream = append(stream, packet(0, big...)...)
	bigTo := len(stream) - 16
	stream = append(stream, packet(1, 0, 1)...) // continues big
	cutAt := len(stream)
	stream = append(stream, packet(0, ComStmtPrepare, 'x')...)
	stream = append(stream, packet(0, ComQuery)...)

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
		want := map[byte]int{ComPing: 1, ComQuery: 2, ComStmtPrepare: 1}
		if !maps.Equal(counts, want) {
			t.Errorf("size %d: counts %v, want %v", size, counts, want)
		}

		// A cut on the big query comes where its continuation ends.
		sc = packetScanner{onCommand: func(code byte) bool { return code == ComQuery }}
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
	target, got := mysqlServer(t)
	p := start(t, target)
	c := dial(t, p)
	for _, code := range []byte{ComStmtPrepare, ComStmtExecute, ComStmtExecute} {
		if err := command(c, code); err != nil {
			t.Fatal(err)
		}
		expect(t, got, code)
	}
	if got, want := p.Commands(), map[byte]int{ComStmtPrepare: 1, ComStmtExecute: 2}; !maps.Equal(got, want) {
		t.Errorf("Commands() = %v, want %v", got, want)
	}
	if n := p.CommandCount(); n != 3 {
		t.Errorf("CommandCount() = %d, want 3", n)
	}
	if n := p.RoundTrips(); n != 3 {
		t.Errorf("RoundTrips() = %d, want 3", n)
	}
	p.ResetCounts()
	if err := command(c, ComPing); err != nil {
		t.Fatal(err)
	}
	if got, want := p.Commands(), map[byte]int{ComPing: 1}; !maps.Equal(got, want) {
		t.Errorf("after ResetCounts: Commands() = %v, want %v", got, want)
	}
}

// A request written in two pieces is one round trip.
func TestProxy_roundTrips(t *testing.T) {
	target, _ := echoServer(t)
	p := start(t, target)
	c := dial(t, p)
	r := bufio.NewReader(c)
	const n = 10
	for i := range n {
		io.WriteString(c, "ping ")
		io.WriteString(c, strings.Repeat("x", i)+"\n")
		if _, err := readLine(c, r, 5*time.Second); err != nil {
			t.Fatal(err)
		}
	}
	if got := p.RoundTrips(); got != n {
		t.Errorf("RoundTrips() = %d, want %d", got, n)
	}
}

// Each stall holds back what flows its way, without an error or a reset on
// either side, and the heal delivers what was held, in order.
func TestProxy_Stall(t *testing.T) {
	for _, d := range []Direction{ToServer, ToClient, Both} {
		t.Run(map[Direction]string{ToServer: "toServer", ToClient: "toClient", Both: "both"}[d], func(t *testing.T) {
			target, got := echoServer(t)
			p := start(t, target)
			c := dial(t, p)
			r := bufio.NewReader(c)
			io.WriteString(c, "before\n")
			expect(t, got, "before")
			if s, err := readLine(c, r, 5*time.Second); err != nil || s != "echo: before" {
				t.Fatalf("reply before the stall: got %q, %v, want %q", s, err, "echo: before")
			}

			p.Stall(d)
			if _, err := io.WriteString(c, "during\n"); err != nil {
				t.Fatalf("write during the stall: got %v, want none (nothing is refused)", err)
			}
			if d&ToServer != 0 {
				expectNothing(t, got, "server during the stall")
			} else {
				expect(t, got, "during")
			}
			s, err := readLine(c, r, quiet)
			var ne net.Error
			if !errors.As(err, &ne) || !ne.Timeout() {
				t.Fatalf("client read during the stall: got %q, %v, want a timeout (no reply, no reset)", s, err)
			}

			p.Stall(0)
			if d&ToServer != 0 {
				expect(t, got, "during")
			}
			if s, err := readLine(c, r, 5*time.Second); err != nil || s != "echo: during" {
				t.Fatalf("reply after the heal: got %q, %v, want %q", s, err, "echo: during")
			}
		})
	}
}

// A connection opened during a stall reaches the server only after the
// heal.
func TestProxy_Stall_connect(t *testing.T) {
	target, got := echoServer(t)
	p := start(t, target)
	p.Stall(ToClient)
	c := dial(t, p)
	io.WriteString(c, "hello\n")
	expectNothing(t, got, "server before the heal")
	p.Stall(0)
	expect(t, got, "hello")
	if s, err := readLine(c, bufio.NewReader(c), 5*time.Second); err != nil || s != "echo: hello" {
		t.Fatalf("reply after the heal: got %q, %v, want %q", s, err, "echo: hello")
	}
}

// A client's close is held back with its data, and passes on at the heal.
func TestProxy_Stall_close(t *testing.T) {
	ready, eof := make(chan struct{}), make(chan error, 1)
	target := listen(t, func(s net.Conn) {
		if _, err := s.Read(make([]byte, 1)); err != nil {
			eof <- err
			return
		}
		close(ready)
		_, err := s.Read(make([]byte, 1))
		eof <- err
	})
	p := start(t, target)
	c := dial(t, p)
	io.WriteString(c, "x")
	<-ready
	p.Stall(ToServer)
	c.Close()
	expectNothing(t, eof, "server's read during the stall")
	p.Stall(0)
	select {
	case err := <-eof:
		if err == nil {
			t.Fatal("server's read after the heal: got no error, want the close")
		}
	case <-time.After(5 * time.Second):
		t.Fatalf("server never saw the close")
	}
}

func TestProxy_CutAll(t *testing.T) {
	target, got := echoServer(t)
	p := start(t, target)
	c := dial(t, p)
	r := bufio.NewReader(c)
	io.WriteString(c, "one\n")
	expect(t, got, "one")
	if _, err := readLine(c, r, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	p.CutAll()
	expectGone(t, c, "live connection after CutAll")

	// A connection accepted before the cut, still waiting to reach the
	// server, is cut too.
	p.Stall(Both)
	waiting := dial(t, p)
	time.Sleep(50 * time.Millisecond) // the proxy accepts it
	p.CutAll()
	p.Stall(0)
	expectGone(t, waiting, "waiting connection after CutAll")

	// Later connections are served as usual.
	later := dial(t, p)
	io.WriteString(later, "two\n")
	expect(t, got, "two")
	if s, err := readLine(later, bufio.NewReader(later), 5*time.Second); err != nil || s != "echo: two" {
		t.Fatalf("after CutAll: got %q, %v, want %q", s, err, "echo: two")
	}
}

// The cut command reaches the server, the client never learns its answer,
// and the cut fires once.
func TestProxy_CutAfterCommand(t *testing.T) {
	target, got := mysqlServer(t)
	p := start(t, target)
	if p.CutReplied() != nil {
		t.Fatal("CutReplied() before arming: got a channel, want nil")
	}
	c := dial(t, p)
	p.CutAfterCommand(ComStmtExecute, 2)
	replied := p.CutReplied()
	for _, code := range []byte{ComStmtExecute, ComQuery} {
		if err := command(c, code); err != nil {
			t.Fatalf("command %#x before the cut: %v", code, err)
		}
		expect(t, got, code)
	}
	if err := command(c, ComStmtExecute); err == nil {
		t.Fatal("the cut command got its answer; want the connection gone")
	}
	expect(t, got, ComStmtExecute)
	select {
	case <-replied:
	case <-time.After(5 * time.Second):
		t.Fatal("CutReplied still open 5s after the server answered")
	}

	c = dial(t, p)
	if err := command(c, ComStmtExecute); err != nil {
		t.Fatalf("after the cut fired: %v", err)
	}
	expect(t, got, ComStmtExecute)
}

func TestProxy_CutAfterCommandThenRefuse(t *testing.T) {
	target, got := mysqlServer(t)
	p := start(t, target)
	p.CutAfterCommandThenRefuse(ComQuery, 1)
	c := dial(t, p)
	if err := command(c, ComQuery); err == nil {
		t.Fatal("the cut command got its answer; want the connection gone")
	}
	expect(t, got, ComQuery)
	expectRefused(t, p, "new connection after the cut")
	p.Refuse(false)
	if err := command(dial(t, p), ComPing); err != nil {
		t.Fatalf("after Refuse(false): %v", err)
	}
}

func TestProxy_Refuse(t *testing.T) {
	target, _ := mysqlServer(t)
	p := start(t, target)
	live := dial(t, p)
	if err := command(live, ComPing); err != nil {
		t.Fatal(err)
	}
	p.Refuse(true)
	expectRefused(t, p, "new connection while refusing")
	if err := command(live, ComPing); err != nil {
		t.Fatalf("live connection while refusing: %v", err)
	}
	p.Refuse(false)
	if err := command(dial(t, p), ComPing); err != nil {
		t.Fatalf("after Refuse(false): %v", err)
	}
}

func TestProxy_Latency(t *testing.T) {
	const d = 100 * time.Millisecond
	for _, tc := range []struct {
		dir   Direction
		least time.Duration
	}{{ToClient, d}, {ToServer, d}, {Both, 2 * d}} {
		target, _ := mysqlServer(t)
		p := start(t, target)
		c := dial(t, p)
		if err := command(c, ComPing); err != nil {
			t.Fatal(err)
		}
		p.Latency(tc.dir, d)
		start := time.Now()
		if err := command(c, ComPing); err != nil {
			t.Fatal(err)
		}
		if took := time.Since(start); took < tc.least {
			t.Errorf("Latency(%d, %v): a round trip took %v, want at least %v", tc.dir, d, took, tc.least)
		}
		p.Latency(Both, 0)
		if err := command(c, ComPing); err != nil {
			t.Fatalf("after Latency 0: %v", err)
		}
	}
}

// Close ends every connection and every goroutine, a stalled one's too.
func TestProxy_Close(t *testing.T) {
	target, got := echoServer(t)
	p, err := Start(target)
	if err != nil {
		t.Fatal(err)
	}
	c := dial(t, p)
	io.WriteString(c, "one\n")
	expect(t, got, "one")
	p.Stall(Both)
	io.WriteString(c, "held\n")
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	expectGone(t, c, "connection after Close")
	if c, err := net.Dial("tcp", p.Addr()); err == nil {
		c.Close()
		t.Error("dial after Close: got a connection, want a refusal")
	}
}

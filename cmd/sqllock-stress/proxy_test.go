package main

import (
	"bufio"
	"errors"
	"net"
	"strings"
	"testing"
	"time"
)

// echoServer answers each line with "echo: " and the line, and tells got
// every line it receives.
func echoServer(t *testing.T) (addr string, got <-chan string) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	lines := make(chan string, 100)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				sc := bufio.NewScanner(c)
				for sc.Scan() {
					lines <- sc.Text()
					if _, err := c.Write([]byte("echo: " + sc.Text() + "\n")); err != nil {
						return
					}
				}
			}()
		}
	}()
	return ln.Addr().String(), lines
}

func startProxy(t *testing.T, target string) *proxy {
	t.Helper()
	p, err := newProxy(target)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.close)
	return p
}

// quiet is how long a test waits to see that nothing arrives.
const quiet = 300 * time.Millisecond

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
		t.Fatalf("%s: got %v, want nothing while cut", what, v)
	case <-time.After(quiet):
	}
}

func expectLine(t *testing.T, ch <-chan string, want string) {
	t.Helper()
	select {
	case got := <-ch:
		if got != want {
			t.Fatalf("server got %q, want %q", got, want)
		}
	case <-time.After(5 * time.Second):
		t.Fatalf("server got nothing, want %q", want)
	}
}

// Each cut holds back what flows its way, without an error or a reset on
// either side, and the heal delivers what was held, in order.
func TestProxy_blackhole(t *testing.T) {
	for _, d := range []direction{toServer, toClient, bothWays} {
		t.Run(d.String(), func(t *testing.T) {
			target, got := echoServer(t)
			p := startProxy(t, target)
			c, err := net.Dial("tcp", p.addr())
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			r := bufio.NewReader(c)
			if _, err := c.Write([]byte("before\n")); err != nil {
				t.Fatal(err)
			}
			expectLine(t, got, "before")
			if s, err := readLine(c, r, 5*time.Second); err != nil || s != "echo: before" {
				t.Fatalf("reply before the cut: got %q, %v, want %q", s, err, "echo: before")
			}

			p.set(d)
			if _, err := c.Write([]byte("during\n")); err != nil {
				t.Fatalf("write during the cut: got %v, want none (nothing is refused)", err)
			}
			if d&toServer != 0 {
				expectNothing(t, got, "server during the cut")
			} else {
				expectLine(t, got, "during")
			}
			s, err := readLine(c, r, quiet)
			var ne net.Error
			if !errors.As(err, &ne) || !ne.Timeout() {
				t.Fatalf("client read during the cut: got %q, %v, want a timeout (no reply, no reset)", s, err)
			}

			p.set(pass)
			if d&toServer != 0 {
				expectLine(t, got, "during")
			}
			if s, err := readLine(c, r, 5*time.Second); err != nil || s != "echo: during" {
				t.Fatalf("reply after the heal: got %q, %v, want %q", s, err, "echo: during")
			}
		})
	}
}

// A connection opened during a cut reaches the server only after the heal.
func TestProxy_connectDuringCut(t *testing.T) {
	target, got := echoServer(t)
	p := startProxy(t, target)
	p.set(toClient)
	c, err := net.Dial("tcp", p.addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Write([]byte("hello\n")); err != nil {
		t.Fatal(err)
	}
	expectNothing(t, got, "server before the heal")
	p.set(pass)
	expectLine(t, got, "hello")
	if s, err := readLine(c, bufio.NewReader(c), 5*time.Second); err != nil || s != "echo: hello" {
		t.Fatalf("reply after the heal: got %q, %v, want %q", s, err, "echo: hello")
	}
}

// A client's close is held back with its data, and passes on at the heal.
func TestProxy_closeHeld(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	eof := make(chan error, 1)
	go func() {
		s, err := ln.Accept()
		if err != nil {
			eof <- err
			return
		}
		defer s.Close()
		_, err = s.Read(make([]byte, 1))
		eof <- err
	}()
	p := startProxy(t, ln.Addr().String())
	c, err := net.Dial("tcp", p.addr())
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(50 * time.Millisecond) // the proxy dials the server
	p.set(toServer)
	c.Close()
	expectNothing(t, eof, "server's read during the cut")
	p.set(pass)
	select {
	case err := <-eof:
		if err == nil {
			t.Fatalf("server's read after the heal: got no error, want the close")
		}
	case <-time.After(5 * time.Second):
		t.Fatalf("server never saw the close")
	}
}

// Nothing off this machine is proxied to.
func TestProxy_loopbackOnly(t *testing.T) {
	for _, addr := range []string{"192.0.2.1:3306", "db.example:3306", "[2001:db8::1]:3306", "nonsense"} {
		if p, err := newProxy(addr); err == nil {
			p.close()
			t.Errorf("newProxy(%q): got no error, want a refusal", addr)
		}
	}
	for _, addr := range []string{"127.0.0.1:3306", "127.0.0.2:1", "localhost:3306", "[::1]:3306"} {
		if !loopback(addr) {
			t.Errorf("loopback(%q): got false, want true", addr)
		}
	}
}

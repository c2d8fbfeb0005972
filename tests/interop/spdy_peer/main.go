// Command spdy_peer is the foreign SPDY/3.1 server used by tests/spdy_interop.rs.
//
// It speaks SPDY through github.com/moby/spdystream, the library Kubernetes itself uses, so the
// Rust client is checked against an implementation it shares no code with. Every TCP connection
// is upgraded with the HTTP/1.1 handshake Kubernetes uses, then served by spdystream. The
// behaviour of each stream is chosen by the `scenario` header of its SYN_STREAM.
//
// Protocol with the test: the peer prints "LISTEN <addr>" on stdout once it accepts connections,
// and exits when its stdin is closed, so a test that dies never leaves it running.
//
// Run as `spdy_peer headers`, it reads SYN_STREAM frames on stdin instead (headers.go).
package main

import (
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/moby/spdystream"
)

// chunkSize is the size of each write of the download scenario. spdystream sends one DATA frame
// per write, so the client has to cope with 4 MiB frames (far above any inbox or read buffer).
const chunkSize = 4 << 20

// patternCycle is the period of the download pattern: byte i of a download is i % 251. A prime
// period never lines up with frame or buffer sizes, so misplaced or repeated bytes show.
const patternCycle = 251

func main() {
	log.SetPrefix("spdy_peer: ")
	if len(os.Args) > 1 && os.Args[1] == "headers" {
		readHeaders()
		return
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		log.Fatal(err)
	}
	// os.Stdout is unbuffered: the test sees this line at once.
	fmt.Printf("LISTEN %s\n", ln.Addr())

	// The test holds our stdin; EOF means it is gone.
	go func() {
		io.Copy(io.Discard, os.Stdin)
		os.Exit(0)
	}()

	for {
		c, err := ln.Accept()
		if err != nil {
			log.Fatal(err)
		}
		go serveConn(c)
	}
}

// bufferedConn is a net.Conn whose reads go through the bufio.Reader that parsed the upgrade
// request, so bytes that arrived right behind the request head are not lost.
type bufferedConn struct {
	net.Conn
	r *bufio.Reader
}

func (c *bufferedConn) Read(p []byte) (int, error) { return c.r.Read(p) }

// serveConn performs the upgrade handshake and then runs one spdystream server session.
func serveConn(c net.Conn) {
	defer c.Close()
	br := bufio.NewReader(c)
	req, err := http.ReadRequest(br)
	if err != nil {
		log.Printf("reading upgrade request: %v", err)
		return
	}
	if req.Method != http.MethodPost ||
		!headerHasToken(req.Header, "Connection", "upgrade") ||
		!headerHasToken(req.Header, "Upgrade", "spdy/3.1") {
		io.WriteString(c, "HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
		return
	}
	resp := "HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: SPDY/3.1\r\n"
	// Like the kubelet, pick the client's first choice.
	if offered := req.Header.Values("X-Stream-Protocol-Version"); len(offered) > 0 {
		resp += "X-Stream-Protocol-Version: " + offered[0] + "\r\n"
	}
	if _, err := io.WriteString(c, resp+"\r\n"); err != nil {
		log.Printf("writing upgrade response: %v", err)
		return
	}

	conn, err := spdystream.NewConnection(&bufferedConn{Conn: c, r: br}, true)
	if err != nil {
		log.Printf("starting spdy session: %v", err)
		return
	}
	// Close (GOAWAY) waits for open streams to end; bound it so the goaway scenario cannot hang
	// the peer if the client never finishes its side.
	conn.SetCloseTimeout(10 * time.Second)
	conn.Serve(func(s *spdystream.Stream) { acceptStream(conn, s) })
}

func headerHasToken(h http.Header, name, token string) bool {
	for _, v := range h.Values(name) {
		for _, t := range strings.Split(v, ",") {
			if strings.EqualFold(strings.TrimSpace(t), token) {
				return true
			}
		}
	}
	return false
}

// acceptStream runs on spdystream's frame worker for the new stream. It answers the SYN_STREAM
// right here, as the kubelet does: spdystream marks a stream replied only after SendReply
// returns and silently drops DATA (even a FIN) that its worker handles before that, so a reply
// sent from another goroutine could lose the client's first frames. Everything else runs in a
// goroutine, because the same worker delivers the stream's DATA and must not block.
//
// spdystream stores SYN_STREAM header names through http.Header.Add, i.e. canonicalized
// ("Scenario"), so Get with any case finds them.
func acceptStream(conn *spdystream.Connection, s *spdystream.Stream) {
	scenario := s.Headers().Get("scenario")
	switch scenario {
	case "echo", "download", "upload", "reset", "ping", "goaway":
	default:
		// RST_STREAM REFUSED_STREAM instead of a SYN_REPLY.
		s.Refuse()
		return
	}
	// Reflect the request headers in the SYN_REPLY so the client's header decompression of
	// Go-compressed blocks is exercised too.
	if err := s.SendReply(s.Headers(), false); err != nil {
		log.Printf("%s: reply: %v", s, err)
		return
	}
	go runScenario(conn, s, scenario)
}

// runScenario produces the stream's data for one scenario.
func runScenario(conn *spdystream.Connection, s *spdystream.Stream, scenario string) {
	switch scenario {
	case "echo":
		// Until the client's FIN, then our own FIN.
		io.Copy(s, s)
		s.Close()

	case "download":
		n, err := strconv.ParseInt(s.Headers().Get("bytes"), 10, 64)
		if err != nil || n < 0 {
			s.Reset()
			return
		}
		if err := download(s, n); err != nil {
			log.Printf("%s: download: %v", s, err)
			s.Reset()
			return
		}
		s.Close()

	case "upload":
		h := sha256.New()
		n, err := io.Copy(h, s)
		if err != nil {
			fmt.Fprintf(s, "error %v", err)
		} else {
			fmt.Fprintf(s, "%d %s", n, hex.EncodeToString(h.Sum(nil)))
		}
		s.Close()

	case "reset":
		// The data must reach the client before the RST; both go through the same framer.
		s.Write([]byte("before-reset"))
		s.Reset()

	case "ping":
		// A server-initiated PING (even id) must be echoed by the client. spdystream's Ping
		// waits forever, so give it a deadline of our own.
		result := make(chan error, 1)
		go func() {
			_, err := conn.Ping()
			result <- err
		}()
		select {
		case err := <-result:
			if err != nil {
				fmt.Fprintf(s, "ping error: %v", err)
			} else {
				io.WriteString(s, "pong-ok")
			}
		case <-time.After(10 * time.Second):
			io.WriteString(s, "ping error: no answer within 10s")
		}
		s.Close()

	case "goaway":
		s.Write([]byte("bye"))
		s.Close()
		// Connection.Close writes GOAWAY (last good = the client's newest stream), then closes
		// the socket once every stream has ended or the close timeout passed.
		conn.Close()
	}
}

// download writes n bytes of the i % 251 pattern in chunkSize writes.
func download(w io.Writer, n int64) error {
	buf := make([]byte, chunkSize+patternCycle)
	for i := range buf {
		buf[i] = byte(i % patternCycle)
	}
	var pos int64
	for pos < n {
		size := n - pos
		if size > chunkSize {
			size = chunkSize
		}
		start := int(pos % patternCycle)
		if _, err := w.Write(buf[start : start+int(size)]); err != nil {
			return err
		}
		pos += size
	}
	return nil
}

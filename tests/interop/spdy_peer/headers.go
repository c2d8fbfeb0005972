package main

// The `headers` mode of spdy_peer: how Go's spdystream, as a kubelet runs it, reads the
// headers of a stream a client opens. Used by tests/spdy_header_differential.rs.
//
// Each line of stdin is one SYN_STREAM frame, hex-encoded, whose header block is compressed
// on a fresh zlib stream. Each is written to a new spdystream server connection (over an
// in-memory pipe), served exactly as the kubelet serves one; for each, one JSON line on
// stdout says whether the connection accepted the stream (its handler was called) or ended
// (spdystream refused the frame), and what Headers().Get and Headers().Values returned for
// the names the kubelet reads, hex-encoded. The mode ends at the end of stdin.

import (
	"bufio"
	"encoding/hex"
	"encoding/json"
	"log"
	"net"
	"net/http"
	"os"
	"strconv"
	"time"

	"github.com/moby/spdystream"
)

// The headers the kubelet reads from a stream (api.StreamType, api.PortHeader,
// api.PortForwardRequestIDHeader).
var kubeletHeaders = []string{"streamType", "port", "requestID"}

type reading struct {
	Accepted bool                `json:"accepted"`
	Get      map[string]string   `json:"get"`
	Values   map[string][]string `json:"values"`
	// The port as the kubelet's port-forward handler takes it (strconv.ParseUint(port, 10,
	// 16), then not 0), or 0 where it refuses the stream.
	Port uint64 `json:"port"`
}

func readHeaders() {
	in := bufio.NewScanner(os.Stdin)
	in.Buffer(make([]byte, 1<<20), 1<<24)
	out := json.NewEncoder(os.Stdout)
	for in.Scan() {
		frame, err := hex.DecodeString(in.Text())
		if err != nil {
			log.Fatalf("input line is not hex: %v", err)
		}
		if err := out.Encode(readOne(frame)); err != nil {
			log.Fatal(err)
		}
	}
	if err := in.Err(); err != nil {
		log.Fatal(err)
	}
}

// readOne serves one connection that receives `frame` and reports what became of it.
func readOne(frame []byte) reading {
	server, client := net.Pipe()
	defer client.Close()
	conn, err := spdystream.NewConnection(server, true)
	if err != nil {
		log.Fatalf("starting spdy session: %v", err)
	}
	headers := make(chan http.Header, 1)
	served := make(chan struct{})
	go func() {
		conn.Serve(func(s *spdystream.Stream) { headers <- s.Headers() })
		close(served)
	}()
	// A pipe write waits for the reader; the session may stop reading half-way.
	go client.Write(frame)
	// The client's end reads nothing: drain it so the server's writes never block.
	go func() {
		buf := make([]byte, 4096)
		for {
			if _, err := client.Read(buf); err != nil {
				return
			}
		}
	}()
	select {
	case h := <-headers:
		r := reading{Accepted: true, Get: map[string]string{}, Values: map[string][]string{}}
		for _, name := range kubeletHeaders {
			r.Get[name] = hex.EncodeToString([]byte(h.Get(name)))
			values := []string{}
			for _, v := range h.Values(name) {
				values = append(values, hex.EncodeToString([]byte(v)))
			}
			r.Values[name] = values
		}
		if port, err := strconv.ParseUint(h.Get("port"), 10, 16); err == nil {
			r.Port = port
		}
		return r
	case <-served:
		return reading{}
	case <-time.After(10 * time.Second):
		log.Fatalf("spdystream neither accepted nor refused frame %x", frame)
		return reading{}
	}
}

// A Go net/http server that reads requests as kube-apiserver's HTTP stack does, for the tests
// of how kube-ws-proxy reads them (tests/go_url_differential.rs, tests/e2e_request_reading.rs).
//
//	go_front reads          answers every request with what Go read of it (JSON)
//	go_front front ADDR     a reverse proxy to ADDR that acts on Go's reading: the decoded path
//	                        and the kept query pairs are what goes on (as kube-apiserver builds
//	                        its request to the kubelet from the options it parsed); one JSON line
//	                        per request on stdout says what it read
//
// Either way the first line on stdout is the address it listens on (127.0.0.1).
package main

import (
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"sort"
	"strings"
	"sync"
)

// reading is what Go made of one request.
type reading struct {
	Method string `json:"method"`
	// PathHex is URL.Path, hex-encoded (it may hold any byte).
	PathHex string `json:"path_hex"`
	Path    string `json:"path"`
	// Query is every key Go kept, sorted, with its values in order, hex-encoded.
	Query [][2]interface{} `json:"query"`
	// The options kube-apiserver reads as PodExecOptions / PodLogOptions: first value wins.
	Container string   `json:"container"`
	Command   []string `json:"command"`
	Stdin     bool     `json:"stdin"`
	Tty       bool     `json:"tty"`
	Follow    bool     `json:"follow"`
	Upgrade   string   `json:"upgrade"`
}

// sliceToBool is apimachinery's Convert_Slice_string_To_bool.
func sliceToBool(values []string) bool {
	if len(values) == 0 {
		return false
	}
	v := values[0]
	return !(v == "0" || strings.EqualFold(v, "false"))
}

func read(r *http.Request) reading {
	q := r.URL.Query()
	keys := make([]string, 0, len(q))
	for k := range q {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	pairs := make([][2]interface{}, 0, len(keys))
	for _, k := range keys {
		values := make([]string, 0, len(q[k]))
		for _, v := range q[k] {
			values = append(values, hex.EncodeToString([]byte(v)))
		}
		pairs = append(pairs, [2]interface{}{hex.EncodeToString([]byte(k)), values})
	}
	return reading{
		Method:    r.Method,
		PathHex:   hex.EncodeToString([]byte(r.URL.Path)),
		Path:      r.URL.Path,
		Query:     pairs,
		Container: q.Get("container"),
		Command:   q["command"],
		Stdin:     sliceToBool(q["stdin"]),
		Tty:       sliceToBool(q["tty"]),
		Follow:    sliceToBool(q["follow"]),
		Upgrade:   r.Header.Get("Upgrade"),
	}
}

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: go_front reads | go_front front ADDR")
		os.Exit(2)
	}
	listener, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	fmt.Println(listener.Addr().String())
	var handler http.Handler
	switch os.Args[1] {
	case "reads":
		handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			json.NewEncoder(w).Encode(read(r))
		})
	case "front":
		handler = front(os.Args[2])
	default:
		fmt.Fprintln(os.Stderr, "unknown mode", os.Args[1])
		os.Exit(2)
	}
	// Exits once the test that started it closes stdin.
	go func() {
		buf := make([]byte, 1)
		for {
			if _, err := os.Stdin.Read(buf); err != nil {
				os.Exit(0)
			}
		}
	}()
	if err := http.Serve(listener, handler); err != nil {
		panic(err)
	}
}

// front forwards what it read, re-encoded, to target, and logs its reading.
func front(target string) http.Handler {
	var mu sync.Mutex
	out := json.NewEncoder(os.Stdout)
	proxy := &httputil.ReverseProxy{
		Director: func(r *http.Request) {
			r.URL.Scheme = "http"
			r.URL.Host = target
			r.URL.RawPath = ""
			r.URL.RawQuery = options(r.URL.Query()).Encode()
		},
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		out.Encode(read(r))
		mu.Unlock()
		proxy.ServeHTTP(w, r)
	})
}

// options keeps what the typed options hold: every value of the list options, the first of
// the others (kube-apiserver's request to the kubelet carries one container, one tty, ...).
func options(q url.Values) url.Values {
	kept := url.Values{}
	for k, values := range q {
		if k == "command" || k == "ports" {
			kept[k] = values
		} else {
			kept[k] = values[:1]
		}
	}
	return kept
}

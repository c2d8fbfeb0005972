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
	"path"
	"sort"
	"strings"
	"sync"
)

// reading is what Go made of one request.
type reading struct {
	Method string `json:"method"`
	// Host is what Go takes as the request's host (Request.Host): an absolute-form target's
	// authority, else the Host header (or HTTP/2's :authority).
	Host string `json:"host"`
	// PathHex is URL.Path, hex-encoded (it may hold any byte).
	PathHex string `json:"path_hex"`
	Path    string `json:"path"`
	// What fronts that normalize the path would act on in place of Path.
	Fronts fronts `json:"fronts"`
	// Query is every key Go kept, sorted, with its values in order, hex-encoded.
	Query [][2]interface{} `json:"query"`
	// The options kube-apiserver reads as PodExecOptions / PodLogOptions: first value wins.
	Container string   `json:"container"`
	Command   []string `json:"command"`
	Stdin     bool     `json:"stdin"`
	Tty       bool     `json:"tty"`
	Follow    bool     `json:"follow"`
	Upgrade   string   `json:"upgrade"`
	// The kubelet call a nodes/{node}/proxy request reaches, if it reaches one.
	Kubelet *kubeletCall `json:"kubelet"`
}

// fronts is what fronts that normalize the path see, hex-encoded. Clean is Go's path.Clean
// of the decoded path, as ServeMux and gateways that decode then clean do. RawClean is
// path.Clean of the path as sent, as fronts that clean without decoding do. ParamsClean drops
// every segment's ";parameters" from the path as sent, then decodes and cleans, as fronts that
// honour RFC 2396 path parameters (Tomcat) do. The last two depend on the bytes as sent, not
// only on Go's reading.
type fronts struct {
	CleanHex       string `json:"clean_hex"`
	RawCleanHex    string `json:"raw_clean_hex"`
	ParamsCleanHex string `json:"params_clean_hex"`
}

// kubeletCall is what kube-apiserver's node proxy and the kubelet make of a request
// (pkg/registry/core/node/rest/proxy.go, pkg/kubelet/server/server.go).
type kubeletCall struct {
	Call      string   `json:"call"`
	Node      string   `json:"node"`
	Namespace string   `json:"namespace"`
	Pod       string   `json:"pod"`
	UID       string   `json:"uid"`
	Container string   `json:"container"`
	Command   []string `json:"command"`
	Input     bool     `json:"input"`
	Output    bool     `json:"output"`
	Error     bool     `json:"error"`
	Tty       bool     `json:"tty"`
}

// splitSchemeNamePort is apimachinery's: "<name>", "<name>:<port>" or
// "<scheme>:<name>:<port>", a non-empty name and a scheme of http, https or none.
func splitSchemeNamePort(id string) (string, bool) {
	parts := strings.Split(id, ":")
	var scheme, name string
	switch len(parts) {
	case 1, 2:
		name = parts[0]
	case 3:
		scheme, name = parts[0], parts[1]
	default:
		return "", false
	}
	valid := len(name) > 0 && (scheme == "" || scheme == "http" || scheme == "https")
	return name, valid
}

// joinPreservingTrailingSlash is apimachinery's net.JoinPreservingTrailingSlash.
func joinPreservingTrailingSlash(elem ...string) string {
	result := path.Join(elem...)
	for i := len(elem) - 1; i >= 0; i-- {
		if len(elem[i]) > 0 {
			if strings.HasSuffix(elem[i], "/") && !strings.HasSuffix(result, "/") {
				result += "/"
			}
			break
		}
	}
	return result
}

// kubelet reads r as the API server's node proxy builds the kubelet's URL (request info
// parts after "proxy", the subpath's slashes, path.Join) and as the kubelet routes it.
func kubelet(r *http.Request) *kubeletCall {
	p := r.URL.Path
	i := strings.Index(p, "/api/v1/nodes/")
	if i < 0 || strings.Contains(p[:i], "/api/") {
		return nil
	}
	parts := strings.Split(strings.Trim(p[i+len("/api/v1/"):], "/"), "/")
	if len(parts) < 3 || parts[2] != "proxy" {
		return nil
	}
	node, ok := splitSchemeNamePort(parts[1])
	if !ok {
		return nil
	}
	sub := strings.Join(parts[3:], "/")
	if len(sub) > 0 && !strings.HasPrefix(sub, "/") {
		sub = "/" + sub
	}
	if strings.HasSuffix(p, "/") && !strings.HasSuffix(sub, "/") {
		sub += "/"
	}
	loc := joinPreservingTrailingSlash("", sub)
	if !strings.HasPrefix(loc, "/") {
		return nil
	}
	segs := strings.Split(strings.TrimRight(loc[1:], "/"), "/")
	call := &kubeletCall{Call: segs[0], Node: node}
	args := segs[1:]
	switch {
	case segs[0] == "portForward" && (len(args) == 2 || len(args) == 3):
		call.Namespace, call.Pod = args[0], args[1]
		if len(args) == 3 {
			call.UID = args[2]
		}
	case (segs[0] == "exec" || segs[0] == "attach" || segs[0] == "run") && (len(args) == 3 || len(args) == 4):
		call.Namespace, call.Pod, call.Container = args[0], args[1], args[len(args)-1]
		if len(args) == 4 {
			call.UID = args[2]
		}
	default:
		return nil
	}
	post := r.Method == "POST"
	if (segs[0] == "run" && !post) || (r.Method != "GET" && !post) {
		return nil
	}
	q := r.URL.Query()
	call.Command = q["command"]
	call.Input = r.FormValue("input") == "1"
	call.Output = r.FormValue("output") == "1"
	call.Error = r.FormValue("error") == "1"
	call.Tty = r.FormValue("tty") == "1"
	return call
}

// sliceToBool is apimachinery's Convert_Slice_string_To_bool.
func sliceToBool(values []string) bool {
	if len(values) == 0 {
		return false
	}
	v := values[0]
	return !(v == "0" || strings.EqualFold(v, "false"))
}

// rawPath is the path of the request target as sent.
func rawPath(r *http.Request) string {
	p, _, _ := strings.Cut(r.RequestURI, "?")
	return p
}

// paramsClean reads raw as a front that honours path parameters does: each segment's
// ";..." dropped, then decoded and cleaned. Empty when what is left does not decode.
func paramsClean(raw string) string {
	segs := strings.Split(raw, "/")
	for i, s := range segs {
		segs[i], _, _ = strings.Cut(s, ";")
	}
	decoded, err := url.PathUnescape(strings.Join(segs, "/"))
	if err != nil {
		return ""
	}
	return path.Clean(decoded)
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
		Method:  r.Method,
		Host:    r.Host,
		PathHex: hex.EncodeToString([]byte(r.URL.Path)),
		Path:    r.URL.Path,
		Fronts: fronts{
			CleanHex:       hex.EncodeToString([]byte(path.Clean(r.URL.Path))),
			RawCleanHex:    hex.EncodeToString([]byte(path.Clean(rawPath(r)))),
			ParamsCleanHex: hex.EncodeToString([]byte(paramsClean(rawPath(r)))),
		},
		Query:     pairs,
		Container: q.Get("container"),
		Command:   q["command"],
		Stdin:     sliceToBool(q["stdin"]),
		Tty:       sliceToBool(q["tty"]),
		Follow:    sliceToBool(q["follow"]),
		Upgrade:   r.Header.Get("Upgrade"),
		Kubelet:   kubelet(r),
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

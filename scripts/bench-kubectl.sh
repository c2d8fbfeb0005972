#!/usr/bin/env bash
# kubectl 1.33 exec and port-forward throughput through kube-ws-proxy (WebSocket: translated
# exec, tunnelled port-forward) versus straight to the simulated SPDY-only cluster (SPDY), and
# versus SPDY through a plain TCP relay process (the floor of any extra hop), interleaved
# A B C A B C …, medians and the ratios. kubectl's own cost is part of what users feel, so this
# complements `cargo bench --bench streaming`, which uses our own clients.
#
# For port-forward it also reads the CPU time kubectl, the process in the middle (proxy or
# relay) and the simulated cluster spent on each transfer (/proc/PID/stat), which shows whose
# work the wall time is.
#
#   scripts/bench-kubectl.sh [BYTES] [ROUNDS]      (default: 1 GiB, 5 rounds)
#
# Port-forward moves BYTES from a pod service to a local client (down) and back (up) through
# `kubectl port-forward`; only the transfer is timed, not kubectl's start.
set -euo pipefail
cd "$(dirname "$0")/.."
bytes=${1:-1073741824}
rounds=${2:-5}
kdir=${KUBECTL_DIR:-$(dirname "$(readlink -f "$(command -v kubectl)")")}
kubectl="$kdir/kubectl.1.33"
[ -x "$kubectl" ] || { echo "kubectl 1.33 not found in $kdir" >&2; exit 1; }

cargo build --release --quiet --bin kube-ws-proxy --example tcp_relay
bin=target/release/kube-ws-proxy
work=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$work"' EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
sim_port=$(free_port); proxy_port=$(free_port); relay_port=$(free_port)
"$bin" sim-cluster --exec-start-delay 0 --listen "127.0.0.1:$sim_port" >"$work/sim.log" 2>&1 &
declare -A pid_of=([sim]=$!)
"$bin" --listen "127.0.0.1:$proxy_port" --admin-listen 127.0.0.1:0 \
  --upstream "http://127.0.0.1:$sim_port" --log-format json >"$work/proxy.log" 2>&1 &
pid_of[proxy]=$!
target/release/examples/tcp_relay "127.0.0.1:$relay_port" "127.0.0.1:$sim_port" >"$work/relay.log" 2>&1 &
pid_of[relay]=$!
for port in "$proxy_port" "$relay_port"; do
  for _ in $(seq 100); do
    (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && break
    sleep 0.1
  done
done

# User + system CPU seconds a process has used so far.
cpu() {
  local stat
  stat=$(cat "/proc/$1/stat")
  stat=${stat##*) }
  # After the command name: field 12 is utime, 13 stime (clock ticks).
  echo "$stat" | awk -v hz="$(getconf CLK_TCK)" '{printf "%.2f", ($12 + $13) / hz}'
}

kubeconfig() {
  cat >"$work/$1.kubeconfig" <<CFG
apiVersion: v1
kind: Config
clusters:
- name: c
  cluster:
    server: http://127.0.0.1:$2
contexts:
- name: c
  context: {cluster: c, user: u, namespace: default}
current-context: c
users:
- name: u
  user: {}
CFG
}
kubeconfig proxy "$proxy_port"
kubeconfig direct "$sim_port"
kubeconfig relay "$relay_port"

# The pod's services for port-forward (the simulated cluster dials 127.0.0.1:<port>), and the
# local client that times one transfer through kubectl's forwarded port.
cat >"$work/pf.py" <<'PY'
import socket, sys, threading, time
CHUNK = 1 << 20
ZEROS = bytes(CHUNK)

def serve(n):
    source, sink = socket.create_server(("127.0.0.1", 0)), socket.create_server(("127.0.0.1", 0))
    def send_n(c):
        left = n
        while left:
            k = c.send(memoryview(ZEROS)[:min(left, CHUNK)])
            left -= k
        c.close()
    def read_n(c):
        buf, got = bytearray(CHUNK), 0
        while got < n:
            k = c.recv_into(buf)
            if not k:
                break
            got += k
        c.sendall(b"OK %d\n" % got)
        c.close()
    def loop(listener, handle):
        while True:
            c, _ = listener.accept()
            threading.Thread(target=handle, args=(c,), daemon=True).start()
    for listener, handle in ((source, send_n), (sink, read_n)):
        threading.Thread(target=loop, args=(listener, handle), daemon=True).start()
    print(source.getsockname()[1], sink.getsockname()[1], flush=True)
    threading.Event().wait()

def transfer(direction, port, n):
    start = time.monotonic()
    c = socket.create_connection(("127.0.0.1", port))
    if direction == "down":
        buf, got = bytearray(CHUNK), 0
        while True:
            k = c.recv_into(buf)
            if not k:
                break
            got += k
        ok = got == n
    else:
        left = n
        while left:
            left -= c.send(memoryview(ZEROS)[:min(left, CHUNK)])
        reply = c.makefile("rb").readline()
        ok = reply == b"OK %d\n" % n
        got = reply.decode().strip()
    elapsed = time.monotonic() - start
    if not ok:
        sys.exit("port-forward %s: wrong byte count %s" % (direction, got))
    print("%.6f" % elapsed)

if sys.argv[1] == "serve":
    serve(int(sys.argv[2]))
else:
    transfer(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))
PY
python3 "$work/pf.py" serve "$bytes" >"$work/pods" &
for _ in $(seq 100); do [ -s "$work/pods" ] && break; sleep 0.1; done
read -r source_port sink_port <"$work/pods"

# One timed run: $1 = proxy|direct|relay, $2 = stdout|stdin|down|up. Prints seconds (and, for
# port-forward, the CPU seconds of kubectl, the middle process and the cluster).
run() {
  case "$2" in
    stdout|stdin) run_exec "$@" ;;
    *) run_port_forward "$@" ;;
  esac
}

run_exec() {
  local cfg="$work/$1.kubeconfig" start end
  local env=(env HOME="$work")
  # To the SPDY-only cluster kubectl would first try WebSocket and fall back; go straight to
  # SPDY so the direct and relay paths are not charged for the failed attempt.
  [ "$1" != proxy ] && env+=(KUBECTL_REMOTE_COMMAND_WEBSOCKETS=false)
  start=$(date +%s.%N)
  if [ "$2" = stdout ]; then
    "${env[@]}" "$kubectl" --kubeconfig "$cfg" exec bench -- head -c "$bytes" /dev/zero | wc -c >"$work/n"
  else
    head -c "$bytes" /dev/zero | "${env[@]}" "$kubectl" --kubeconfig "$cfg" exec -i bench -- sh -c 'wc -c' >"$work/n"
  fi
  end=$(date +%s.%N)
  [ "$(tr -d ' ' <"$work/n")" = "$bytes" ] || { echo "$1 $2: wrong byte count $(cat "$work/n")" >&2; exit 1; }
  echo "$end - $start" | bc -l
}

# kubectl port-forward to the pod service for $2 (down: the source, up: the sink): through the
# proxy kubectl tunnels SPDY inside a WebSocket; direct and through the relay it speaks SPDY (no
# WebSocket attempt).
run_port_forward() {
  local cfg="$work/$1.kubeconfig" remote lport pid middle=none
  local websockets=true
  [ "$1" != proxy ] && websockets=false
  [ "$1" != direct ] && middle=${pid_of[$1]}
  if [ "$2" = down ]; then remote=$source_port; else remote=$sink_port; fi
  : >"$work/pf.out"
  env HOME="$work" KUBECTL_PORT_FORWARD_WEBSOCKETS=$websockets "$kubectl" --kubeconfig "$cfg" \
    port-forward --address 127.0.0.1 pod/bench ":$remote" >"$work/pf.out" 2>"$work/pf.err" &
  pid=$!
  for _ in $(seq 300); do
    lport=$(sed -n 's/^Forwarding from 127.0.0.1:\([0-9]*\) .*/\1/p' "$work/pf.out")
    [ -n "$lport" ] && break
    sleep 0.1
  done
  [ -n "$lport" ] || { echo "$1 port-forward did not start: $(cat "$work/pf.err")" >&2; exit 1; }
  local k0 m0=0 s0 k1 m1=0 s1 t
  k0=$(cpu "$pid"); s0=$(cpu "${pid_of[sim]}"); [ "$middle" != none ] && m0=$(cpu "$middle")
  t=$(python3 "$work/pf.py" "$2" "$lport" "$bytes")
  # The cluster's side of the stream ends a moment after the client sees the last byte.
  sleep 0.2
  k1=$(cpu "$pid"); s1=$(cpu "${pid_of[sim]}"); [ "$middle" != none ] && m1=$(cpu "$middle")
  kill "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
  echo "$t $(echo "$k1 - $k0" | bc -l) $(echo "$m1 - $m0" | bc -l) $(echo "$s1 - $s0" | bc -l)"
}

paths=(proxy direct relay)
declare -A times kcpu mcpu scpu
for r in $(seq "$rounds"); do
  for dir in stdout stdin down up; do
    for path in "${paths[@]}"; do
      out=$(run "$path" "$dir")
      read -r t k m c <<<"$out"
      times[$path.$dir]+="$t "
      kcpu[$path.$dir]+="${k:-0} "; mcpu[$path.$dir]+="${m:-0} "; scpu[$path.$dir]+="${c:-0} "
    done
  done
  echo "round $r done" >&2
done

# The proxy path must have been the WebSocket tunnel, not a relayed SPDY upgrade.
for _ in $(seq 50); do
  tunnels=$(grep -c 'port-forward tunnel finished' "$work/proxy.log" || true)
  [ "$tunnels" -ge $((2 * rounds)) ] && break
  sleep 0.1
done
[ "$tunnels" -ge $((2 * rounds)) ] || { echo "expected $((2 * rounds)) tunnelled port-forwards, the proxy logged $tunnels" >&2; exit 1; }

median() { tr ' ' '\n' | grep -v '^$' | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
mib=$(echo "$bytes / 1048576" | bc -l)
name() {
  case $1 in
    stdout|stdin) echo "exec $1" ;;
    *) echo "port-forward $1" ;;
  esac
}
echo "| kubectl 1.33, $(printf %.0f "$mib") MiB | through the proxy (WebSocket) | direct SPDY | SPDY via TCP relay | proxy / direct | relay / direct (one hop's floor) | proxy / relay | target: proxy / direct |"
echo "|---|---|---|---|---|---|---|---|"
for dir in stdout stdin down up; do
  p=$(echo "${times[proxy.$dir]}" | median); d=$(echo "${times[direct.$dir]}" | median)
  l=$(echo "${times[relay.$dir]}" | median)
  ratio=$(echo "$p / $d" | bc -l)
  met=$(echo "$ratio <= 1.10" | bc -l)
  floor=$(echo "$l / $d" | bc -l)
  if [ "$met" = 1 ]; then
    verdict=met
  elif [ "$(echo "$floor > 1.10" | bc -l)" = 1 ]; then
    verdict="NOT met; a plain relay is already $(printf %.2f "$floor")×"
  else
    verdict="NOT met"
  fi
  printf '| %s, median s | %.2f (%.0f MiB/s) | %.2f (%.0f MiB/s) | %.2f (%.0f MiB/s) | %.2f× | %.2f× | %.2f× | ≤ 1.10× %s |\n' \
    "$(name "$dir")" "$p" "$(echo "$mib / $p" | bc -l)" "$d" "$(echo "$mib / $d" | bc -l)" \
    "$l" "$(echo "$mib / $l" | bc -l)" "$ratio" "$floor" "$(echo "$p / $l" | bc -l)" "$verdict"
done
echo
echo "| port-forward, median CPU s per transfer | kubectl | proxy / relay | simulated cluster | sum |"
echo "|---|---|---|---|---|"
for dir in down up; do
  for path in "${paths[@]}"; do
    k=$(echo "${kcpu[$path.$dir]}" | median); m=$(echo "${mcpu[$path.$dir]}" | median)
    c=$(echo "${scpu[$path.$dir]}" | median)
    printf '| %s, %s | %.2f | %s | %.2f | %.2f |\n' "$(name "$dir")" "$path" "$k" \
      "$([ "$path" = direct ] && echo – || printf %.2f "$m")" "$c" "$(echo "$k + $m + $c" | bc -l)"
  done
done

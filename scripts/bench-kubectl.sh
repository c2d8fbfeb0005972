#!/usr/bin/env bash
# kubectl 1.33 exec throughput through kube-ws-proxy (WebSocket, translated) versus straight
# to the simulated SPDY-only cluster (SPDY), interleaved A B A B …, medians and the ratio.
# kubectl's own cost is part of what users feel, so this complements `cargo bench --bench
# streaming`, which uses our own clients.
#
#   scripts/bench-kubectl.sh [BYTES] [ROUNDS]      (default: 1 GiB, 5 rounds)
set -euo pipefail
cd "$(dirname "$0")/.."
bytes=${1:-1073741824}
rounds=${2:-5}
kdir=${KUBECTL_DIR:-$(dirname "$(readlink -f "$(command -v kubectl)")")}
kubectl="$kdir/kubectl.1.33"
[ -x "$kubectl" ] || { echo "kubectl 1.33 not found in $kdir" >&2; exit 1; }

cargo build --release --quiet
bin=target/release/kube-ws-proxy
work=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$work"' EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
sim_port=$(free_port); proxy_port=$(free_port)
"$bin" sim-cluster --listen "127.0.0.1:$sim_port" >"$work/sim.log" 2>&1 &
"$bin" --listen "127.0.0.1:$proxy_port" --admin-listen 127.0.0.1:0 \
  --upstream "http://127.0.0.1:$sim_port" --log-format json >"$work/proxy.log" 2>&1 &
for _ in $(seq 100); do
  (exec 3<>"/dev/tcp/127.0.0.1/$proxy_port") 2>/dev/null && break
  sleep 0.1
done

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

# One timed run: $1 = proxy|direct, $2 = stdout|stdin. Prints seconds.
run() {
  local cfg="$work/$1.kubeconfig" start end
  local env=(env HOME="$work")
  # Straight to the SPDY-only cluster kubectl would first try WebSocket and fall back; go
  # straight to SPDY so the direct path is not charged for the failed attempt.
  [ "$1" = direct ] && env+=(KUBECTL_REMOTE_COMMAND_WEBSOCKETS=false)
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

declare -A times
for r in $(seq "$rounds"); do
  for dir in stdout stdin; do
    for path in proxy direct; do
      times[$path.$dir]+="$(run "$path" "$dir") "
    done
  done
  echo "round $r done" >&2
done

median() { tr ' ' '\n' | grep -v '^$' | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
mib=$(echo "$bytes / 1048576" | bc -l)
echo "| kubectl 1.33, $(printf %.0f "$mib") MiB | through the proxy (WebSocket) | direct SPDY | proxy / direct | target |"
echo "|---|---|---|---|---|"
for dir in stdout stdin; do
  p=$(echo "${times[proxy.$dir]}" | median); d=$(echo "${times[direct.$dir]}" | median)
  ratio=$(echo "$p / $d" | bc -l)
  met=$(echo "$ratio <= 1.10" | bc -l)
  printf '| exec %s, median s | %.2f (%.0f MiB/s) | %.2f (%.0f MiB/s) | %.2f× | ≤ 1.10× %s |\n' \
    "$dir" "$p" "$(echo "$mib / $p" | bc -l)" "$d" "$(echo "$mib / $d" | bc -l)" "$ratio" \
    "$([ "$met" = 1 ] && echo met || echo 'NOT met')"
done

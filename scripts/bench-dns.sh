#!/usr/bin/env bash
# bench-dns.sh: dnsd and CoreDNS side by side with dnsperf, both reading the
# cluster from a real API server, each server pinned to one core (taskset),
# dnsperf on another, on the same names:
#   cluster  — A records of cluster Services
#   nxdomain — search-path misses (<name>.<ns>.svc.cluster.local, NXDOMAIN)
#   cached   — forwarded names, answered from each server's cache
# e2e/cmd/kubebench starts the e2e control plane (etcd + kube-apiserver in a
# network namespace of its own), creates SERVICES ClusterIP Services in
# namespace bench (one named port, an EndpointSlice of 3 ready endpoints
# each; default/kubernetes is the API server's own) and runs the measuring
# half of this script inside that namespace: dnsd with --kubeconfig, CoreDNS
# with the kubernetes plugin, cache 30 and forward, both forwarding to a
# dnsmasq; all on that namespace's loopback, nothing in the host's. Beside
# them e2e/cmd/echodns, which answers every query with itself and looks
# nothing up: the most any server can show on this box with this client.
#
# Usage: scripts/bench-dns.sh [SERVICES] [SECONDS]   (defaults 1000, 10)
# Each figure is the median of three alternating rounds. Needs root.
# Env: PODNET_BIN (dir with dnsd; default: build it), PODNET_KUBE_APISERVER
# (default /var/cache/podnet/kube-apiserver-v1.36.3, see make apiserver),
# COREDNS (binary; default /var/cache/podnet/coredns-$COREDNS_VERSION, built
# if missing), SERVER_CPU (default 1), CLIENT_CPU (default 0).
set -euo pipefail
cd "$(dirname "$0")/.."

if [[ ${1:-} != --measure ]]; then
	SERVICES=${1:-1000}
	SECONDS_PER_RUN=${2:-10}
	# The version kubeadm v1.36 installs, as the Makefile's COREDNS_VERSION
	# (the baseline of make conformance).
	COREDNS_VERSION=${COREDNS_VERSION:-v1.14.2}
	CACHE_DIR=/var/cache/podnet
	COREDNS=${COREDNS:-$CACHE_DIR/coredns-$COREDNS_VERSION}
	export PODNET_KUBE_APISERVER=${PODNET_KUBE_APISERVER:-$CACHE_DIR/kube-apiserver-v1.36.3}
	[[ $(id -u) == 0 ]] || { echo "bench-dns: needs root (the API server runs in a network namespace)" >&2; exit 1; }
	for tool in dnsperf dnsmasq taskset dig curl ip; do
		command -v "$tool" >/dev/null || { echo "bench-dns: $tool missing (scripts/deps.sh)" >&2; exit 1; }
	done
	work=$(mktemp -d)
	trap 'rm -rf "$work"' EXIT
	if [[ -n "${PODNET_BIN:-}" ]]; then
		DNSD=$PODNET_BIN/dnsd
	else
		DNSD=$work/dnsd
		go build -o "$DNSD" ./cmd/dnsd
	fi
	go build -o "$work/kubebench" ./e2e/cmd/kubebench
	go build -o "$work/echodns" ./e2e/cmd/echodns
	# CoreDNS is built from the Go module proxy into a cache outside the
	# repo, never committed.
	if [[ ! -x "$COREDNS" ]]; then
		echo "building CoreDNS $COREDNS_VERSION into $COREDNS" >&2
		mkdir -p "$CACHE_DIR" "$work/coredns"
		cat >"$work/coredns/go.mod" <<-EOF
			module corednsbench

			go 1.26
		EOF
		cat >"$work/coredns/main.go" <<-'EOF'
			package main

			import (
				_ "github.com/coredns/coredns/core/plugin"
				"github.com/coredns/coredns/coremain"
			)

			func main() { coremain.Run() }
		EOF
		(cd "$work/coredns" && GOFLAGS=-mod=mod go get "github.com/coredns/coredns@$COREDNS_VERSION" &&
			GOFLAGS=-mod=mod CGO_ENABLED=0 go build -o "$COREDNS" .)
	fi
	DNSD=$DNSD COREDNS=$COREDNS ECHODNS=$work/echodns SECONDS_PER_RUN=$SECONDS_PER_RUN \
		"$work/kubebench" --services "$SERVICES" --endpoints 3 --namespace bench -- bash scripts/bench-dns.sh --measure
	exit
fi

# The measuring half: in the control plane's namespace, with KUBECONFIG,
# BENCH_SERVICES and BENCH_NAMESPACE from kubebench.
SERVICES=$BENCH_SERVICES
NS=$BENCH_NAMESPACE
SERVER_CPU=${SERVER_CPU:-1}
CLIENT_CPU=${CLIENT_CPU:-0}
DNSD_PORT=25353 COREDNS_PORT=25354 UP_PORT=25355 ECHO_PORT=25356

work=$(mktemp -d)
pids=()
cleanup() {
	for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
	wait 2>/dev/null || true
	rm -rf "$work"
}
trap cleanup EXIT

# Query files; kubebench names the Services svc-00000, svc-00001, …
m=$((SERVICES < 1000 ? SERVICES : 1000))
awk -v n="$SERVICES" -v m="$m" -v ns="$NS" -v w="$work" 'BEGIN {
	for (i = 0; i < m; i++) {
		s = sprintf("svc-%05d", i * 7919 % n)
		printf "%s.%s.svc.cluster.local A\n", s, ns > (w "/q-cluster")
		printf "%s.%s.%s.svc.cluster.local A\n", s, ns, ns > (w "/q-nxdomain")
	}
	for (i = 0; i < 100; i++) printf "host-%d.example.test A\n", i > (w "/q-cached")
}'

cat >"$work/Corefile" <<EOF
.:$COREDNS_PORT {
    bind 127.0.0.1
    kubernetes cluster.local in-addr.arpa ip6.arpa {
        kubeconfig $KUBECONFIG lab
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
    }
    cache 30
    forward . 127.0.0.1:$UP_PORT
}
EOF

taskset -c "$CLIENT_CPU" dnsmasq --no-daemon --no-resolv --no-hosts --bind-interfaces --listen-address=127.0.0.1 \
	--port=$UP_PORT --address=/example.test/192.0.2.1 --user="$(id -un)" --pid-file= 2>/dev/null &
pids+=($!)
taskset -c "$SERVER_CPU" "$DNSD" --kubeconfig "$KUBECONFIG" --listen 127.0.0.1:$DNSD_PORT --upstream 127.0.0.1:$UP_PORT \
	--metrics-address 127.0.0.1:29153 --health-address "" --ready-address 127.0.0.1:28181 --log-level warn &
dnsd_pid=$!
pids+=($dnsd_pid)
taskset -c "$SERVER_CPU" "$COREDNS" -conf "$work/Corefile" -quiet &
coredns_pid=$!
pids+=($coredns_pid)
# The ceiling: a responder that answers without looking anything up.
taskset -c "$SERVER_CPU" "$ECHODNS" 127.0.0.1:$ECHO_PORT &
echo_pid=$!
pids+=($echo_pid)
declare -A port=([dnsd]=$DNSD_PORT [coredns]=$COREDNS_PORT [echodns]=$ECHO_PORT)
declare -A spid=([dnsd]=$dnsd_pid [coredns]=$coredns_pid [echodns]=$echo_pid)

# Both have listed every Service once the last one created answers.
last=$(printf "svc-%05d.%s.svc.cluster.local" $((SERVICES - 1)) "$NS")
ready=
for _ in $(seq 600); do
	if curl -sf http://127.0.0.1:28181/ready >/dev/null 2>&1 &&
		dig +short +time=1 @127.0.0.1 -p $COREDNS_PORT "$last" | grep -qE '^[0-9.]+$' &&
		dig +short +time=1 @127.0.0.1 -p $DNSD_PORT "$last" | grep -qE '^[0-9.]+$'; then
		ready=1
		break
	fi
	sleep 0.1
done
[[ -n $ready ]] || { echo "bench-dns: dnsd or CoreDNS never answered $last" >&2; exit 1; }
# The two must give the same answers, or the mixes measure different work.
for q in "$last A" "kubernetes.default.svc.cluster.local A" "$(head -1 "$work/q-nxdomain")" "host-1.example.test A"; do
	set -- $q
	a=$(dig +noall +answer +comments @127.0.0.1 -p $DNSD_PORT "$1" "$2" | awk '/status:/ {print $6} $3 == "IN" {print $NF}')
	b=$(dig +noall +answer +comments @127.0.0.1 -p $COREDNS_PORT "$1" "$2" | awk '/status:/ {print $6} $3 == "IN" {print $NF}')
	[[ $a == "$b" ]] || { echo "bench-dns: $q: dnsd says $a, CoreDNS $b" >&2; exit 1; }
done

# run PORT FILE QUERIES_IN_FLIGHT -> "qps avg_latency_ms lost client_ticks",
# the last dnsperf's own CPU time (utime + stime of the child the shell
# around it waited for), to tell whether the client was the limit.
run() {
	taskset -c "$CLIENT_CPU" bash -c 'dnsperf "$@" >"$0" 2>/dev/null; awk "{print \$16 + \$17}" /proc/$$/stat' \
		"$work/dnsperf.out" -s 127.0.0.1 -p "$1" -d "$2" -l "$SECONDS_PER_RUN" -q "$3" -c 1 -t 2 >"$work/dnsperf.cpu"
	awk -v c="$(cat "$work/dnsperf.cpu")" '/Queries per second/ {q=$4} /Average Latency/ {l=$4*1000} /Queries lost/ {lost=$3}
		END {printf "%.0f %.3f %s %s\n", q, l, lost, c}' "$work/dnsperf.out"
}

# run1 PORT FILE -> "median_ms p99_ms" of single queries, one in flight
# (medians, because on a shared box a few descheduled queries swamp means).
run1() {
	taskset -c "$CLIENT_CPU" dnsperf -s 127.0.0.1 -p "$1" -d "$2" -l "$SECONDS_PER_RUN" -q 1 -c 1 -t 2 -v 2>/dev/null |
		awk '/^> / {print $NF*1000}' | sort -n |
		awk '{a[NR]=$1} END {printf "%.3f %.3f\n", a[int((NR+1)/2)], a[int(NR*0.99)]}'
}

# cpu PID -> CPU time used so far, in clock ticks (utime + stime)
cpu() { awk '{print $14 + $15}' "/proc/$1/stat"; }
# core N -> "busy total" clock ticks of that CPU so far (busy: not idle or
# iowait), to tell whether the client's core was the limit.
core() { awk -v c="cpu$1" '$1 == c {t = 0; for (i = 2; i <= NF; i++) t += $i; print t - $5 - $6, t}' /proc/stat; }
HZ=$(getconf CLK_TCK)

rss() { awk '/VmRSS/ {printf "%.1f", $2/1024}' "/proc/$1/status"; }
# dnsd's Go heap in use, from its /metrics.
heap() { curl -s http://127.0.0.1:29153/metrics | awk '/^go_memstats_heap_inuse_bytes/ {printf "%.1f", $2/1048576}'; }

# CoreDNS names its own version ("CoreDNS-1.14.2"); the summary table's
# anchor is read from this header.
coredns_version=$("$COREDNS" -version | awk -F- '/^CoreDNS-/ {print $2; exit}')
echo "## $SERVICES Services from kube-apiserver, ${SECONDS_PER_RUN}s per run, servers on CPU $SERVER_CPU, dnsperf on CPU $CLIENT_CPU, CoreDNS $coredns_version"
echo
echo "| server | RSS before the runs |"
echo "|---|---:|"
echo "| dnsd | $(rss $dnsd_pid) MiB (Go heap in use $(heap) MiB) |"
echo "| coredns | $(rss $coredns_pid) MiB |"
echo
echo "| mix | server | QPS (100 in flight) | server CPU per query | server busy | client core busy | avg latency (100 in flight) | median latency (1 in flight) | client CPU per query |"
echo "|---|---|---:|---:|---:|---:|---:|---:|---:|"
median() { sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
for mix in cluster nxdomain cached; do
	# Warm both caches (the cached mix) and page everything in.
	for p in $DNSD_PORT $COREDNS_PORT; do
		taskset -c "$CLIENT_CPU" dnsperf -s 127.0.0.1 -p $p -d "$work/q-$mix" -n 1 >/dev/null 2>&1 || true
	done
	# The two servers alternate, three rounds each; the median is reported,
	# so a burst of background load does not decide the comparison.
	declare -A qps lat lat1 us busy cbusy cus
	for round in 1 2 3; do
		for server in dnsd coredns echodns; do
			pid=${spid[$server]}
			c0=$(cpu $pid)
			read -r k0 t0 < <(core "$CLIENT_CPU")
			read -r q l _ cc < <(run "${port[$server]}" "$work/q-$mix" 100)
			c1=$(cpu $pid)
			read -r k1 t1 < <(core "$CLIENT_CPU")
			# How much of its core the server used, and of the client's
			# core dnsperf (and anything else there) used: a server below
			# 100 % with the client's core near 100 % is waiting for
			# queries, and its QPS is the client's limit, not its own.
			busy[$server]+="$(awk -v c=$((c1 - c0)) -v hz="$HZ" -v s="$SECONDS_PER_RUN" 'BEGIN {printf "%.0f", 100 * c / hz / s}') "
			cbusy[$server]+="$(awk -v b=$((k1 - k0)) -v t=$((t1 - t0)) 'BEGIN {printf "%.0f", t ? 100 * b / t : 0}') "
			# CPU microseconds per answered query: immune to the client
			# being the bottleneck and to other load on the box.
			us[$server]+="$(awk -v c=$((c1 - c0)) -v hz="$HZ" -v q="$q" -v s="$SECONDS_PER_RUN" 'BEGIN {printf "%.1f", c / hz * 1e6 / (q * s)}') "
			# dnsperf's CPU per query: when it is at or above the server's,
			# one client core cannot keep the server's core busy, and the
			# QPS of a server as cheap as echodns is the client's.
			cus[$server]+="$(awk -v c="$cc" -v hz="$HZ" -v q="$q" -v s="$SECONDS_PER_RUN" 'BEGIN {printf "%.1f", c / hz * 1e6 / (q * s)}') "
			read -r l1 _ < <(run1 "${port[$server]}" "$work/q-$mix")
			qps[$server]+="$q "
			lat[$server]+="$l "
			lat1[$server]+="$l1 "
		done
	done
	for server in dnsd coredns echodns; do
		m() { tr ' ' '\n' <<<"$1" | grep . | median; }
		echo "| $mix | $server | $(m "${qps[$server]}") | $(m "${us[$server]}") µs | $(m "${busy[$server]}") % | $(m "${cbusy[$server]}") % | $(m "${lat[$server]}") ms | $(m "${lat1[$server]}") ms | $(m "${cus[$server]}") µs |"
	done
	unset qps lat lat1 us busy cbusy cus
done
echo
echo "| server | RSS after the runs |"
echo "|---|---:|"
echo "| dnsd | $(rss $dnsd_pid) MiB (Go heap in use $(heap) MiB) |"
echo "| coredns | $(rss $coredns_pid) MiB |"

#!/usr/bin/env bash
# bench-dns.sh: dnsd and CoreDNS side by side with dnsperf, each server pinned
# to one core (taskset), dnsperf on another, on the same names:
#   cluster  — A records of cluster Services
#   nxdomain — search-path misses (<name>.<ns>.svc.cluster.local, NXDOMAIN)
#   cached   — forwarded names, answered from each server's cache
# CoreDNS serves an equivalent zone file (file plugin) with cache 30 and
# forward to a loopback dnsmasq, dnsd the same Services from a state dir.
# Everything runs on 127.0.0.1 high ports; nothing leaves the machine.
#
# Usage: scripts/bench-dns.sh [SERVICES] [SECONDS]   (defaults 1000, 10)
# Each figure is the median of three alternating rounds.
# Env: PODNET_BIN (dir with dnsd; default: build it), COREDNS (binary;
# default /var/cache/podnet/coredns-$COREDNS_VERSION, built if missing),
# SERVER_CPU (default 1), CLIENT_CPU (default 0).
set -euo pipefail
cd "$(dirname "$0")/.."

SERVICES=${1:-1000}
SECONDS_PER_RUN=${2:-10}
COREDNS_VERSION=${COREDNS_VERSION:-v1.15.0}
SERVER_CPU=${SERVER_CPU:-1}
CLIENT_CPU=${CLIENT_CPU:-0}
CACHE_DIR=/var/cache/podnet
COREDNS=${COREDNS:-$CACHE_DIR/coredns-$COREDNS_VERSION}
DNSD_PORT=25353 COREDNS_PORT=25354 UP_PORT=25355

for tool in dnsperf dnsmasq taskset; do
	command -v "$tool" >/dev/null || { echo "bench-dns: $tool missing (scripts/deps.sh)" >&2; exit 1; }
done

work=$(mktemp -d)
pids=()
cleanup() {
	for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
	wait 2>/dev/null || true
	rm -rf "$work"
}
trap cleanup EXIT

if [[ -n "${PODNET_BIN:-}" ]]; then
	DNSD=$PODNET_BIN/dnsd
else
	DNSD=$work/dnsd
	go build -o "$DNSD" ./cmd/dnsd
fi

# CoreDNS is built from the Go module proxy into a cache outside the repo,
# never committed.
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

# The cluster: SERVICES ClusterIP Services in namespace bench, plus the
# usual two; the same records as a zone file for CoreDNS.
mkdir -p "$work/state"
python3 - "$SERVICES" "$work" <<'EOF'
import sys
n, work = int(sys.argv[1]), sys.argv[2]
def ip(i):
    i += 100
    return "10.96.%d.%d" % (i // 250, i % 250 + 1)
with open(work + "/state/services.yaml", "w") as f:
    f.write("apiVersion: v1\nkind: List\nitems:\n")
    f.write("- {apiVersion: v1, kind: Namespace, metadata: {name: bench}}\n")
    f.write("- {apiVersion: v1, kind: Namespace, metadata: {name: default}}\n")
    f.write("- apiVersion: v1\n  kind: Service\n  metadata: {name: kubernetes, namespace: default}\n"
            "  spec: {clusterIP: 10.96.0.1, clusterIPs: [10.96.0.1], ports: [{name: https, port: 443, protocol: TCP}]}\n")
    for i in range(n):
        f.write("- apiVersion: v1\n  kind: Service\n  metadata: {name: svc-%d, namespace: bench}\n"
                "  spec: {clusterIP: %s, clusterIPs: [%s], ports: [{name: http, port: 80, protocol: TCP}]}\n" % (i, ip(i), ip(i)))
with open(work + "/zone.db", "w") as f:
    f.write("$ORIGIN cluster.local.\n")
    f.write("@ 5 IN SOA ns.dns.cluster.local. hostmaster.cluster.local. 1 7200 1800 86400 5\n")
    f.write("@ 5 IN NS ns.dns.cluster.local.\nns.dns 5 IN A 10.96.0.10\n")
    f.write("kubernetes.default.svc 5 IN A 10.96.0.1\n")
    for i in range(n):
        f.write("svc-%d.bench.svc 5 IN A %s\n" % (i, ip(i)))
        f.write("_http._tcp.svc-%d.bench.svc 5 IN SRV 0 100 80 svc-%d.bench.svc.cluster.local.\n" % (i, i))
m = min(n, 1000)
with open(work + "/q-cluster", "w") as f:
    for i in range(m):
        f.write("svc-%d.bench.svc.cluster.local A\n" % (i * 7919 % n))
with open(work + "/q-nxdomain", "w") as f:
    for i in range(m):
        f.write("svc-%d.bench.bench.svc.cluster.local A\n" % (i * 7919 % n))
with open(work + "/q-cached", "w") as f:
    for i in range(100):
        f.write("host-%d.example.test A\n" % i)
EOF

cat >"$work/Corefile" <<EOF
.:$COREDNS_PORT {
    bind 127.0.0.1
    file $work/zone.db cluster.local
    cache 30
    forward . 127.0.0.1:$UP_PORT
}
EOF

taskset -c "$CLIENT_CPU" dnsmasq --no-daemon --no-resolv --no-hosts --bind-interfaces --listen-address=127.0.0.1 \
	--port=$UP_PORT --address=/example.test/192.0.2.1 --user="$(id -un)" --pid-file= 2>/dev/null &
pids+=($!)
taskset -c "$SERVER_CPU" "$DNSD" --state-dir "$work/state" --listen 127.0.0.1:$DNSD_PORT --upstream 127.0.0.1:$UP_PORT \
	--metrics-address 127.0.0.1:29153 --health-address "" --ready-address 127.0.0.1:28181 --log-level warn &
dnsd_pid=$!
pids+=($dnsd_pid)
taskset -c "$SERVER_CPU" "$COREDNS" -conf "$work/Corefile" -quiet &
coredns_pid=$!
pids+=($coredns_pid)

for _ in $(seq 600); do
	if curl -sf http://127.0.0.1:28181/ready >/dev/null 2>&1 &&
		dig +short +time=1 @127.0.0.1 -p $COREDNS_PORT kubernetes.default.svc.cluster.local | grep -q 10.96.0.1; then
		break
	fi
	sleep 0.1
done
dig +short @127.0.0.1 -p $DNSD_PORT svc-1.bench.svc.cluster.local | grep -q . || { echo "dnsd does not answer" >&2; exit 1; }

# run PORT FILE QUERIES_IN_FLIGHT -> "qps avg_latency_ms"
run() {
	taskset -c "$CLIENT_CPU" dnsperf -s 127.0.0.1 -p "$1" -d "$2" -l "$SECONDS_PER_RUN" -q "$3" -c 1 -t 2 2>/dev/null |
		awk '/Queries per second/ {q=$4} /Average Latency/ {l=$4*1000} /Queries lost/ {lost=$3} END {printf "%.0f %.3f %s\n", q, l, lost}'
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
HZ=$(getconf CLK_TCK)

rss() { awk '/VmRSS/ {printf "%.1f", $2/1024}' "/proc/$1/status"; }

echo "## $SERVICES Services, ${SECONDS_PER_RUN}s per run, servers on CPU $SERVER_CPU, dnsperf on CPU $CLIENT_CPU"
echo
echo "| mix | server | QPS (100 in flight) | server CPU per query | avg latency (100 in flight) | median latency (1 in flight) |"
echo "|---|---|---:|---:|---:|---:|"
median() { sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
for mix in cluster nxdomain cached; do
	# Warm both caches (the cached mix) and page everything in.
	for port in $DNSD_PORT $COREDNS_PORT; do
		taskset -c "$CLIENT_CPU" dnsperf -s 127.0.0.1 -p $port -d "$work/q-$mix" -n 1 >/dev/null 2>&1 || true
	done
	# The two servers alternate, three rounds each; the median is reported,
	# so a burst of background load does not decide the comparison.
	declare -A qps lat lat1 us
	for round in 1 2 3; do
		for server in dnsd coredns; do
			port=$DNSD_PORT
			[[ $server == coredns ]] && port=$COREDNS_PORT
			pid=$dnsd_pid
			[[ $server == coredns ]] && pid=$coredns_pid
			c0=$(cpu $pid)
			read -r q l _ < <(run $port "$work/q-$mix" 100)
			c1=$(cpu $pid)
			# CPU microseconds per answered query: immune to the client
			# being the bottleneck and to other load on the box.
			us[$server]+="$(awk -v c=$((c1 - c0)) -v hz="$HZ" -v q="$q" -v s="$SECONDS_PER_RUN" 'BEGIN {printf "%.1f", c / hz * 1e6 / (q * s)}') "
			read -r l1 _ < <(run1 $port "$work/q-$mix")
			qps[$server]+="$q "
			lat[$server]+="$l "
			lat1[$server]+="$l1 "
		done
	done
	for server in dnsd coredns; do
		m() { tr ' ' '\n' <<<"$1" | grep . | median; }
		echo "| $mix | $server | $(m "${qps[$server]}") | $(m "${us[$server]}") µs | $(m "${lat[$server]}") ms | $(m "${lat1[$server]}") ms |"
	done
	unset qps lat lat1 us
done
echo
echo "| server | RSS after the runs |"
echo "|---|---:|"
echo "| dnsd | $(rss $dnsd_pid) MiB |"
echo "| coredns | $(rss $coredns_pid) MiB |"

#!/usr/bin/env bash
# Service proxy benchmark (iptables mode, then ebpf mode in the same run),
# never part of make test.
#
# Full sync of 1,000 / 5,000 / 10,000 ClusterIP Services × 10 endpoints, one
# endpoint changed at each size, rule and chain counts, RSS, and first-packet
# latency (TCP connect through a ClusterIP to a real server) at 10 and at
# 10,000 Services, with iptables-nft and iptables-legacy; then ebpf mode, a
# real proxyd's memory, connect latency at 10 against 10,000 Services in
# lock-step, and throughput and TCP_RR in interleaved rounds. Everything runs in
# network namespaces the benchmark creates and removes; needs root.
#
#   BENCH_BACKENDS="nft legacy"   iptables backends to measure
#   BENCH_MODES="ebpf nftables iptables"  proxy modes of the lab benchmarks
#   BENCH_SIZES="1000 5000 10000" Service counts for the sync figures
#   BENCH_ROUNDS=1                sync figures are the median of this many
#                                 rounds, each in a fresh namespace
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "$(id -u)" -ne 0 ]; then
	echo "bench-services: needs root (network namespaces, iptables)" >&2
	exit 1
fi
echo "# $(date -u +%FT%TZ) $(uname -r), $(nproc) cores, load: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "# $(iptables-nft --version) / $(iptables-legacy --version)"
out=$(mktemp)
trap 'rm -f "$out"' EXIT
rc=0
PODNET_BENCH=1 \
PODNET_BENCH_BACKENDS="${BENCH_BACKENDS:-nft legacy}" \
PODNET_BENCH_SIZES="${BENCH_SIZES:-1000 5000 10000}" \
PODNET_BENCH_ROUNDS="${BENCH_ROUNDS:-1}" \
	go test -count=1 -timeout 60m -run '^$' -bench '^BenchmarkServicesAtScale$' -benchtime 1x -v ./dataplane/proxy/iptables/ >"$out" 2>&1 || rc=$?
if [ "$rc" -ne 0 ]; then
	cat "$out" >&2
	exit "$rc"
fi
grep -E '^(\||$)' "$out"

# Dual-stack against single-stack (issue 22): first sync and one endpoint
# change of 10,000 Services × 10 endpoints per family in iptables mode
# (iptables-nft with ip6tables-nft beside it) and nftables mode, alternating
# rounds, medians (ebpf mode's runs below with its other figures).
for pkg in iptables nftables; do
	echo
	PODNET_BENCH=1 \
	PODNET_BENCH_ROUNDS="${BENCH_ROUNDS:-1}" \
		go test -count=1 -timeout 30m -run '^$' -bench '^BenchmarkDualStackSync$' -benchtime 1x -v ./dataplane/proxy/$pkg/ >"$out" 2>&1 || rc=$?
	if [ "$rc" -ne 0 ]; then
		cat "$out" >&2
		exit "$rc"
	fi
	grep -E '^(\||$|[0-9]+ interleaved rounds)' "$out"
done

# What bounds proxyd's memory in each mode: the Go heap of the mode's
# Backend through full syncs of 10,000 Services x 10, single- and
# dual-stack (BENCHMARKS.md, Memory).
for pkg in nftables iptables ebpf; do
	echo
	PODNET_BENCH=1 \
		go test -count=1 -timeout 30m -run '^$' -bench '^BenchmarkSyncHeap$' -benchtime 1x ./dataplane/proxy/$pkg/ >"$out" 2>&1 || rc=$?
	if [ "$rc" -ne 0 ]; then
		cat "$out" >&2
		exit "$rc"
	fi
	grep -E '^(\||$)' "$out"
done

# ebpf mode: the same Services into the BPF maps (full load, one endpoint
# changed, a full resync that finds nothing to change, map memory), and
# connect latency through socket LB against the pod address.
echo
PODNET_BENCH=1 \
PODNET_BENCH_SIZES="${BENCH_SIZES:-1000 5000 10000}" \
PODNET_BENCH_ROUNDS="${BENCH_ROUNDS:-1}" \
	go test -count=1 -timeout 30m -run '^$' -bench '^Benchmark(ServicesAtScale|DualStackSync)$' -benchtime 1x -v ./dataplane/proxy/ebpf/ >"$out" 2>&1 || rc=$?
if [ "$rc" -ne 0 ]; then
	cat "$out" >&2
	exit "$rc"
fi
grep -E '^(\||$|[0-9]+ interleaved rounds)' "$out"

# kube-proxy v1.36.3 in nftables mode beside proxyd in each of its modes,
# all reading 10,000 Services × 10 endpoints from one kube-apiserver: first
# full sync and one endpoint added, timed from the kernel (nftables
# generation, iptables-legacy's nat entries). Needs PODNET_KUBE_PROXY and
# PODNET_NFT_ROOT (make bench sets them: make nft).
echo
PODNET_BENCH=1 PODNET_BIN="${PODNET_BIN:-$PWD/bin}" \
	go test -count=1 -timeout 60m -run '^$' -bench '^BenchmarkProxySyncAgainstKubeProxy$' -benchtime 1x -v ./e2e/ >"$out" 2>&1 || rc=$?
if [ "$rc" -ne 0 ]; then
	cat "$out" >&2
	exit "$rc"
fi
grep -E '^(\||$)' "$out"

# A real proxyd's memory at 10,000 Services × 10 endpoints, single- and
# dual-stack, in each mode, on a lab node (needs the binaries: make build).
echo
PODNET_BENCH=1 PODNET_BIN="${PODNET_BIN:-$PWD/bin}" PODNET_BENCH_MODES="${BENCH_MODES:-ebpf nftables iptables}" \
	go test -count=1 -timeout 30m -run '^$' -bench '^BenchmarkProxydRSS$' -benchtime 1x -v ./e2e/ >"$out" 2>&1 || rc=$?
if [ "$rc" -ne 0 ]; then
	cat "$out" >&2
	exit "$rc"
fi
grep -E '^(\||$)' "$out"

# The Go heap of parsing that benchmark's state directory file (the
# other part of proxyd's memory besides the Backends above).
echo
PODNET_BENCH=1 \
	go test -count=1 -timeout 30m -run '^$' -bench '^BenchmarkStateFileHeap$' -benchtime 1x ./e2e/ >"$out" 2>&1 || rc=$?
if [ "$rc" -ne 0 ]; then
	cat "$out" >&2
	exit "$rc"
fi
grep -E '^(\||$)' "$out"

# ClusterIP connect latency at 10 against 10,000 Services, both modes: two
# lab nodes, one proxyd and state directory each, their clients driven
# connect by connect in lock-step (medians of the rounds' ratios, and the
# same rounds at 10 against 10 first: the noise floor).
echo
PODNET_BENCH=1 PODNET_BIN="${PODNET_BIN:-$PWD/bin}" PODNET_BENCH_MODES="${BENCH_MODES:-ebpf nftables iptables}" \
	go test -count=1 -timeout 30m -run '^$' -bench '^BenchmarkClusterIPConnectLockstep$' -benchtime 1x -v ./e2e/ >"$out" 2>&1 || rc=$?
if [ "$rc" -ne 0 ]; then
	cat "$out" >&2
	exit "$rc"
fi
grep -E '^(\||$|load average)' "$out"

# TCP throughput (iperf3) and TCP_RR through a ClusterIP against the pod
# directly, and through a NodePort from outside in ebpf against iptables
# mode: two nodes in different modes, short interleaved rounds, medians of
# the rounds' ratios (6 rounds of 2 s per path in each of two phases).
echo
PODNET_BENCH=1 PODNET_BIN="${PODNET_BIN:-$PWD/bin}" \
	go test -count=1 -timeout 30m -run '^$' -bench '^BenchmarkServiceThroughput$' -benchtime 1x -v ./e2e/ >"$out" 2>&1 || rc=$?
if [ "$rc" -ne 0 ]; then
	cat "$out" >&2
	exit "$rc"
fi
grep -E '^(\||$)' "$out"

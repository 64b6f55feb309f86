#!/usr/bin/env bash
# Pod network throughput: iperf3 pod → pod across two lab nodes with host-gw
# and with VXLAN, and between two bare namespaces joined by a veth pair, in
# one run; each backend is reported as a ratio of the bare veth figure.
# Targets: host-gw >= 0.9, VXLAN >= 0.7. Then the same per address family
# (BenchmarkPodThroughputFamilies): IPv4 and IPv6 pods with host-gw, VXLAN
# over an IPv4 and over an IPv6 underlay, and the bare veth of each family;
# target IPv6 >= 0.95 x IPv4 on each path. Needs root and the binaries of
# `make build` (PODNET_BIN, default ./bin). PODNET_BENCH_SECONDS sets the
# length of each iperf3 run (default 5).
set -euo pipefail
cd "$(dirname "$0")/.."
export PODNET_BIN="${PODNET_BIN:-$PWD/bin}"
for b in podnet proxyd podnet-lab; do
	[ -x "$PODNET_BIN/$b" ] || { echo "bench-routing: $PODNET_BIN/$b missing; run make build" >&2; exit 1; }
done
exec go test -count=1 -run '^$' -bench '^BenchmarkPodThroughput(Families)?$' -benchtime 1x -timeout 30m ./e2e/
